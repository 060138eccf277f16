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

// BenchmarkDedupDeliverLifecycle is a peer's lifecycle frame through the
// dedup as the server delivers it: its key, its workload's lock, the
// check, the record and the forgetting of its removal keys, each frame a
// miss (a new seq once the pool comes round). "mixed" delivers a removal of
// another workload every fourth frame, so removal keys are always held.
func BenchmarkDedupDeliverLifecycle(b *testing.B) {
	write := func() error { return nil }
	for _, removalEvery := range []int{0, 4} {
		name := "lifecycle-only"
		if removalEvery > 0 {
			name = "mixed"
		}
		b.Run(name, func(b *testing.B) {
			d := newDedup(DedupCapacity)
			evs := make([]wireframe.Lifecycle, 4*DedupCapacity)
			gone := make([]wireframe.Removal, len(evs))
			for i := range evs {
				evs[i] = benchLifecycle(i)
				gone[i] = wireframe.Removal{Ref: wireframe.WorkloadRef{Origin: evs[i].Info.OriginatedFrom, ID: "gone-" + strconv.Itoa(i)}}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				j := i % len(evs)
				if removalEvery > 0 && i%removalEvery == 0 {
					d.deliverRemoval(&gone[j], write)
				} else {
					evs[j].Info.Seq = int64(i/len(evs) + 1)
					if dup, _ := d.deliverLifecycle(&evs[j], write); dup {
						b.Fatal("a new frame was a duplicate")
					}
				}
				i++
			}
		})
	}
}

func benchLifecycle(i int) wireframe.Lifecycle {
	return wireframe.Lifecycle{Info: wireframe.WorkloadInfo{OriginatedFrom: "6f1c2a4e-8b7d-4c3e-9a5f-0d1e2f3a4b5c", Engine: "llamacpp", RunID: "run-" + strconv.Itoa(i),
		ID: "job-" + strconv.Itoa(i), State: "running", Seq: 1, HasSeq: true}}
}
