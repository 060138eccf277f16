package peersend

import (
	"time"

	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/statetable"
)

// No head-of-line block (spec 5.1, "A frame a peer keeps failing"). A
// sender delivers its peer's backlog in version order and moves the mark
// only past what the peer settled, so a frame the peer fails every time
// (a 5xx, a timeout) while it takes every other would hold back all that
// follows it, for good, and its heartbeat with it. The stock worker gives
// each frame three attempts and drops it. Here:
//
//   - a batch that fails as a whole (an answer or a timeout, which names
//     none of its frames) is halved at the next request, and a request
//     that succeeds doubles it back, until the frame that fails goes alone;
//   - the frame at the head of the backlog that the peer fails gets
//     FrameMaxTries tries in a row, with the usual backoff between them;
//   - then the next frame goes alone (the probe). If the peer settles it,
//     it takes others: the failed frame is skipped (the mark moves past it,
//     counted in Stats.Skipped, logged once per burst), and its run, while
//     live, reaches the peer with the next heartbeat pass. If the peer
//     fails the probe too, it fails everything: nothing is skipped, the
//     mark stays and the sender backs off as it always did, giving the
//     head one more try before each probe.
//   - A spent frame alone above the mark has nothing behind it to probe
//     with: it goes again on its backoff, and meanwhile the heartbeat goes
//     on (a re-assertion cannot overtake a newer state when the one entry
//     above the mark is this frame, at its latest state). A re-assertion
//     the peer takes is then the probe.

// FrameMaxTries is how many times in a row the peer may fail the frame at
// the head of its backlog before the sender looks past it: the stock
// worker's three attempts.
const FrameMaxTries = 3

// stuckFrame is the entry at the head of the backlog that the peer
// failed, by its version, and how many times in a row. An entry that
// changes gets a new version and a fresh count.
type stuckFrame struct {
	version uint64
	tries   int
	// retryAt is when a spent frame alone above the mark goes again.
	retryAt time.Time
}

func (f *stuckFrame) spent() bool { return f.tries >= FrameMaxTries }

// spentOn reports whether the entry of version v has had its tries.
func (f *stuckFrame) spentOn(v uint64) bool { return f.version == v && f.spent() }

// failedAt counts a failed attempt at the entry of version v, the first
// the peer did not settle. Until its tries are spent the sender backs off
// before the next; once they are, the next turn looks past it at once.
func (s *peerSender) failedAt(v uint64, err error) {
	if s.stuck.version != v {
		s.stuck = stuckFrame{version: v}
	}
	s.stuck.tries++
	if !s.stuck.spent() {
		s.failed(err)
		return
	}
	s.countFailure(err)
	s.stuck.retryAt = time.Now().Add(s.nextBackoff())
}

// narrow halves the next catch-up request after a batch of n frames
// failed as a whole.
func (s *peerSender) narrow(n int, err error) {
	s.split = max(1, n/2)
	if s.split == 1 {
		// The frames go alone from now on: each failure is its frame's.
		s.failed(err)
		return
	}
	s.countFailure(err)
}

// widen doubles the catch-up request back after one that succeeded.
func (s *peerSender) widen() {
	if s.split > 0 {
		if s.split *= 2; s.split >= peerwire.BatchMaxFrames {
			s.split = 0
		}
	}
}

// pastSpent handles a backlog whose head has had its tries: it probes
// with the frame behind it, or retries a lone one on its backoff. It
// reports whether it did anything.
func (s *peerSender) pastSpent() bool {
	taken := s.table.TakeAbove(s.member, 2, maxInt)
	if len(taken.Lines) == 0 || taken.Versions[0] != s.stuck.version {
		// The frame changed since the turn began (a newer state has a new
		// version, and a fresh count): the next turn starts over.
		return true
	}
	if len(taken.Lines) == 1 {
		return s.retryLone(taken)
	}
	s.stuck.retryAt = time.Time{}
	r := s.sendOne(taken.Lines[1])
	if r.settled == 1 {
		s.skip(taken.Versions[0], taken.Versions[1])
		s.stats.Succeeded.Add(1)
		return true
	}
	// The peer failed the probe too: it fails everything. The mark stays;
	// the head has one more try before the next probe.
	s.stuck.tries = FrameMaxTries - 1
	s.failed(r.err)
	return true
}

// retryLone sends a spent frame alone above the mark again once its
// backoff is over; until then it reports false, so the heartbeat may go.
func (s *peerSender) retryLone(taken statetable.Taken) bool {
	if time.Now().Before(s.stuck.retryAt) {
		return false
	}
	if r := s.sendOne(taken.Lines[0]); r.settled == 0 {
		s.countFailure(r.err)
		s.stuck.retryAt = time.Now().Add(s.nextBackoff())
		return true
	}
	s.table.Ack(s.member, taken.Versions[0])
	s.stats.Succeeded.Add(1)
	s.backoff, s.stuck, s.split = 0, stuckFrame{}, 0
	return true
}

// skipLoneSpent skips a spent frame alone above the mark: the peer has
// just taken a re-assertion, so it takes others.
func (s *peerSender) skipLoneSpent() {
	if !s.stuck.spent() {
		return
	}
	taken := s.table.TakeAbove(s.member, 2, maxInt)
	if len(taken.Lines) == 1 && taken.Versions[0] == s.stuck.version {
		s.skip(taken.Versions[0], taken.Versions[0])
	}
}

// skip gives up the entry of version head for this peer and moves its
// mark to upTo: what the peer took behind it, or the entry itself.
func (s *peerSender) skip(head, upTo uint64) {
	s.stats.Skipped.Add(1)
	s.skippedLog.NoteCounted(s.log, "skipped", "peer kept failing an entry while it took others; skipped for this peer, the heartbeat re-asserts it while it is live",
		"tries", FrameMaxTries, "version", head)
	s.table.Ack(s.member, upTo)
	s.backoff, s.stuck, s.split = 0, stuckFrame{}, 0
}
