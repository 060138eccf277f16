package peerserver

import (
	"strconv"
	"testing"

	"nvpair-workload-manager/internal/wireframe"
)

func BenchmarkDedupDeliverOnce(b *testing.B) {
	write := func() error { return nil }
	b.Run("hit", func(b *testing.B) {
		d := newDedup(DedupCapacity)
		key := benchDedupKey(0)
		d.deliverOnce(key, write)
		b.ReportAllocs()
		for b.Loop() {
			if dup, _ := d.deliverOnce(key, write); !dup {
				b.Fatal("a recorded key was not a duplicate")
			}
		}
	})
	b.Run("miss", func(b *testing.B) {
		// More keys than the capacity, cycled: every lookup misses and,
		// once the LRU is full, every record evicts the oldest key.
		keys := make([]dedupDigest, 4*DedupCapacity)
		for i := range keys {
			keys[i] = benchDedupKey(i)
		}
		d := newDedup(DedupCapacity)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if dup, _ := d.deliverOnce(keys[i%len(keys)], write); dup {
				b.Fatal("a key older than the capacity was a duplicate")
			}
			i++
		}
	})
}

func benchDedupKey(i int) dedupDigest {
	ev := wireframe.Lifecycle{Info: wireframe.WorkloadInfo{OriginatedFrom: "6f1c2a4e-8b7d-4c3e-9a5f-0d1e2f3a4b5c", Engine: "llamacpp", RunID: "run-" + strconv.Itoa(i),
		ID: "job-" + strconv.Itoa(i), State: "running", Seq: 1, HasSeq: true}}
	return lifecycleDedupKey(&ev)
}
