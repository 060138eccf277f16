package statetable

import (
	"container/heap"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// Leases (spec 3.5.1) live on the run they retire: one per workload, kept
// in a min-heap by deadline, so arming, renewing or ending one is
// O(log n) and finding the next due is O(1). A lease exists only while its
// run is live in the table, so the heap is bounded by MaxLive.

// Lease is a copy of a run's lease, for the expiry.
type Lease struct {
	Key      wireframe.WorkloadKey
	Seconds  int
	Deadline time.Time
}

// Ref is the workload the lease is on.
func (l Lease) Ref() wireframe.WorkloadRef { return l.Key.Ref() }

// leaseState is a run's lease: its length as the producer gave it, when it
// runs out (after a failed expiry, the next try), the consecutive failed
// expiries, and its place in Table.leases.
type leaseState struct {
	seconds  int
	deadline time.Time
	failures int
	idx      int
}

type leaseHeap []*entry

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].lease.deadline.Before(h[j].lease.deadline) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].lease.idx, h[j].lease.idx = i, j
}
func (h *leaseHeap) Push(x any) {
	e := x.(*entry)
	e.lease.idx = len(*h)
	*h = append(*h, e)
}
func (h *leaseHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.lease.idx = -1
	return e
}

// applyLease updates the lease of f's workload once e holds f:
//
//   - A terminal frame, from any source, ends it: the job is closed, and an
//     expiry would bring it back. (A removal ends it by deleting the runs.)
//   - A producer's frame without the header ends it: the producer reports
//     this job unleased from now on.
//   - A producer's frame with the header arms or renews it on the frame's
//     run, which is live.
//   - A broker frame that is not terminal leaves it alone.
func (t *Table) applyLease(e *entry, f *Frame, now time.Time) {
	ref := e.key.Ref()
	if e.kind != kindLive {
		t.endLeases(ref)
		return
	}
	if f.Source != FromProducer {
		return
	}
	if f.LeaseSeconds == 0 {
		t.endLeases(ref)
		return
	}
	t.armLease(e, f.LeaseSeconds, now.Add(time.Duration(f.LeaseSeconds)*t.cfg.LeaseUnit))
}

// armEchoLease arms, on a live run an echo just made a producer's, the
// lease its mark was made under, from now: the journal that held the
// lease's deadline lost it, and the producer, if it still runs, renews
// within a third of it. A lease outside the header's bounds (no mark this
// node makes has one) arms nothing.
func (t *Table) armEchoLease(e *entry, seconds int, now time.Time) {
	if e.kind != kindLive || seconds < MinLeaseSeconds || seconds > MaxLeaseSeconds {
		return
	}
	t.armLease(e, seconds, now.Add(time.Duration(seconds)*t.cfg.LeaseUnit))
}

// armLease starts or renews e's lease; the workload's other runs give
// theirs up.
func (t *Table) armLease(e *entry, seconds int, deadline time.Time) {
	for s := t.byRef[e.key.Ref()]; s != nil; s = s.sibling {
		if s != e {
			t.endLease(s)
		}
	}
	if e.lease != nil {
		e.lease.seconds, e.lease.deadline, e.lease.failures = seconds, deadline, 0
		heap.Fix(&t.leases, e.lease.idx)
		t.stats.LeaseRenewed.Add(1)
	} else {
		e.lease = &leaseState{seconds: seconds, deadline: deadline}
		heap.Push(&t.leases, e)
	}
	if e.lease.idx == 0 {
		poke(t.leaseCh)
	}
}

func (t *Table) endLeases(ref wireframe.WorkloadRef) {
	for s := t.byRef[ref]; s != nil; s = s.sibling {
		t.endLease(s)
	}
}

func (t *Table) endLease(e *entry) {
	if e.lease != nil {
		heap.Remove(&t.leases, e.lease.idx)
		e.lease = nil
	}
}

// LeaseWake is poked when the earliest deadline may have moved earlier.
func (t *Table) LeaseWake() <-chan struct{} { return t.leaseCh }

// NextLease returns the earliest deadline, or false when no lease is held.
func (t *Table) NextLease() (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.leases) == 0 {
		return time.Time{}, false
	}
	return t.leases[0].lease.deadline, true
}

// DueLease returns the lease due first when its deadline has passed.
func (t *Table) DueLease(now time.Time) (Lease, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.leases) == 0 || t.leases[0].lease.deadline.After(now) {
		return Lease{}, false
	}
	e := t.leases[0]
	return Lease{Key: e.key, Seconds: e.lease.seconds, Deadline: e.lease.deadline}, true
}

// LeaseOf returns run k's lease deadline, zero for none.
func (t *Table) LeaseOf(k wireframe.WorkloadKey) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.byKey[k]; e != nil && e.lease != nil {
		return e.lease.deadline
	}
	return time.Time{}
}

// EndLease drops the lease on ref, if any, and reports whether there was
// one.
func (t *Table) EndLease(ref wireframe.WorkloadRef) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	had := false
	for s := t.byRef[ref]; s != nil; s = s.sibling {
		had = had || s.lease != nil
		t.endLease(s)
	}
	return had
}

// PostponeLease moves k's lease to be tried again after a failed expiry,
// doubling per consecutive failure from first up to most. It returns the
// delay, or 0 when the lease is no longer held.
func (t *Table) PostponeLease(k wireframe.WorkloadKey, now time.Time, first, most time.Duration) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byKey[k]
	if e == nil || e.lease == nil {
		return 0
	}
	// The shift stops at 5: past the maximum already at the defaults, and
	// a larger one would overflow after enough failures.
	d := min(first<<min(e.lease.failures, 5), most)
	e.lease.failures++
	e.lease.deadline = now.Add(d)
	heap.Fix(&t.leases, e.lease.idx)
	return d
}

// LiveRun returns the params of run k's latest state and its seq when the
// table holds it live: what a lease's expiry frame is built from.
func (t *Table) LiveRun(k wireframe.WorkloadKey) (params []byte, seq int64, hasSeq, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byKey[k]
	if e == nil || e.kind != kindLive {
		return nil, 0, false, false
	}
	return e.lineOf().Params(), e.seq, e.hasSeq, true
}

func heapPush(t *Table, e *entry) { heap.Push(&t.leases, e) }
