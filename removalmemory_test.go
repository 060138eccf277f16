package main

import (
	"testing"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

func TestRemovalMemoryRememberHoldsForget(t *testing.T) {
	r := newRemovalMemory(time.Minute, 10)
	a, b := wireframe.WorkloadRef{Origin: "node-a", ID: "job-1"}, wireframe.WorkloadRef{Origin: "node-a", ID: "job-2"}
	if r.holds(a, resyncT0) {
		t.Fatal("holds a ref never removed")
	}
	r.remember(a, resyncT0)
	if !r.holds(a, resyncT0) || r.holds(b, resyncT0) {
		t.Fatal("remember(a) does not hold exactly a")
	}
	if r.holds(wireframe.WorkloadRef{Origin: "node-b", ID: "job-1"}, resyncT0) {
		t.Fatal("a removal of node-a's job-1 holds node-b's job-1")
	}
	r.forget(a)
	if r.holds(a, resyncT0) || r.len() != 0 {
		t.Fatalf("after forget: holds=%v len=%d", r.holds(a, resyncT0), r.len())
	}
	r.forget(b) // forgetting an unknown ref is a no-op
	if r.len() != 0 || len(r.index) != 0 {
		t.Fatal("forget of an unknown ref changed the memory")
	}
}

func TestRemovalMemoryExpiresAtTTL(t *testing.T) {
	const ttl = time.Minute
	r := newRemovalMemory(ttl, 10)
	a := wireframe.WorkloadRef{Origin: "node-a", ID: "job-1"}
	r.remember(a, resyncT0)
	if !r.holds(a, resyncT0.Add(ttl-time.Nanosecond)) {
		t.Fatal("forgotten before its ttl")
	}
	if r.holds(a, resyncT0.Add(ttl)) {
		t.Fatal("still held at its ttl")
	}
	if r.len() != 0 || len(r.index) != 0 {
		t.Fatalf("expired entry not pruned: len=%d index=%d", r.len(), len(r.index))
	}
}

func TestRemovalMemoryAtCapacityIsFullAndForgetsNothing(t *testing.T) {
	r := newRemovalMemory(time.Hour, 3)
	refs := []wireframe.WorkloadRef{{Origin: "o", ID: "1"}, {Origin: "o", ID: "2"}, {Origin: "o", ID: "3"}}
	for i, ref := range refs {
		if full, _ := r.full(ref, resyncT0); full {
			t.Fatalf("full before %d removals of capacity 3", i)
		}
		r.remember(ref, resyncT0.Add(time.Duration(i)*time.Second))
	}
	now := resyncT0.Add(10 * time.Second)
	full, after := r.full(wireframe.WorkloadRef{Origin: "o", ID: "4"}, now)
	if !full || after != 59*time.Minute+50*time.Second {
		t.Fatalf("a fourth removal at capacity 3: full=%v after=%v, want full until the oldest expires (59m50s)", full, after)
	}
	if full, _ := r.full(refs[0], now); full {
		t.Fatal("a repeated removal, which takes no new slot, found the memory full")
	}
	for _, ref := range refs {
		if !r.holds(ref, now) {
			t.Fatalf("%v forgotten at capacity", ref)
		}
	}
	if full, _ := r.full(wireframe.WorkloadRef{Origin: "o", ID: "4"}, resyncT0.Add(time.Hour)); full {
		t.Fatal("still full once the oldest expired")
	}
}

func TestRemovalMemoryRestoreKeepsTheWindowAndTheOrder(t *testing.T) {
	r := newRemovalMemory(time.Minute, 10)
	now := resyncT0.Add(time.Hour)
	a, b, old := wireframe.WorkloadRef{Origin: "o", ID: "a"}, wireframe.WorkloadRef{Origin: "o", ID: "b"}, wireframe.WorkloadRef{Origin: "o", ID: "old"}
	r.restore(old, now.Add(-time.Minute), now)
	r.restore(a, now.Add(-50*time.Second), now)
	r.restore(b, now.Add(-10*time.Second), now)
	if r.holds(old, now) || !r.holds(a, now) || !r.holds(b, now) {
		t.Fatal("restore kept an expired removal or lost one within its window")
	}
	if r.holds(a, now.Add(10*time.Second)) || !r.holds(b, now.Add(10*time.Second)) {
		t.Fatal("a restored removal's window is not counted from when it was made")
	}
}

func TestRemovalMemoryRepeatedRemovalAtCapacityRefreshesInsteadOfEvicting(t *testing.T) {
	r := newRemovalMemory(time.Hour, 3)
	a, b, c, d := wireframe.WorkloadRef{Origin: "o", ID: "a"}, wireframe.WorkloadRef{Origin: "o", ID: "b"}, wireframe.WorkloadRef{Origin: "o", ID: "c"}, wireframe.WorkloadRef{Origin: "o", ID: "d"}
	r.remember(a, resyncT0)
	r.remember(b, resyncT0.Add(time.Second))
	r.remember(c, resyncT0.Add(2*time.Second))

	r.remember(a, resyncT0.Add(3*time.Second)) // at capacity: a moves to newest, nobody is evicted
	now := resyncT0.Add(4 * time.Second)
	for _, ref := range []wireframe.WorkloadRef{a, b, c} {
		if !r.holds(ref, now) {
			t.Fatalf("a repeated removal at capacity evicted %v", ref)
		}
	}
	if r.len() != 3 {
		t.Fatalf("len = %d, want 3", r.len())
	}

	if full, after := r.full(d, now); !full || after != time.Hour-3*time.Second { // b is now the oldest, not a
		t.Fatalf("adding d after refreshing a: full=%v after=%v, want full until b expires", full, after)
	}
}

func TestRemovalMemoryRepeatedRemovalLivesAFullTTLFromTheLatest(t *testing.T) {
	const ttl = time.Minute
	r := newRemovalMemory(ttl, 10)
	a, other := wireframe.WorkloadRef{Origin: "o", ID: "a"}, wireframe.WorkloadRef{Origin: "o", ID: "other"}
	r.remember(a, resyncT0)
	r.remember(other, resyncT0.Add(time.Second))
	latest := resyncT0.Add(40 * time.Second)
	r.remember(a, latest)
	if r.len() != 2 {
		t.Fatalf("after removing a twice and other once len = %d, want 2: one entry per workload", r.len())
	}

	// Past the first removal's own expiry and other's: a still holds.
	mid := resyncT0.Add(ttl + 5*time.Second)
	if !r.holds(a, mid) {
		t.Fatal("a repeated removal expired with its first removal")
	}
	if r.holds(other, mid) {
		t.Fatal("an entry older than the refreshed one did not expire")
	}
	if !r.holds(a, latest.Add(ttl-time.Nanosecond)) {
		t.Fatal("repeated removal forgotten before a full ttl from the latest removal")
	}
	if r.holds(a, latest.Add(ttl)) {
		t.Fatal("repeated removal held past a full ttl from the latest removal")
	}
}

func TestRemovalMemoryPrunesExpiredEntriesAcrossManyEntries(t *testing.T) {
	const ttl = time.Minute
	const n = 3000
	r := newRemovalMemory(ttl, removalMemoryCapacity)
	for i := range n {
		r.remember(wireframe.WorkloadRef{Origin: "o", ID: itoa(i)}, resyncT0.Add(time.Duration(i)*time.Millisecond))
	}
	if r.len() != n {
		t.Fatalf("len = %d, want %d", r.len(), n)
	}
	// At t0+ttl+1000ms the first 1001 removals (0..1000 ms) have expired.
	now := resyncT0.Add(ttl + 1000*time.Millisecond)
	if r.holds(wireframe.WorkloadRef{Origin: "o", ID: "1000"}, now) || !r.holds(wireframe.WorkloadRef{Origin: "o", ID: "1001"}, now) {
		t.Fatal("expiry boundary wrong across many entries")
	}
	if r.len() != n-1001 || len(r.index) != n-1001 {
		t.Fatalf("after prune len=%d index=%d, want %d", r.len(), len(r.index), n-1001)
	}
	// A later removal prunes too, not only holds.
	r.remember(wireframe.WorkloadRef{Origin: "o", ID: "new"}, resyncT0.Add(ttl+n*time.Millisecond))
	if r.len() != 1 {
		t.Fatalf("after every old entry expired and one new removal, len = %d, want 1", r.len())
	}
}

func TestRemovalMemoryCapacityOfTheIngressIs65536(t *testing.T) {
	r := newRemovalMemory(time.Hour, removalMemoryCapacity)
	for i := range removalMemoryCapacity {
		r.remember(wireframe.WorkloadRef{Origin: "o", ID: itoa(i)}, resyncT0)
	}
	if r.len() != 65536 {
		t.Fatalf("len = %d, want 65536", r.len())
	}
	if full, _ := r.full(wireframe.WorkloadRef{Origin: "o", ID: "new"}, resyncT0); !full {
		t.Fatal("not full at 65536")
	}
	if !r.holds(wireframe.WorkloadRef{Origin: "o", ID: "0"}, resyncT0) {
		t.Fatal("the oldest removal was forgotten")
	}
}
