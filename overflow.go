package main

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// Overflow degrades to state, never to loss (spec 4, 5.1). A frame that
// finds a peer's queue full is not dropped: its workload is marked for that
// peer, and the peer's heartbeat lane sends the workload's latest state
// from the re-sync set, or its removal, as soon as the fresh frames queued
// to the peer before the mark have been delivered, ahead of any slice of a
// periodic pass. A burst of any size therefore reaches every peer in its
// final state at the peer's own pace, not at the next interval, and a
// dropped removal is no longer lost for good.
//
// The same set stands in front of the ordered enqueue point: a frame that
// finds it full marks its workload there, and the dispatcher hands the
// mark to every peer once the frames enqueued before it have been offered.

// noMark is overflowMarks.front when the set is empty: no settled count
// reaches it.
const noMark = math.MaxUint64

// overflowTransferBudget is the most marks the dispatcher hands from the
// enqueue point to the peers in one hold of broadcaster.mu: the marks made
// while the enqueue point was full all become due at once.
const overflowTransferBudget = 256

// overflowMark is one marked workload: what is to be sent for it, and the
// place in the frames queued ahead of it that it waits for.
type overflowMark struct {
	ref wireframe.WorkloadRef
	// after is how many frames had been queued ahead of the mark when it
	// was made: it may go once that many have been delivered or given up,
	// so it never overtakes a frame of its workload queued before it.
	after uint64
	// removal says the workload's removal is to be sent; state that its
	// latest state is, after the removal when both (the workload was
	// removed, then reported again).
	removal, state bool
	frames         uint64    // the frames the mark stands for
	at             time.Time // when the first of them was enqueued
	next           *overflowMark
}

// overflowMarks is a bounded set of marked workloads in the order they were
// first marked. While a workload is marked, every later frame of it joins
// the mark instead of the queue (add), so the mark stands for everything
// from its first frame on and one send of the latest state covers them all.
type overflowMarks struct {
	limit int // the most marks held: the re-sync set's own bound

	// mu guards byRef, the list, and burst. It is a leaf lock: taken under
	// broadcaster.mu (the dispatcher's add, holds and transfer) and under
	// laneOrder.mu (the heartbeat lane's take); nothing is acquired under
	// it and no I/O happens under it.
	mu         sync.Mutex
	byRef      map[wireframe.WorkloadRef]*overflowMark
	head, tail *overflowMark
	burst      overflowSummary
	inflight   int // marks taken and not yet settled

	// drained is poked when the set has drained to empty and nothing
	// taken from it is in flight: a closing sender waits for it.
	drained chan struct{}

	// front is the first mark's after, or noMark when there is none; size
	// is the number of marks. Both are written under mu and read without
	// it, so the common path (no mark) costs an atomic load.
	front atomic.Uint64
	size  atomic.Int64
}

// overflowSummary counts one burst: from the first mark made while the
// set was empty until the set has drained to empty again.
type overflowSummary struct {
	open      bool
	began     time.Time
	marked    uint64 // frames that marked their workload instead of being queued
	workloads uint64 // marks made
	recovered uint64 // frames sent from marks that the peer took
	failed    uint64 // frames sent from marks that were given up after their attempts
	lost      uint64 // marked workloads with nothing to send (see recoveryFrames)
	dropped   uint64 // frames dropped with the set at its bound
	bursts    int    // bursts summed into this summary
}

func newOverflowMarks(limit int) *overflowMarks {
	o := &overflowMarks{limit: limit, byRef: map[wireframe.WorkloadRef]*overflowMark{}, drained: make(chan struct{}, 1)}
	o.front.Store(noMark)
	return o
}

// holds reports whether ref is marked.
func (o *overflowMarks) holds(ref wireframe.WorkloadRef) bool {
	if o.size.Load() == 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.byRef[ref]
	return ok
}

func (o *overflowMarks) len() int { return int(o.size.Load()) }

// busy reports whether a mark is held or being sent.
func (o *overflowMarks) busy() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.byRef) > 0 || o.inflight > 0
}

// add marks ref for frames frames, the latest a removal or a state, to go
// once after frames queued ahead of it have settled; a workload already
// marked keeps its place and the latest frame wins: a removal overtakes a
// state marked before it, and a state marked after a removal is sent after
// it. It reports false, and marks nothing, when ref is new and the set is
// at its bound; began reports that the mark opened a burst.
func (o *overflowMarks) add(ref wireframe.WorkloadRef, removal, state bool, frames, after uint64, at time.Time) (ok, began bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.byRef[ref]
	if m == nil {
		if len(o.byRef) >= o.limit {
			o.burst.dropped += frames
			return false, false
		}
		m = &overflowMark{ref: ref, after: after, at: at}
		o.byRef[ref] = m
		if o.tail == nil {
			o.head = m
			o.front.Store(after)
		} else {
			o.tail.next = m
		}
		o.tail = m
		o.size.Store(int64(len(o.byRef)))
		if !o.burst.open {
			o.burst = overflowSummary{open: true, began: at}
			began = true
		}
		o.burst.workloads++
	}
	if removal {
		m.removal, m.state = true, state
	} else if state {
		m.state = true
	}
	m.frames += frames
	o.burst.marked += frames
	return true, began
}

