package main

import (
	"container/list"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// removalMemoryCapacity bounds the removals the ingress remembers.
const removalMemoryCapacity = 4096

// removalMemory remembers workloads removed through the ingress for the
// terminal-retention window. The broker replays its store to a restarted
// daemon, and that replay can land after a producer's removal; without this
// memory the replay would track the workload again and re-assert it to the
// peers on every heartbeat. It is guarded by Manager.activeMu and only
// changed under broadcastMu.
//
// Entries are kept in removal order. Every entry has the same lifetime, so
// the oldest is always the first to expire: pruning pops from the front and
// stops at the first live entry, amortized constant time per removal.
type removalMemory struct {
	ttl      time.Duration
	capacity int
	order    *list.List                              // front = oldest removal
	index    map[wireframe.WorkloadRef]*list.Element // ref -> its entry in order
}

type removalEntry struct {
	ref wireframe.WorkloadRef
	at  time.Time
}

func newRemovalMemory(ttl time.Duration, capacity int) *removalMemory {
	return &removalMemory{ttl: ttl, capacity: capacity, order: list.New(), index: map[wireframe.WorkloadRef]*list.Element{}}
}

// remember records a removal at now. A repeated removal replaces its entry,
// so it lives a full window from the latest removal and occupies one slot.
// At capacity the oldest removal is forgotten.
func (r *removalMemory) remember(ref wireframe.WorkloadRef, now time.Time) {
	r.prune(now)
	if e, ok := r.index[ref]; ok {
		r.order.Remove(e)
	}
	r.index[ref] = r.order.PushBack(removalEntry{ref, now})
	for r.order.Len() > r.capacity {
		r.drop(r.order.Front())
	}
}

// holds reports whether ref was removed within the window.
func (r *removalMemory) holds(ref wireframe.WorkloadRef, now time.Time) bool {
	r.prune(now)
	_, ok := r.index[ref]
	return ok
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
