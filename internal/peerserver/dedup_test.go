package peerserver

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

func TestDedupDetectsADuplicate(t *testing.T) {
	d := newDedup(10)
	writes := 0
	write := func() error { writes++; return nil }

	dup, err := d.deliverOnce(testDigest("k"), write)
	if dup || err != nil || writes != 1 {
		t.Fatalf("first delivery: duplicate=%v err=%v writes=%d; want a write", dup, err, writes)
	}
	for i := range 3 {
		dup, err = d.deliverOnce(testDigest("k"), write)
		if !dup || err != nil || writes != 1 {
			t.Fatalf("delivery %d: duplicate=%v err=%v writes=%d; want a duplicate without a write", i+2, dup, err, writes)
		}
	}
	if dup, _ := d.deliverOnce(testDigest("other"), write); dup || writes != 2 {
		t.Fatalf("another key: duplicate=%v writes=%d; want a write", dup, writes)
	}
}

func TestDedupRecordsAKeyOnlyAfterASuccessfulWrite(t *testing.T) {
	d := newDedup(10)
	errBroker := errors.New("broker gone")
	writes := 0

	dup, err := d.deliverOnce(testDigest("k"), func() error { writes++; return errBroker })
	if dup || !errors.Is(err, errBroker) {
		t.Fatalf("failed write: duplicate=%v err=%v; want the write's error", dup, err)
	}
	if d.len() != 0 {
		t.Fatalf("a failed write recorded the key (%d keys)", d.len())
	}
	dup, err = d.deliverOnce(testDigest("k"), func() error { writes++; return nil })
	if dup || err != nil || writes != 2 {
		t.Fatalf("retry after a failed write: duplicate=%v err=%v writes=%d; want a second write", dup, err, writes)
	}
	if dup, _ = d.deliverOnce(testDigest("k"), func() error { writes++; return nil }); !dup || writes != 2 {
		t.Fatalf("after the successful retry: duplicate=%v writes=%d; want a duplicate", dup, writes)
	}
}

func TestDedupConcurrentDeliveriesOfOneKeyWriteOnce(t *testing.T) {
	const n = 32
	d := newDedup(100)
	var writes atomic.Int32
	write := func() error {
		writes.Add(1)
		// Hold the write until every delivery has reached the key: the others
		// are then waiting on it, not arriving after it finished.
		if !waitUntil(func() bool { return inflightRefs(d, "k") == n }) {
			t.Errorf("only %d of %d deliveries reached the key", inflightRefs(d, "k"), n)
		}
		return nil
	}
	dups := deliverConcurrently(t, d, "k", n, write)
	if w := writes.Load(); w != 1 {
		t.Fatalf("%d concurrent deliveries of one key wrote %d times, want 1", n, w)
	}
	if dups != n-1 {
		t.Fatalf("%d deliveries reported duplicate, want %d", dups, n-1)
	}
	assertNoInflight(t, d)
}

func TestDedupConcurrentDeliveriesRetryAfterAFailedWrite(t *testing.T) {
	// The first write fails while every other delivery of the key waits on
	// it: exactly one of them writes again, and the rest are duplicates of
	// that second, successful write.
	const n = 16
	d := newDedup(100)
	var writes atomic.Int32
	write := func() error {
		if writes.Add(1) == 1 {
			if !waitUntil(func() bool { return inflightRefs(d, "k") == n }) {
				t.Errorf("only %d of %d deliveries reached the key", inflightRefs(d, "k"), n)
			}
			return errors.New("broker write failed")
		}
		return nil
	}
	dups := deliverConcurrently(t, d, "k", n, write)
	if w := writes.Load(); w != 2 {
		t.Fatalf("writes = %d, want 2 (the failed one and one retry)", w)
	}
	if dups != n-2 {
		t.Fatalf("duplicates = %d, want %d", dups, n-2)
	}
	assertNoInflight(t, d)
}

