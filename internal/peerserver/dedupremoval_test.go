package peerserver

import (
	"errors"
	"sync/atomic"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// The dedup's rule for removals (spec 3.3, "Dedup"): a removal is a
// duplicate only of a removal of its workload delivered with no lifecycle
// frame of the workload written since.

func testRemoval(origin, id string) *wireframe.Removal {
	return &wireframe.Removal{Ref: wireframe.WorkloadRef{Origin: origin, ID: id}}
}

// dedupRecorder delivers frames through a dedup and lists what it wrote.
type dedupRecorder struct {
	t       *testing.T
	d       *dedup
	written []string
}

func (r *dedupRecorder) life(e wireframe.Lifecycle, what string) (duplicate bool) {
	r.t.Helper()
	dup, err := r.d.deliverLifecycle(&e, func() error { r.written = append(r.written, what); return nil })
	if err != nil {
		r.t.Fatal(err)
	}
	return dup
}

func (r *dedupRecorder) remove(origin, id string) (duplicate bool) {
	r.t.Helper()
	dup, err := r.d.deliverRemoval(testRemoval(origin, id), func() error { r.written = append(r.written, "remove:"+id); return nil })
	if err != nil {
		r.t.Fatal(err)
	}
	return dup
}

func TestDedupRemovalOfAReusedIDAfterANewRunIsDelivered(t *testing.T) {
	r := &dedupRecorder{t: t, d: newDedup(100)}
	run := func(n string) wireframe.Lifecycle {
		return mustLifecycle(t, testframe.Workload("job-42", "running", "node-a", map[string]any{"runId": "run-" + n}), nil)
	}
	r.life(run("1"), "run-1")
	r.remove("node-a", "job-42")
	if !r.remove("node-a", "job-42") {
		t.Fatal("the same removal again, nothing between: not a duplicate")
	}
	r.life(run("2"), "run-2")
	if r.remove("node-a", "job-42") {
		t.Fatalf("the removal after run 2 was taken for the first one's duplicate; written %q", r.written)
	}
	if !r.remove("node-a", "job-42") {
		t.Fatal("run 2's removal again: not a duplicate")
	}
	want := []string{"run-1", "remove:job-42", "run-2", "remove:job-42"}
	if len(r.written) != len(want) {
		t.Fatalf("written %q, want %q", r.written, want)
	}
	for i := range want {
		if r.written[i] != want[i] {
			t.Fatalf("written %q, want %q", r.written, want)
		}
	}
}

func TestDedupReassertionAfterARemovalMakesTheNextRemovalNew(t *testing.T) {
	// A re-assertion is how a workload comes back to a peer whose fresh
	// frames were lost: once written, the workload is live at the broker
	// and its removal must reach it again.
	r := &dedupRecorder{t: t, d: newDedup(100)}
	w := testframe.Workload("job-1", "running", "node-a")
	r.life(mustLifecycle(t, w, nil), "upsert")
	r.remove("node-a", "job-1")
	r.life(mustLifecycle(t, w, map[string]any{"resync": true}), "resync")
	if r.remove("node-a", "job-1") {
		t.Fatalf("the removal after a re-assertion was a duplicate; written %q", r.written)
	}
}

func TestDedupLifecycleDuplicateOrFailedWriteKeepsTheRemovalADuplicate(t *testing.T) {
	// Only a lifecycle frame the broker got makes the workload live there
	// again: a late retry of a frame from before the removal (a duplicate,
	// not written) or a failed write leaves the removal the broker's last
	// word, so the same removal again is still a duplicate.
	r := &dedupRecorder{t: t, d: newDedup(100)}
	e := mustLifecycle(t, testframe.Workload("job-1", "running", "node-a"), nil)
	r.life(e, "upsert")
	r.remove("node-a", "job-1")
	if !r.life(e, "upsert again") {
		t.Fatal("the late retry of the upsert was written")
	}
	other := mustLifecycle(t, testframe.Workload("job-1", "completed", "node-a"), nil)
	if _, err := r.d.deliverLifecycle(&other, func() error { return errors.New("broker gone") }); err == nil {
		t.Fatal("the failed write reported no error")
	}
	if !r.remove("node-a", "job-1") {
		t.Fatalf("the removal again was written; written %q", r.written)
	}
}

func TestDedupLifecycleForgetsOnlyItsOwnWorkloadsRemovals(t *testing.T) {
	r := &dedupRecorder{t: t, d: newDedup(100)}
	r.remove("node-a", "job-1")
	r.remove("node-b", "job-1")
	r.remove("node-a", "job-2")
	r.remove("", "job-1") // upstream's removal without originatedFrom
	r.remove("", "job-2")
	r.life(mustLifecycle(t, testframe.Workload("job-1", "running", "node-a"), nil), "upsert")
	for _, c := range []struct {
		origin, id string
		dup        bool
	}{
		{"node-a", "job-1", false}, // its own workload
		{"", "job-1", false},       // its id's removal without origin
		{"node-b", "job-1", true},  // another origin's workload of the same id
		{"node-a", "job-2", true},
		{"", "job-2", true},
	} {
		if got := r.remove(c.origin, c.id); got != c.dup {
			t.Errorf("removal (%q, %q) after job-1's upsert from node-a: duplicate=%v, want %v", c.origin, c.id, got, c.dup)
		}
	}
}

// TestDedupRemovalRacingALifecycleWriteWaitsForIt: a removal that arrives
// while a lifecycle frame of its workload is being written (from another
// peer, or the other lane) waits for that write, then finds its key
// forgotten and reaches the broker after the lifecycle frame, as the broker
// order requires. Were it decided beside the write, it would be taken for
// the earlier removal's duplicate while the broker was making the workload
// live again, and the workload would stay live.
func TestDedupRemovalRacingALifecycleWriteWaitsForIt(t *testing.T) {
	for _, c := range []struct{ name, removalOrigin string }{
		{"removal with origin", "node-a"},
		{"removal without origin", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, resync := range []bool{false, true} {
				d := newDedup(100)
				rm := testRemoval(c.removalOrigin, "job-1")
				var order []string
				var removals atomic.Int32
				writeRemoval := func() error { removals.Add(1); order = append(order, "remove"); return nil }
				if dup, _ := d.deliverRemoval(rm, writeRemoval); dup {
					t.Fatal("first removal a duplicate")
				}
				var extra map[string]any
				if resync {
					extra = map[string]any{"resync": true}
				}
				e := mustLifecycle(t, testframe.Workload("job-1", "running", "node-a", map[string]any{"runId": "run-2"}), extra)
				inWrite, release := make(chan struct{}), make(chan struct{})
				lifeDone := make(chan error, 1)
				go func() {
					_, err := d.deliverLifecycle(&e, func() error {
						close(inWrite)
						<-release
						order = append(order, "upsert")
						return nil
					})
					lifeDone <- err
				}()
				<-inWrite
				type result struct {
					dup bool
					err error
				}
				rmDone := make(chan result, 1)
				go func() {
					dup, err := d.deliverRemoval(rm, writeRemoval)
					rmDone <- result{dup, err}
				}()
				// Release the lifecycle write once the removal waits behind
				// it, or has been decided without waiting (the failure).
				var early *result
				testkit.Eventually(t, "the removal waiting for the lifecycle write", func() bool {
					select {
					case r := <-rmDone:
						early = &r
						return true
					default:
						return sharedLockWaiters(d) == 2
					}
				})
				close(release)
				if err := <-lifeDone; err != nil {
					t.Fatal(err)
				}
				res := early
				if res == nil {
					r := <-rmDone
					res = &r
				}
				if res.dup || res.err != nil || removals.Load() != 2 {
					t.Fatalf("resync=%v: the racing removal: duplicate=%v err=%v, removals written %d; want written after the upsert (order %q)",
						resync, res.dup, res.err, removals.Load(), order)
				}
				if len(order) != 3 || order[1] != "upsert" || order[2] != "remove" {
					t.Fatalf("resync=%v: broker order %q, want remove, upsert, remove", resync, order)
				}
				assertNoInflight(t, d)
			}
		})
	}
}