// takeReady takes up to max marks, first marked first, whose frames queued
// ahead have settled (settled of them so far).
func (o *overflowMarks) takeReady(settled uint64, max int) []overflowMark {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []overflowMark
	for o.head != nil && o.head.after <= settled && len(out) < max {
		m := o.head
		o.head = m.next
		delete(o.byRef, m.ref)
		m.next = nil
		out = append(out, *m)
	}
	o.inflight += len(out)
	if o.head == nil {
		o.tail = nil
		o.front.Store(noMark)
	} else {
		o.front.Store(o.head.after)
	}
	o.size.Store(int64(len(o.byRef)))
	return out
}

// settle counts what the recovery of taken marks delivered, and ends the
// burst when the set has drained to empty: it then returns the burst's
// summary.
func (o *overflowMarks) settle(taken int, recovered, failed, lost uint64) (sum overflowSummary, ended bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.inflight -= taken
	o.burst.recovered += recovered
	o.burst.failed += failed
	o.burst.lost += lost
	if len(o.byRef) > 0 || o.inflight > 0 {
		return overflowSummary{}, false
	}
	select {
	case o.drained <- struct{}{}:
	default:
	}
	if !o.burst.open {
		return overflowSummary{}, false
	}
	sum = o.burst
	sum.bursts = 1
	o.burst = overflowSummary{}
	return sum, true
}

// removalLine is the removal sent for a marked workload: the two fields a
// peer acts on (its broker is written only those, brokerParams), rebuilt
// from the ref, so a mark keeps no line of its own.
func removalLine(ref wireframe.WorkloadRef) []byte {
	return wireframe.EncodeRemoval(ref)
}

// overflowLog writes a peer's overflow lines: one when a burst begins and
// one when it ends, carrying the burst's counts. Both are rate-limited, as
// a producer can cause bursts: a start line at most once per
// dropLogInterval, and an end line within dropLogInterval of the last one
// is held and summed with what follows, then written when the interval is
// up, so no burst's count is lost and none is written as 1.
type overflowLog struct {
	mu        sync.Mutex // guards the fields below; a leaf lock, released before logging
	lastStart time.Time
	lastEnd   time.Time
	held      overflowSummary // ended bursts not yet written
	timer     *time.Timer     // writes held when the interval is up
}

// began notes the start of a burst with msg. The line carries no count:
// the burst's comes when it ends.
func (l *overflowLog) began(log *slog.Logger, msg string, args ...any) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.lastStart) < dropLogInterval {
		l.mu.Unlock()
		return
	}
	l.lastStart = now
	l.mu.Unlock()
	log.Warn(msg, args...)
}

// ended notes the end of a burst and writes its line, or holds it.
func (l *overflowLog) ended(log *slog.Logger, sum overflowSummary) {
	l.mu.Lock()
	l.held.add(sum)
	now := time.Now()
	if wait := l.lastEnd.Add(dropLogInterval).Sub(now); wait > 0 {
		if l.timer == nil {
			l.timer = time.AfterFunc(wait, func() { l.flush(log) })
		}
		l.mu.Unlock()
		return
	}
	held := l.takeLocked(now)
	l.mu.Unlock()
	writeOverflowLine(log, held, now)
}

// flush writes the held bursts' line.
func (l *overflowLog) flush(log *slog.Logger) {
	l.mu.Lock()
	now := time.Now()
	held := l.takeLocked(now)
	l.mu.Unlock()
	if held.bursts > 0 {
		writeOverflowLine(log, held, now)
	}
}

func (l *overflowLog) takeLocked(now time.Time) overflowSummary {
	held := l.held
	l.held, l.lastEnd, l.timer = overflowSummary{}, now, nil
	return held
}

func (s *overflowSummary) add(o overflowSummary) {
	if s.bursts == 0 {
		s.began = o.began
	}
	s.marked += o.marked
	s.workloads += o.workloads
	s.recovered += o.recovered
	s.failed += o.failed
	s.lost += o.lost
	s.dropped += o.dropped
	s.bursts += o.bursts
}

func writeOverflowLine(log *slog.Logger, s overflowSummary, now time.Time) {
	level := slog.LevelInfo
	if s.failed+s.lost+s.dropped > 0 {
		level = slog.LevelWarn
	}
	log.Log(context.Background(), level, "peer overflow recovered",
		"marked", s.marked, "workloads", s.workloads, "recovered", s.recovered,
		"failed", s.failed, "lost", s.lost, "dropped", s.dropped,
		"bursts", s.bursts, "took", now.Sub(s.began).Round(time.Millisecond))
}
