package main

import (
	"container/list"
	"slices"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// removalMemoryCapacity bounds the removals the ingress remembers within
// the retention window: 65,536 entries, some 10 MB at most at typical id
// lengths (and a run key each, nearly always one, sharing the strings the
// re-sync set held), a sustained 1,000 removals a second over the default one-minute
// window. An ingress removal of an owned workload past it is refused 503
// with Retry-After rather than forgetting an earlier one: a forgotten
// removal would let the broker's replay bring the workload back.
const removalMemoryCapacity = 65_536

// removalMemory remembers workloads removed through the ingress for the
// terminal-retention window. The broker replays its store to a restarted
// daemon, and that replay can land after a producer's removal; without this
// memory the replay would track the workload again and re-assert it to the
// peers on every heartbeat. It is guarded by Manager.activeMu and only
// changed under broadcastMu, but for its restore from the journal at start.
//
// It holds only removals of workloads the producers owned (ownership.go),
// with the runs they held, and drops only a replay of those runs, so no
// producer can silence the broker's own frames for a workload or a new
// job the broker starts under a removed id. It never forgets a removal
// within its window: at capacity the ingress refuses new removals (full)
// instead, so a replay after any number of accepted removals brings back
// none of them. Removals in flight when the
// check passed may take it past capacity by at most brokerWaitersMax.
//
// Entries are kept in removal order. Every entry has the same lifetime, so
// the oldest is always the first to expire: pruning pops from the front and
// stops at the first live entry, amortized constant time per removal.
type removalMemory struct {
	ttl      time.Duration
	capacity int
	order    *list.List                              // front = oldest removal
	index    map[wireframe.WorkloadRef]*list.Element // ref -> its entry in order

	refusals atomic.Uint64 // removals refused because it was full
}

type removalEntry struct {
	ref wireframe.WorkloadRef
	at  time.Time
	// runs are the runs the re-sync set held of the workload when it was
	// removed: only the broker's replay of one of them is dropped, so a
	// new run the broker starts under the same id is its own and tracked.
	// Nil for any run: a removal restored from the journal (which keeps
	// ids only), or of a restored workload no replay had named yet.
	runs []runKey
}

// runKey is one run of a workload: what tells the broker's replay of a
// removed run from a new job of the same id.
type runKey struct{ engine, runID string }

func newRemovalMemory(ttl time.Duration, capacity int) *removalMemory {
	return &removalMemory{ttl: ttl, capacity: capacity, order: list.New(), index: map[wireframe.WorkloadRef]*list.Element{}}
}

// remember records a removal at now of the given runs of ref (none: any
// run). A repeated removal replaces its entry, so it lives a full window
// from the latest removal and occupies one slot.
func (r *removalMemory) remember(ref wireframe.WorkloadRef, now time.Time, runs ...runKey) {
	r.prune(now)
	if e, ok := r.index[ref]; ok {
		r.order.Remove(e)
	}
	r.index[ref] = r.order.PushBack(removalEntry{ref: ref, at: now, runs: runs})
}

// full reports whether remembering ref at now would take a new slot past
// capacity, and if so how long until the oldest entry expires.
func (r *removalMemory) full(ref wireframe.WorkloadRef, now time.Time) (bool, time.Duration) {
	r.prune(now)
	if _, ok := r.index[ref]; ok || r.order.Len() < r.capacity {
		return false, 0
	}
	return true, r.order.Front().Value.(removalEntry).at.Add(r.ttl).Sub(now)
}

// restore records a removal the journal held, made at at, unless its
// window has passed by now. The journal lists removals oldest first, so
// each goes to the back.
func (r *removalMemory) restore(ref wireframe.WorkloadRef, at, now time.Time) {
	if now.Sub(at) >= r.ttl || r.index[ref] != nil {
		return
	}
	if back := r.order.Back(); back != nil && at.Before(back.Value.(removalEntry).at) {
		at = back.Value.(removalEntry).at // keep the order pruning relies on
	}
	r.index[ref] = r.order.PushBack(removalEntry{ref: ref, at: at})
}

// holds reports whether ref was removed within the window.
func (r *removalMemory) holds(ref wireframe.WorkloadRef, now time.Time) bool {
	r.prune(now)
	_, ok := r.index[ref]
	return ok
}

// dropsReplay reports whether a broker frame for run k is the replay of a
// run removed within the window: one of the runs remembered for its
// workload, or any run when none were (a removal restored from the
// journal).
func (r *removalMemory) dropsReplay(k wireframe.WorkloadKey, now time.Time) bool {
	r.prune(now)
	e, ok := r.index[k.Ref()]
	if !ok {
		return false
	}
	runs := e.Value.(removalEntry).runs
	return runs == nil || slices.Contains(runs, runKey{k.Engine, k.RunID})
}

// forget clears ref: the producer reported the workload anew.
func (r *removalMemory) forget(ref wireframe.WorkloadRef) {
	if e, ok := r.index[ref]; ok {
		r.drop(e)
	}
}

func (r *removalMemory) prune(now time.Time) {
	for e := r.order.Front(); e != nil && now.Sub(e.Value.(removalEntry).at) >= r.ttl; e = r.order.Front() {
		r.drop(e)
	}
}

func (r *removalMemory) drop(e *list.Element) {
	delete(r.index, e.Value.(removalEntry).ref)
	r.order.Remove(e)
}

func (r *removalMemory) len() int { return r.order.Len() }