// sharedLockWaiters returns the most deliveries holding or waiting for one
// per-key lock, whichever.
func sharedLockWaiters(d *dedup) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	most := 0
	for _, kl := range d.inflight {
		most = max(most, kl.refs)
	}
	return most
}

// TestDedupCountsTheRemovalKeysItHolds: a lifecycle frame skips the
// digests of its workload's removal keys while the dedup holds none, so
// the count must follow the keys held as removals are recorded, forgotten
// by a lifecycle frame and evicted by the capacity; a count that stayed at
// 0 with a key held would let a removal's key outlive the run after it.
func TestDedupCountsTheRemovalKeysItHolds(t *testing.T) {
	r := &dedupRecorder{t: t, d: newDedup(4)}
	held := func() int {
		r.d.mu.Lock()
		defer r.d.mu.Unlock()
		n := 0
		for i := r.d.front; i >= 0; i = r.d.entries[i].next {
			if r.d.entries[i].removal {
				n++
			}
		}
		return n
	}
	check := func(when string, want int) {
		t.Helper()
		if got, count := held(), int(r.d.removals.Load()); got != want || count != want {
			t.Fatalf("%s: %d removal keys held, counted %d; want %d", when, got, count, want)
		}
	}
	check("empty", 0)
	r.remove("node-a", "job-1")
	r.remove("", "job-2")
	r.remove("node-a", "job-1") // a duplicate: no second key
	check("two removals recorded", 2)
	r.life(mustLifecycle(t, testframe.Workload("job-2", "running", "node-a", nil), nil), "job-2")
	check("a lifecycle frame of job-2 forgot its removal key", 1)
	for _, id := range []string{"job-3", "job-4", "job-5", "job-6"} {
		r.life(mustLifecycle(t, testframe.Workload(id, "running", "node-a", nil), nil), id)
	}
	check("the capacity evicted the last removal key", 0)
	r.remove("node-a", "job-1")
	if r.d.removals.Load() != 1 {
		t.Fatal("a removal recorded after an eviction was not counted")
	}
	r.life(mustLifecycle(t, testframe.Workload("job-1", "running", "node-a", map[string]any{"runId": "run-2"}), nil), "job-1 run 2")
	if r.remove("node-a", "job-1") {
		t.Fatalf("the removal after a new run was taken for a duplicate; written %q", r.written)
	}
}
