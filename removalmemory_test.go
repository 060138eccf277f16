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

func TestRemovalMemoryAtCapacityForgetsTheOldestFirst(t *testing.T) {
	r := newRemovalMemory(time.Hour, 3)
	refs := []wireframe.WorkloadRef{{Origin: "o", ID: "1"}, {Origin: "o", ID: "2"}, {Origin: "o", ID: "3"}, {Origin: "o", ID: "4"}, {Origin: "o", ID: "5"}}
	for i, ref := range refs {
		r.remember(ref, resyncT0.Add(time.Duration(i)*time.Second))
	}
	if r.len() != 3 || len(r.index) != 3 {
		t.Fatalf("len=%d index=%d, want the capacity 3", r.len(), len(r.index))
	}
	now := resyncT0.Add(10 * time.Second)
	for i, ref := range refs {
		if want := i >= 2; r.holds(ref, now) != want {
			t.Fatalf("after 5 removals with capacity 3, holds(%v) = %v, want %v", ref, !want, want)
		}
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

	r.remember(d, now) // b is now the oldest, not a
	if r.holds(b, now) || !r.holds(a, now) || !r.holds(c, now) || !r.holds(d, now) {
		t.Fatalf("after refreshing a and adding d: a=%v b=%v c=%v d=%v, want b forgotten only",
			r.holds(a, now), r.holds(b, now), r.holds(c, now), r.holds(d, now))
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

func TestRemovalMemoryCapacityOfTheIngressIs4096(t *testing.T) {
	r := newRemovalMemory(time.Hour, removalMemoryCapacity)
	for i := range removalMemoryCapacity + 10 {
		r.remember(wireframe.WorkloadRef{Origin: "o", ID: itoa(i)}, resyncT0)
	}
	if r.len() != 4096 {
		t.Fatalf("len = %d, want 4096", r.len())
	}
	if r.holds(wireframe.WorkloadRef{Origin: "o", ID: "9"}, resyncT0) || !r.holds(wireframe.WorkloadRef{Origin: "o", ID: "10"}, resyncT0) {
		t.Fatal("the oldest removals were not the ones forgotten")
	}
}
