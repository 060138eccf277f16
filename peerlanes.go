package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// A peer sender delivers on two lanes, each with its own connection: the
// fresh lane sends the peer's queue in order, and the heartbeat lane sends
// the passes. A fresh frame therefore never waits behind a heartbeat
// request in flight, except one that carries its own workload. laneOrder
// holds the two rules that keep the lanes in the order a single connection
// would have given (spec 5.1):
//
//  1. The heartbeat lane takes re-assertions only while the fresh lane is
//     idle: every frame committed so far (counted from before its track,
//     broadcaster.reserve) has been offered to the peer and delivered or
//     given up. A re-assertion therefore never overtakes a fresh frame
//     tracked before it was taken. (A frame tracked after the pass began is
//     skipped by the pass, and a removed workload has left the set, so a
//     frame that arrives between this check and the take cannot be
//     overtaken either. One exception: a frame the set refuses as stale
//     changes no entry, so a re-assertion of the newer state it holds may
//     reach the peer ahead of that older frame, as it could before the
//     lanes when the older frame arrived while the slice was in flight.)
//  2. A fresh request that names a workload in the heartbeat request in
//     flight waits for that request to end. The workloads in flight are
//     published under mu in the same hold as the take, so a frame tracked
//     after the take always finds them. A workload is thus never re-asserted
//     to a peer after its removal or a newer frame reached it.
//  3. A workload marked when the peer's queue was full (overflow.go) goes
//     out on the heartbeat lane once the frames queued to the fresh lane
//     before its mark have been delivered or given up, ahead of any slice
//     of a pass and without waiting for the fresh lane to go idle: the
//     frames queue in order and settle in order, so a count of those
//     settled says when. Its frames after the mark joined the mark, so no
//     frame of it is left in the queue behind the mark; its state is read
//     from the re-sync set in the take, and the take publishes it as in
//     flight like a slice of a pass (rule 2).
type laneOrder struct {
	// mu guards inflight and done. Lock order: mu is taken before
	// Manager.activeMu (the heartbeat lane takes its slice under mu) and
	// nothing else is acquired under it; no network I/O happens under it.
	mu       sync.Mutex
	inflight map[wireframe.WorkloadRef]struct{} // the workloads of the heartbeat request in flight; nil when none
	done     chan struct{}                      // closed when that request ends

	// pending counts the frames handed to the fresh lane's queue that it
	// has not yet delivered or given up; idle is poked when it drops to 0,
	// and when a marked workload becomes due (rule 3).
	pending atomic.Int64
	idle    chan struct{}
	// undispatched is the broadcaster's count of frames enqueued but not
	// yet offered to every peer: a frame on its way to this lane's queue.
	undispatched *atomic.Int64

	// sent counts the frames ever put in the fresh lane's queue (written
	// by the dispatcher only), settledCount those of them delivered or
	// given up: frames settle in the order they were queued (rule 3).
	sent, settledCount atomic.Uint64
	// marks are this peer's marked workloads (rule 3).
	marks *overflowMarks
}

func newLaneOrder(undispatched *atomic.Int64, marks *overflowMarks) *laneOrder {
	return &laneOrder{idle: make(chan struct{}, 1), undispatched: undispatched, marks: marks}
}

// queued counts a frame about to be handed to the fresh lane's queue.
func (o *laneOrder) queued() { o.pending.Add(1) }

// accepted counts a frame the queue took, after queued.
func (o *laneOrder) accepted() { o.sent.Add(1) }

// withdrawn takes back queued for a frame the queue did not take.
func (o *laneOrder) withdrawn() {
	if o.pending.Add(-1) == 0 {
		o.wake()
	}
}

// settled counts n frames the fresh lane delivered or gave up, and wakes
// the heartbeat lane when none is left or a marked workload is due.
func (o *laneOrder) settled(n int) {
	o.settledCount.Add(uint64(n))
	if o.pending.Add(-int64(n)) == 0 || o.marksReady() {
		o.wake()
	}
}

// marksReady reports whether the first marked workload is due: the frames
// queued before its mark have all settled (rule 3).
func (o *laneOrder) marksReady() bool {
	return o.settledCount.Load() >= o.marks.front.Load()
}

// wake pokes the heartbeat lane to look at the fresh lane again: the
// broadcaster calls it when its last undispatched frame is gone, which
// settled does not see.
func (o *laneOrder) wake() {
	select {
	case o.idle <- struct{}{}:
	default:
	}
}

// freshIdle reports whether every frame enqueued so far has been offered
// to this peer and settled by its fresh lane. undispatched is read first:
// the dispatcher counts a frame into pending before it counts it out of
// undispatched, so the reverse order could miss a frame between the two.
func (o *laneOrder) freshIdle() bool {
	return o.undispatched.Load() == 0 && o.pending.Load() == 0
}

// awaitFreshIdle waits until the fresh lane is idle (rule 1), or a marked
// workload is due (rule 3), which goes first; it reports false when ctx
// ends first. Whichever count reaches 0 last pokes idle: the fresh lane
// when it settles its last frame, the broadcaster when its last
// undispatched frame is gone.
func (o *laneOrder) awaitFreshIdle(ctx context.Context) bool {
	for !o.freshIdle() && !o.marksReady() {
		select {
		case <-o.idle:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// sleep waits for d, or less when a marked workload becomes due first; it
// reports false when ctx ends first.
func (o *laneOrder) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for !o.marksReady() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-o.idle:
		}
	}
	return true
}

// takeInFlight takes the heartbeat lane's next slice with take and
// publishes its workloads as in flight, in one hold of mu (rule 2).
func (o *laneOrder) takeInFlight(take func() reassertions) reassertions {
	o.mu.Lock()
	defer o.mu.Unlock()
	r := take()
	if len(r.refs) > 0 {
		o.inflight = make(map[wireframe.WorkloadRef]struct{}, len(r.refs))
		for _, ref := range r.refs {
			o.inflight[ref] = struct{}{}
		}
		o.done = make(chan struct{})
	}
	return r
}

// endInFlight marks the heartbeat request in flight as ended.
func (o *laneOrder) endInFlight() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.inflight != nil {
		close(o.done)
		o.inflight, o.done = nil, nil
	}
}

// awaitNoConflict waits until no heartbeat request in flight names one of
// the workloads of frames (rule 2); it reports false when ctx ends first.
// It returns at once in the usual case, no request in flight or none of
// these workloads in it.
func (o *laneOrder) awaitNoConflict(ctx context.Context, frames []outboundFrame) bool {
	for {
		done := o.conflict(frames)
		if done == nil {
			return true
		}
		select {
		case <-done:
		case <-ctx.Done():
			return false
		}
	}
}

// conflict returns the done channel of the heartbeat request in flight when
// it names a workload of frames, else nil.
func (o *laneOrder) conflict(frames []outboundFrame) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.inflight == nil {
		return nil
	}
	for _, f := range frames {
		if _, ok := o.inflight[f.ref]; ok {
			return o.done
		}
	}
	return nil
}
