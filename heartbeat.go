package main

import (
	"context"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// heartbeatSource is where a peer sender reads its heartbeat passes from:
// the Manager's re-sync set, behind activeMu. Each take holds the lock for
// a bounded slice of work (at most one batch of entries, plus the expired
// entries it prunes), never for the whole set, so the read loop and the
// ingress wait on the heartbeat for microseconds, not for the set's size.
type heartbeatSource interface {
	closeCursor(c *resyncCursor)
	generation() uint64
	take(c *resyncCursor, maxFrames, maxBytes int) (r reassertions, size int, done bool)
	// latestLines returns, for each workload, the re-assertion lines of
	// the runs the set holds for it (none when it holds none), the run
	// that changed last last, in one bounded hold: the state a marked
	// workload is recovered with (overflow.go).
	latestLines(refs []wireframe.WorkloadRef) [][][]byte
	// endedSeq is the end of the log of recent ends as it is now, read
	// without a lock; takeEnded returns a slice of the log from from up
	// to end in one bounded hold, leaving out the removals numbered from
	// added on (endedlog.go).
	endedSeq() uint64
	takeEnded(from, end, added uint64, maxFrames, maxBytes int) (r reassertions, next uint64, done bool)
}

// The Manager is the heartbeat source of its broadcaster.
func (m *Manager) closeCursor(c *resyncCursor) {
	m.activeMu.Lock()
	defer m.activeMu.Unlock()
	m.resync.closeCursor(c)
}

func (m *Manager) generation() uint64 { return m.resync.generation() }

func (m *Manager) take(c *resyncCursor, maxFrames, maxBytes int) (reassertions, int, bool) {
	m.activeMu.Lock()
	defer m.activeMu.Unlock()
	return m.resync.take(c, m.now(), maxFrames, maxBytes)
}

func (m *Manager) latestLines(refs []wireframe.WorkloadRef) [][][]byte {
	m.activeMu.Lock()
	defer m.activeMu.Unlock()
	out := make([][][]byte, len(refs))
	for i, ref := range refs {
		out[i] = m.resync.latestLines(ref)
	}
	return out
}

// pruneResync drops expired terminal entries even while no pass runs (a
// node without peers still frees them), a budget at a time with activeMu
// released in between.
func (m *Manager) pruneResync() {
	m.dropRestored(m.now())
	for more := true; more; {
		m.activeMu.Lock()
		more = m.resync.prune(m.now())
		m.activeMu.Unlock()
	}
}

// heartbeatStream is one peer's schedule of passes over the re-sync set.
//
// A pass walks the set in its stable order (first tracked first) from a
// cursor the set keeps valid across changes, so it visits every entry once,
// whatever is tracked or removed meanwhile, and no entry can be skipped pass
// after pass. The sender interleaves the pass with fresh frames, which
// go on a lane of their own and never queue behind it (peerlanes.go), so a
// re-assertion never costs a fresh frame its place in the queue and delays
// it at most by the one request in flight, and only when that request
// carries the frame's workload. A pass that cannot finish within the
// interval carries on where it is; the next one starts when it ends, never
// piled up.
//
// A stream is used by its sender's heartbeat lane only.
type heartbeatStream struct {
	src      heartbeatSource
	interval time.Duration
	stats    *peerStats
	cursor   *resyncCursor
	active   bool
	paced    bool      // the pass is spread over passShare of the interval
	started  time.Time // of the pass under way, or of the last one
	next     time.Time // when the next pass may start
	size     int       // the set's size when the pass took its place
	visited  int       // entries the pass has sent so far
	passes   int       // passes this stream (this sender) has begun
	// The log of recent ends (endedlog.go) is owed to the peer until one
	// pass has reached the end of the set and then of the log: a pass
	// abandoned on the way leaves it owed to the next. inLog says the pass
	// under way is in the log, at logNext, up to logEnd. logAdded is the
	// log's end when the stream was created, with its target: a removal
	// numbered from it on was queued to the target as a fresh frame.
	logOwed                   bool
	inLog                     bool
	logTaken                  bool // the log's last slice was taken; the next call ends the pass, once it was sent
	logNext, logEnd, logAdded uint64
}

// passShare is the share of the interval a paced pass is spread over, in
// percent. A pass sent flat out at the start of each interval takes the
// CPU from the read loop, the ingress and the fresh frames for as long as
// it runs (at 100,000 workloads and 8 peers, most of every interval);
// spread over most of the interval, the same work is a steady trickle at
// its lowest rate, with the rest of the interval left for a pass that runs
// slow to finish within it.
const passShare = 80

// heartbeatSlice is the most re-assertions one request carries to a
// batching peer. It bounds how long a fresh frame for a workload in that
// request waits for it, and how long a take holds activeMu (about 4 µs for
// 64 entries), where the peer's 256-frame batch would bound neither well.
const heartbeatSlice = 64

func newHeartbeatStream(src heartbeatSource, interval time.Duration, stats *peerStats) *heartbeatStream {
	return &heartbeatStream{src: src, interval: interval, stats: stats, cursor: &resyncCursor{}, logOwed: true, logAdded: src.endedSeq()}
}

func (h *heartbeatStream) close() { h.src.closeCursor(h.cursor) }

// begin starts a pass at now. It takes no lock, so a new target's first
// pass, its backfill, starts while its sender is created: whatever is
// tracked after that reaches the new peer as a fresh frame, and the pass
// does not send it twice.
func (h *heartbeatStream) begin(now time.Time) {
	h.active, h.started, h.size, h.visited, h.inLog = true, now, 0, 0, false
	// The first pass is a new target's backfill: it goes as fast as the
	// peer takes it, so the peer's view is complete at once.
	h.paced = h.passes > 0
	h.passes++
	beginPass(h.cursor, h.src.generation())
	h.stats.passesStarted.Add(1)
	h.stats.passProgress.Store(0)
}

// nextLines returns the next re-assertions of the pass under way, at most
// maxFrames lines and maxBytes in all, and ends the pass when the set is
// exhausted, or, while the log of recent ends is owed to the peer, once
// the log is too.
func (h *heartbeatStream) nextLines(maxFrames, maxBytes int) reassertions {
	if h.inLog {
		// The log is paid only once its last slice was sent: that slice
		// was taken at the previous call, and a failed send would have
		// abandoned the pass (leaving the log owed) before this one.
		if h.logTaken {
			h.logOwed = false
			h.finish(time.Now())
			return reassertions{}
		}
		r, next, done := h.src.takeEnded(h.logNext, h.logEnd, h.logAdded, maxFrames, maxBytes)
		h.logNext, h.logTaken = next, done
		return r
	}
	r, size, done := h.src.take(h.cursor, maxFrames, maxBytes)
	if size > 0 {
		h.size = size
		h.stats.passSize.Store(uint64(size))
	}
	h.visited += len(r.lines)
	h.stats.passProgress.Add(uint64(len(r.lines)))
	if done {
		// The log's end is read when the pass reaches it, not when the
		// target was added: a terminal run the set dropped while the pass
		// was on its way to it is then in the log (spec 5.2); the removals
		// relayed since the target was added are left out (takeEnded). Its
		// start is whatever the log still holds.
		if h.logOwed {
			h.logEnd = h.src.endedSeq()
			h.inLog, h.logNext = h.logEnd > 0, 0
		}
		if !h.inLog {
			h.logOwed = false
			h.finish(time.Now())
		}
	}
	return r
}

// abandon ends the pass before the end of the set: the peer failed a
// re-assertion, and the rest would most likely fail too. Carrying on would
// turn a peer that refuses connections into a tight loop of failed dials,
// one per entry; the next pass, on the usual schedule, repeats them all.
func (h *heartbeatStream) abandon(now time.Time) {
	h.stats.passesAbandoned.Add(1)
	h.end(now)
}

// finish ends a pass that reached the end of the set.
func (h *heartbeatStream) finish(now time.Time) {
	h.stats.passesCompleted.Add(1)
	h.end(now)
}

// end schedules the next pass interval after this one started, or at once
// when this one overran its interval.
func (h *heartbeatStream) end(now time.Time) {
	h.active, h.inLog, h.logTaken = false, false, false
	h.next = h.started.Add(h.interval)
	if now.After(h.next) {
		h.stats.passesOverrun.Add(1)
		h.next = now
	}
}

// paceWait is how long the pass under way should wait before its next
// slice, so that it visits the set at an even pace over passShare percent
// of the interval.
func (h *heartbeatStream) paceWait(now time.Time) time.Duration {
	if !h.paced || h.size == 0 || h.inLog {
		// The log of recent ends goes as fast as the peer takes it, as a
		// backfill does: it follows one, or a pass that retries one.
		return 0
	}
	span := h.interval * passShare / 100
	due := h.started.Add(time.Duration(float64(span) * float64(h.visited) / float64(h.size)))
	return due.Sub(now)
}

// untilDue is how long until the next pass may start.
func (h *heartbeatStream) untilDue() time.Duration { return time.Until(h.next) }

// runHeartbeat is a peer sender's heartbeat lane: it runs the passes, each
// slice once the fresh lane is idle and with its workloads published as in
// flight (peerlanes.go), until the lane's context ends.
//
// Workloads marked when the peer's queue was full go first, ahead of the
// pass and of its schedule and pace, each as soon as it is due (rule 3).
func (s *peerSender) runHeartbeat() {
	h, ctx := s.heartbeat, s.hbCtx
	for {
		if ctx.Err() != nil {
			return
		}
		if s.lanes.marksReady() {
			s.recoverMarked()
			continue
		}
		if !h.active {
			if d := h.untilDue(); d > 0 {
				if !s.lanes.sleep(ctx, d) {
					return
				}
				continue
			}
			h.begin(time.Now())
			continue
		}
		if wait := h.paceWait(time.Now()); wait > 0 {
			if !s.lanes.sleep(ctx, wait) {
				return
			}
			continue
		}
		if !s.lanes.awaitFreshIdle(ctx) {
			return
		}
		if s.lanes.marksReady() {
			continue
		}
		frames, size := s.heartbeatBounds()
		r := s.lanes.takeInFlight(func() reassertions { return h.nextLines(frames, size) })
		ok := s.reassert(r.lines)
		s.lanes.endInFlight()
		if !ok && h.active {
			h.abandon(time.Now())
		}
	}
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