func TestDedupDifferentKeysDoNotSerializeEachOther(t *testing.T) {
	d := newDedup(100)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock() // never leave the slow write blocked, even on failure
	entered := make(chan struct{})
	slowDone := make(chan error, 1)
	go func() {
		_, err := d.deliverOnce(testDigest("slow"), func() error {
			close(entered)
			<-release
			return nil
		})
		slowDone <- err
	}()
	<-entered

	// While "slow" is inside its write, other keys are delivered at once.
	for _, k := range []string{"fast-1", "fast-2"} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			if dup, err := d.deliverOnce(testDigest(k), func() error { return nil }); dup || err != nil {
				t.Errorf("%s: duplicate=%v err=%v", k, dup, err)
			}
		}()
		testkit.Eventually(t, k+" delivered while another key's write is blocked", func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		})
	}
	if dup, _ := d.deliverOnce(testDigest("fast-1"), func() error { return nil }); !dup {
		t.Fatal("fast-1 not recorded")
	}

	unblock()
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
	assertNoInflight(t, d)
}

func TestDedupEvictsTheLeastRecentlySeenKey(t *testing.T) {
	d := newDedup(3)
	deliver := func(k string) bool {
		dup, err := d.deliverOnce(testDigest(k), func() error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		return dup
	}
	for _, k := range []string{"a", "b", "c"} {
		deliver(k)
	}
	if !deliver("a") { // a duplicate that refreshes "a": "b" is now the oldest
		t.Fatal("a not remembered")
	}
	deliver("d") // evicts "b"
	if d.len() != 3 {
		t.Fatalf("dedup holds %d keys, want its capacity 3", d.len())
	}
	if got := recordedKeys(d, "a", "b", "c", "d"); !sameKeys(got, "a", "c", "d") {
		t.Fatalf("after a,b,c,a,d with capacity 3 the keys are %v, want a, c, d (b least recently seen)", got)
	}
	if deliver("b") {
		t.Fatal("evicted key b still reported as a duplicate")
	}
	// "b" came back and pushed out the least recently seen of a, c, d: "c"
	// (a was refreshed after c was recorded).
	if got := recordedKeys(d, "a", "b", "c", "d"); !sameKeys(got, "a", "d", "b") {
		t.Fatalf("keys = %v, want a, d, b", got)
	}
}

func TestDedupStaysWithinCapacityUnderManyKeys(t *testing.T) {
	d := newDedup(50)
	for i := range 1000 {
		if _, err := d.deliverOnce(testDigest(strconv.Itoa(i)), func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if d.len() != 50 || len(d.index) != 50 {
		t.Fatalf("dedup holds %d keys (%d indexed), want 50", d.len(), len(d.index))
	}
	for i := 950; i < 1000; i++ {
		if dup, _ := d.deliverOnce(testDigest(strconv.Itoa(i)), func() error { t.Fatalf("recent key %d written again", i); return nil }); !dup {
			t.Fatalf("recent key %d not a duplicate", i)
		}
	}
	assertNoInflight(t, d)
}

func TestDedupInflightMapEmptyAfterConcurrentDeliveries(t *testing.T) {
	d := newDedup(1000)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				k := strconv.Itoa(i % 20)
				_, _ = d.deliverOnce(testDigest(k), func() error {
					if (g+i)%3 == 0 {
						return errors.New("failed")
					}
					return nil
				})
			}
		}()
	}
	wg.Wait()
	assertNoInflight(t, d)
	if d.len() != 20 {
		t.Fatalf("dedup holds %d keys, want 20", d.len())
	}
}

