package peersend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// The sending side of batched delivery (spec 3.3.1): a peer whose answers
// advertise batches is sent its backlog, fresh frames and re-assertions
// alike, several frames to a request, within its bounds and this node's. A
// peer that never advertised, the stock daemon among them, is only ever sent
// single frames, byte for byte what it was always sent.

// peerBatchAnswerCap bounds how much of a batch answer is read: one result
// per element, each reason clipped to 256 bytes, for at most
// peerwire.BatchMaxFrames elements, with room to spare.
const peerBatchAnswerCap = 1 << 20

var (
	// errNotBatching is a batch answer without the advertisement: the peer
	// does not know batches (it was replaced by a stock daemon), so none of
	// its answer can be trusted and the frames are resent singly.
	errNotBatching = errors.New("peer answered a batch without advertising batches")
	// errBatchTooLarge is a 413 to a batch: the batch was too big, not its
	// frames, which are resent singly.
	errBatchTooLarge = errors.New("peer refused the batch as too large")
)

// noteAdvert records a peer's advertisement from one of its answers: the
// bounds a batch to it may have, the smaller of its and this node's, or
// none when the answer carried no valid advertisement. Either lane calls it.
func (s *peerSender) noteAdvert(h string) {
	frames, size, ok := peerwire.ParseBatchAdvert(h)
	if !ok {
		s.advert.Store(0)
		return
	}
	frames, size = min(frames, peerwire.BatchMaxFrames), min(size, peerwire.BatchMaxBytes)
	s.advert.Store(uint64(frames)<<32 | uint64(size))
}

// batchBounds is the most frames and bytes a batch to this peer may have,
// as its last answer advertised; both 0 when it takes no batches.
func (s *peerSender) batchBounds() (frames, size int) {
	a := s.advert.Load()
	return int(a >> 32), int(a & (1<<32 - 1))
}

// batching reports whether the peer's last answer advertised batches.
func (s *peerSender) batching() bool {
	frames, _ := s.batchBounds()
	return frames > 1
}

// heartbeatBounds is how many re-assertions, and how many bytes of them, go
// in one request to this peer: a heartbeat slice when it takes batches,
// else one.
func (s *peerSender) heartbeatBounds() (frames, size int) {
	if frames, size := s.batchBounds(); frames > 1 {
		return min(frames, HeartbeatSlice), size
	}
	return 1, wireframe.MaxBytes
}

// sendBatch sends entries in one batch and says how many of them, from
// the first, are settled: taken, or refused for good and skipped. It
// stops at the first element the peer failed in a way a retry may change:
// that one and those after it stay above the mark. When the peer stops
// taking batches, or refuses this one as too large or as a whole, none is
// settled and the next turn sends singly, so a bad element is found alone.
// A batch that failed as a whole with an answer or a timeout is whole: the
// next turn halves it (headofline.go).
func (s *peerSender) sendBatch(lines []statetable.Line) sendResult {
	segs := s.segments(lines)
	results, err := s.postBatch(s.ctx, segs, len(lines))
	for errors.Is(err, errDeferred) {
		// The peer asked to wait: not a failed attempt. The same entries
		// go again, in order, once the wait is over.
		results, err = s.postBatch(s.ctx, segs, len(lines))
	}
	switch {
	case errors.Is(err, errNotBatching):
		return sendResult{} // its advertisement is gone: the next turn sends singly
	case errors.Is(err, errBatchTooLarge), errors.Is(err, errPermanent):
		s.singly = true
		return sendResult{}
	case err != nil:
		return sendResult{err: err, whole: answeredOrTimedOut(err)}
	}
	for i, r := range results {
		switch {
		case r.Status == http.StatusOK:
		case peerwire.RetryableAnswer(r.Status, r.Reason):
			return sendResult{settled: i, err: fmt.Errorf("batch element %d: status %d", i, r.Status)}
		default:
			s.refused(1, fmt.Errorf("%w: status %d: %s", errPermanent, r.Status, r.Reason))
		}
	}
	return sendResult{settled: len(results)}
}

// segments is a batch body's pieces for entries as this sender sends them
// (wire): each entry's line in its pieces, then a newline.
func (s *peerSender) segments(lines []statetable.Line) [][]byte {
	if s.restating {
		out := make([][]byte, len(lines))
		for i, l := range lines {
			out[i] = l.Reassertion()
		}
		return lineSegments(out)
	}
	return freshSegments(lines)
}

// freshSegments is a batch body's pieces for entries sent fresh: each
// entry's line in its pieces, then a newline.
func freshSegments(lines []statetable.Line) [][]byte {
	segs := make([][]byte, 0, 3*len(lines))
	for _, l := range lines {
		head, tail := l.Fresh()
		segs = append(segs, head)
		if len(tail) > 0 {
			segs = append(segs, tail)
		}
		segs = append(segs, newline)
	}
	return segs
}

// lineSegments is a batch body's pieces for re-assertions.
func lineSegments(lines [][]byte) [][]byte {
	segs := make([][]byte, 0, 2*len(lines))
	for _, l := range lines {
		segs = append(segs, l, newline)
	}
	return segs
}

