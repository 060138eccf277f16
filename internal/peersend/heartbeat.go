package peersend

import (
	"context"
	"time"

	"nvpair-workload-manager/internal/statetable"
)

// heartbeatStream is one peer's schedule of passes over the table's runs
// (spec 5.1): every interval, each run in pass order (live ones, and ended
// ones within their retention) is re-asserted to the peer, because PAIR's
// broker fails a foreign live record it has not heard of within 5 minutes,
// and a peer's broker may have lost what it was sent. A pass walks pass
// order from a place the table keeps valid across changes, so it visits
// every run once whatever changes meanwhile; a run changed after the pass
// began is skipped, as the peer is sent it fresh. A pass that cannot
// finish within the interval carries on; the next starts when it ends.
//
// The sender takes a slice only while its peer is caught up (run), so a
// re-assertion never reaches a peer ahead of a newer state of its run; or
// while the one entry above its mark is a frame the peer keeps failing,
// waiting for its next try (headofline.go), which is the latest state of
// its run.
type heartbeatStream struct {
	table    *statetable.Table
	interval time.Duration
	stats    *Stats
	pass     statetable.Pass
	active   bool
	started  time.Time // of the pass under way, or of the last one
	next     time.Time // when the next pass may start
	// prompt is the member's re-assertion when it joins
	// (newHeartbeatStream): the first pass, at once and unpaced, over the
	// runs at or below its mark then (promptUpTo).
	prompt     bool
	promptUpTo uint64
	// failedLast says the last re-assertion the pass sent failed in a way
	// that may be about the peer: a second in a row ends the pass.
	failedLast bool
	// rnd places the passes (jitter.go): the first at a random point of
	// the interval, each next an interval after the last began, give or
	// take passJitter.
	rnd randN
}

// passShare is the share of the interval a pass is spread over, in
// percent. A pass sent flat out at the start of each interval takes the
// CPU from the read loop, the ingress and the fresh entries for as long as
// it runs (at 100,000 workloads and 8 peers, most of every interval);
// spread over most of the interval, the same work is a steady trickle, with
// the rest of the interval left for a pass that runs slow to finish.
const passShare = 80

// HeartbeatSlice is the most re-assertions one request carries to a
// batching peer. It bounds how long a fresh entry waits behind a heartbeat
// request, and how long a take holds the table's lock (about 4 µs for 64
// entries), where the peer's 256-frame batch would bound neither well.
const HeartbeatSlice = 64

// newHeartbeatStream schedules the first pass of a member that has just
// joined with mark: at once when it held a mark (a member's re-assertion
// when it joins, below), else at a random point of the second half of
// the next interval (jitter.go): a member new to the table is sent the
// whole of it by its catch-up, so a pass soon after would repeat it for
// nothing, and the members of one snapshot must not start their passes,
// here and on every other node, at one instant.
//
// A member's re-assertion when it joins: this node's first snapshot after
// a restart lists it, or it comes back to discovery. Its broker may have
// inferred this node's loss meanwhile and failed its live jobs (PAIR's
// does when a node leaves discovery), and its dedup holds the frames it had
// before, so an ordinary frame for a job that did not change (the broker's
// replay after a restart) is dropped there unheard. The stock worker
// backfills every peer it adds with its re-sync set, re-sync-marked. Here
// the member's catch-up carries the marker on every entry above its mark
// (peerSender.restating), and the runs at or below it, which the catch-up
// does not carry, are re-asserted by a first pass that starts once the
// catch-up is done and goes unpaced: the member's broker hears every run
// within the time of those requests, not of the heartbeat interval.
func newHeartbeatStream(table *statetable.Table, interval time.Duration, stats *Stats, mark uint64, rnd randN) *heartbeatStream {
	h := &heartbeatStream{table: table, interval: interval, stats: stats, rnd: rnd, next: time.Now().Add(interval/2 + rnd.within(interval/2))}
	if mark > 0 {
		h.prompt, h.promptUpTo, h.next = true, mark, time.Now()
	}
	return h
}

func (h *heartbeatStream) close() { h.table.ClosePass(&h.pass) }

func (h *heartbeatStream) begin(now time.Time) {
	h.active, h.started, h.failedLast = true, now, false
	if h.prompt {
		h.table.BeginPassUpTo(&h.pass, h.promptUpTo)
	} else {
		h.table.BeginPass(&h.pass)
	}
	h.stats.PassesStarted.Add(1)
	h.stats.PassProgress.Store(0)
}

// untilNext is how long until the stream has a slice to send.
func (h *heartbeatStream) untilNext(now time.Time) time.Duration {
	if h.active {
		return max(h.paceWait(now), time.Millisecond)
	}
	return max(h.next.Sub(now), time.Millisecond)
}

// paceWait is how long the pass under way should wait before its next
// slice, so that it visits the runs at an even pace over passShare
// percent of the interval.
func (h *heartbeatStream) paceWait(now time.Time) time.Duration {
	if h.pass.Size == 0 || h.prompt {
		return 0
	}
	span := h.interval * passShare / 100
	due := h.started.Add(time.Duration(float64(span) * float64(h.pass.Progress) / float64(h.pass.Size)))
	return due.Sub(now)
}

// abandon ends the pass early: the peer failed a re-assertion, and the
// rest would most likely fail too. Carrying on would turn a peer that
// refuses connections into a tight loop of failed dials; the next pass,
// on the usual schedule, repeats them all.
func (h *heartbeatStream) abandon(now time.Time) {
	h.stats.PassesAbandoned.Add(1)
	h.end(now)
}

func (h *heartbeatStream) finish(now time.Time) {
	h.stats.PassesCompleted.Add(1)
	h.end(now)
}

// end schedules the next pass an interval after this one started, give
// or take passJitter, or at once when this one overran its interval.
func (h *heartbeatStream) end(now time.Time) {
	h.active, h.prompt = false, false
	h.next = h.started.Add(h.rnd.around(h.interval, passJitter))
	if now.After(h.next) {
		h.stats.PassesOverrun.Add(1)
		h.next = now
	}
}

// heartbeatTurn sends the next slice of the pass when one is due and
// reports whether it did anything.
func (s *peerSender) heartbeatTurn() bool {
	h, now := s.hb, time.Now()
	if !h.active {
		if now.Before(h.next) {
			return false
		}
		h.begin(now)
	}
	if h.paceWait(now) > 0 {
		return false
	}
	frames, size := s.heartbeatBounds()
	lines, done := s.table.TakePass(&h.pass, frames, size)
	h.stats.PassSize.Store(uint64(h.pass.Size))
	h.stats.PassProgress.Store(uint64(h.pass.Progress))
	if len(lines) > 0 {
		accepted, ok := s.reassert(lines)
		if accepted > 0 {
			// The peer takes re-assertions: a frame it keeps failing
			// alone above its mark is that frame's fault (headofline.go).
			s.skipLoneSpent()
		}
		if !ok {
			h.abandon(time.Now())
			return true
		}
	}
	if done {
		h.finish(time.Now())
	}
	return true
}

// sleepCtx waits for d, or less when ctx ends first; it reports whether ctx
// is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