// deliverConcurrently delivers key n times from n goroutines started at
// once and returns how many deliveries reported a duplicate.
func deliverConcurrently(t *testing.T, d *dedup, key string, n int, write func() error) int {
	t.Helper()
	var wg sync.WaitGroup
	var dups atomic.Int32
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			dup, _ := d.deliverOnce(testDigest(key), write)
			if dup {
				dups.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	return int(dups.Load())
}

// waitUntil is eventually for goroutines other than the test's own, which
// must not call t.Fatal: it reports whether cond held before testkit.WaitTimeout.
func waitUntil(cond func() bool) bool {
	deadline := time.Now().Add(testkit.WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// inflightRefs returns how many deliveries hold or wait for key.
func inflightRefs(d *dedup, key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := testDigest(key)
	if kl := d.inflight[string(k[:])]; kl != nil { // deliverOnce's lock
		return kl.refs
	}
	return 0
}

func assertNoInflight(t *testing.T, d *dedup) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.inflight) != 0 {
		t.Fatalf("inflight map holds %d keys after every delivery returned", len(d.inflight))
	}
}

// testDigest is the digest a test delivers for the key named name.
func testDigest(name string) dedupDigest { return digestKey("test", name) }

// recordedKeys returns the remembered keys, most recently seen first, by
// their names among names ("?" for a digest of none of them).
func recordedKeys(d *dedup, names ...string) []string {
	byDigest := map[dedupDigest]string{}
	for _, n := range names {
		byDigest[testDigest(n)] = n
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for i := d.front; i >= 0; i = d.entries[i].next {
		name, ok := byDigest[d.entries[i].key]
		if !ok {
			name = "?"
		}
		out = append(out, name)
	}
	return out
}

func sameKeys(got []string, want ...string) bool {
	if len(got) != len(want) {
		return false
	}
	set := map[string]bool{}
	for _, k := range got {
		set[k] = true
	}
	for _, k := range want {
		if !set[k] {
			return false
		}
	}
	return true
}

// maxLengthLifecycle is a completed run whose every key field is at its
// bound, distinct for each i.
func maxLengthLifecycle(i int) wireframe.Lifecycle {
	v := func(tag string) string {
		s := tag + "-" + strconv.Itoa(i) + "-"
		return s + strings.Repeat("x", wireframe.MaxKeyFieldBytes-len(s))
	}
	return wireframe.Lifecycle{Method: wireframe.MethodCompleted, Info: wireframe.WorkloadInfo{
		ID: v("id"), RunID: v("run"), Engine: v("engine"), Model: v("model"), ScheduledOn: v("sched"),
		OriginatedFrom: v("origin"), State: "completed", Seq: int64(i + 1), HasSeq: true}}
}

// The dedup holds a fixed-size digest per key, so filled past its capacity
// with frames whose every key field is at its bound it holds no more than
// its documented bound in bytes. Were the fields kept, the same fill would
// hold some 18 MB.
func TestDedupMemoryIsBoundedInBytesWithMaximumLengthFields(t *testing.T) {
	const frames = DedupCapacity + DedupCapacity/2
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d := newDedup(DedupCapacity)
	for i := range frames {
		ev := maxLengthLifecycle(i)
		if dup, err := d.deliverOnce(lifecycleDedupKey(&ev), func() error { return nil }); dup || err != nil {
			t.Fatalf("frame %d: duplicate=%v err=%v, want a write", i, dup, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	runtime.KeepAlive(d)
	if d.len() != DedupCapacity {
		t.Fatalf("the dedup holds %d keys, want its capacity %d", d.len(), DedupCapacity)
	}
	if d.bytes() != DedupMaxBytes {
		t.Fatalf("the dedup's byte estimate is %d when full, want %d", d.bytes(), DedupMaxBytes)
	}
	t.Logf("%d keys hold %d heap bytes (%.0f a key); the bound is %d", d.len(), held, float64(held)/float64(d.len()), DedupMaxBytes)
	if held > DedupMaxBytes {
		t.Fatalf("%d keys of maximum-length fields hold %d heap bytes, over the dedup's bound of %d", d.len(), held, DedupMaxBytes)
	}
}

// deliverOnce calls write unless key was already delivered, serializing
// the deliveries of one key. It reports whether the key was a duplicate,
// and write's error, in which case the key stays unrecorded.
func (d *dedup) deliverOnce(key dedupDigest, write func() error) (duplicate bool, err error) {
	return d.deliverUnder(string(key[:]), key, false, write)
}

// TestDedupSlotsForgottenAndEvictedAreReusedWithoutMixingKeys: the keys
// live in slots of one slice, reused once forgotten or evicted, so a slot
// reused while a link or an index entry still named its old key would
// remember a key twice, lose one or evict out of order. Random records,
// lookups and forgets are checked against a plain list after every step.
func TestDedupSlotsForgottenAndEvictedAreReusedWithoutMixingKeys(t *testing.T) {
	const capacity, names = 8, 20
	d := newDedup(capacity)
	var model []string // most recently seen first
	find := func(name string) int {
		for i, n := range model {
			if n == name {
				return i
			}
		}
		return -1
	}
	toFront := func(i int) {
		name := model[i]
		model = append(model[:i], model[i+1:]...)
		model = append([]string{name}, model...)
	}
	all := make([]string, names)
	for i := range all {
		all[i] = strconv.Itoa(i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 5000 {
		name := all[rng.IntN(names)]
		key := testDigest(name)
		d.mu.Lock()
		switch rng.IntN(3) {
		case 0:
			d.recordLocked(key, rng.IntN(2) == 0)
			if i := find(name); i >= 0 {
				toFront(i)
			} else {
				model = append([]string{name}, model...)
				if len(model) > capacity {
					model = model[:capacity]
				}
			}
		case 1:
			if i, ok := d.index[key]; ok {
				d.moveToFrontLocked(i)
			}
			if i := find(name); i >= 0 {
				toFront(i)
			}
		case 2:
			d.forgetLocked(key)
			if i := find(name); i >= 0 {
				model = append(model[:i], model[i+1:]...)
			}
		}
		n, indexed := d.n, len(d.index)
		d.mu.Unlock()
		got := recordedKeys(d, all...)
		if !slices.Equal(got, model) || n != len(model) || indexed != len(model) {
			t.Fatalf("step %d: the dedup holds %v (%d counted, %d indexed), want %v", step, got, n, indexed, model)
		}
	}
	if cap(d.entries) > capacity {
		t.Fatalf("the entries grew to %d slots, past the capacity %d", cap(d.entries), capacity)
	}
}

// TestDedupRecordsAKeyWithoutAnAllocationOnceItHoldsItsCapacity: the keys
// live in one slice of entries whose slots are reused, so a full dedup
// records each new key (and evicts the oldest) without allocating, where
// a list element and a boxed digest cost two allocations a frame, and a
// seq from 100 up a third for its text.
func TestDedupRecordsAKeyWithoutAnAllocationOnceItHoldsItsCapacity(t *testing.T) {
	const capacity = 64
	d := newDedup(capacity)
	frames := make([]wireframe.Lifecycle, 4*capacity)
	for i := range frames {
		id := "job-" + strconv.Itoa(i)
		frames[i] = wireframe.Lifecycle{Method: wireframe.MethodStarted, Info: wireframe.WorkloadInfo{
			ID: id, RunID: id, Engine: "llamacpp", Model: "qwen3.5-9b", OriginatedFrom: "node-a",
			State: "running", Seq: int64(1000 + i), HasSeq: true}}
	}
	deliver := func(i int) {
		if dup, err := d.deliverLifecycle(&frames[i%len(frames)], func() error { return nil }); dup || err != nil {
			t.Fatalf("frame %d: duplicate=%v err=%v, want a write", i, dup, err)
		}
	}
	for i := range capacity {
		deliver(i)
	}
	next := capacity
	if n := testing.AllocsPerRun(2*capacity, func() { deliver(next); next++ }); n != 0 {
		t.Fatalf("a full dedup allocates %.1f times per key recorded, want 0", n)
	}
	if d.len() != capacity {
		t.Fatalf("the dedup holds %d keys, want its capacity %d", d.len(), capacity)
	}
}