var newline = []byte{'\n'}

// postBatch makes one batch attempt and returns its per-element results.
// A transport error, a retryable status for the whole batch, or an answer
// that does not hold one result per element is an error worth retrying.
func (s *peerSender) postBatch(ctx context.Context, segs [][]byte, frames int) ([]peerwire.BatchResult, error) {
	s.stats.BatchesSent.Add(1)
	s.stats.BatchFramesSent.Add(uint64(frames))
	open := func() io.Reader { return newBatchBody(segs) }
	status, answer, err := s.exchange(ctx, open, batchBodySize(segs), peerwire.BatchContentType, peerBatchAnswerCap)
	switch {
	case err != nil:
		return nil, err
	case !s.batching():
		return nil, errNotBatching
	case status == http.StatusRequestEntityTooLarge:
		return nil, errBatchTooLarge
	case peerwire.RetryableStatus(status):
		return nil, fmt.Errorf("%w: batch: status %d", errAnswered, status)
	case status != http.StatusOK:
		return nil, fmt.Errorf("%w: batch: status %d", errPermanent, status)
	}
	var a peerwire.BatchAnswer
	if err := json.Unmarshal(answer, &a); err != nil || len(a.Results) != frames {
		return nil, fmt.Errorf("%w: batch answer holds %d results for %d frames", errAnswered, len(a.Results), frames)
	}
	return a.Results, nil
}

// errAnswered marks a batch the peer answered as a whole with a failure a
// retry may change: its answer names none of the frames.
var errAnswered = errors.New("peer failed the batch")

// answeredOrTimedOut reports whether a batch failed as a whole with an
// answer or a timeout, either of which one of its frames may cause, rather
// than for want of a connection, which none does.
func answeredOrTimedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, errAnswered) || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// reassertBatch sends re-assertions in one batch, once: the next pass
// repairs what this one could not deliver. It returns how many the peer
// took, and false when the pass should end (reassert): the batch failed
// as a whole, or two elements in a row failed in a way that may be about
// the peer. The elements a peer did not attempt after one that failed (the
// peer port's rule: peerwire.RunBatch answers them 503, not attempted)
// go again at once in a batch of their own, so one frame the peer keeps
// failing costs the pass that frame only.
func (s *peerSender) reassertBatch(lines [][]byte) (accepted int, ok bool) {
	for len(lines) > 0 {
		var again [][]byte
		results, err := s.postReassertions(lines)
		if err != nil {
			s.reassertFailed(len(lines), err)
			return accepted, false
		}
		for i, r := range results {
			switch {
			case r.Status == http.StatusOK:
				s.stats.Reasserted.Add(1)
				s.hb.failedLast = false
				accepted++
			case r.Status == http.StatusServiceUnavailable && r.Reason == peerwire.ReasonNotAttempted:
				again = append(again, lines[i])
			case peerwire.RetryableAnswer(r.Status, r.Reason):
				s.reassertFailed(1, fmt.Errorf("batch element: status %d: %s", r.Status, r.Reason))
				if s.hb.failedLast {
					return accepted, false
				}
				s.hb.failedLast = true
			default:
				s.reassertFailed(1, fmt.Errorf("batch element: status %d: %s", r.Status, r.Reason))
				s.hb.failedLast = false
			}
		}
		if len(again) == len(lines) {
			// Not one attempted: no answer about any of them.
			s.reassertFailed(len(lines), errors.New("batch: no element attempted"))
			return accepted, false
		}
		lines = again
	}
	return accepted, true
}

// postReassertions posts re-assertions in one batch, again while the peer
// asks to wait.
func (s *peerSender) postReassertions(lines [][]byte) ([]peerwire.BatchResult, error) {
	segs := lineSegments(lines)
	results, err := s.postBatch(s.ctx, segs, len(lines))
	for errors.Is(err, errDeferred) {
		// The peer asked to wait: the same slice goes again once the wait
		// is over.
		results, err = s.postBatch(s.ctx, segs, len(lines))
	}
	return results, err
}

// batchBody is a batch's NDJSON body, read straight from its pieces: the
// entries' lines are never modified once stored, so the body needs no copy
// of them. Copied into one buffer, a heartbeat batch was 25 KB or more of
// garbage per request, hundreds of requests a second at a large table.
type batchBody struct {
	segs [][]byte
	seg  int // the piece being read
	off  int // how much of it was read
}

func newBatchBody(segs [][]byte) *batchBody { return &batchBody{segs: segs} }

func (b *batchBody) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && b.seg < len(b.segs) {
		c := copy(p[n:], b.segs[b.seg][b.off:])
		n += c
		b.off += c
		if b.off == len(b.segs[b.seg]) {
			b.seg, b.off = b.seg+1, 0
		}
	}
	if b.seg == len(b.segs) {
		return n, io.EOF
	}
	return n, nil
}

// batchBodySize is the length of a batch's body.
func batchBodySize(segs [][]byte) int64 {
	var n int64
	for _, s := range segs {
		n += int64(len(s))
	}
	return n
}
