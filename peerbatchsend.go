package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/wireframe"
)

// The sending side of batched delivery (spec 3.3.1): a peer whose answers
// advertise batches is sent its backlog, fresh frames and re-assertions
// alike, several frames to a request, within its bounds and this node's. A
// peer that never advertised, the stock daemon among them, is only ever sent
// single frames, byte for byte what it was always sent.

// peerBatchAnswerCap bounds how much of a batch answer is read: one result
// per element, each reason clipped to 256 bytes, for at most
// peerBatchMaxFrames elements, with room to spare.
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
	frames, size, ok := parseBatchAdvert(h)
	if !ok {
		s.advert.Store(0)
		return
	}
	frames, size = min(frames, peerBatchMaxFrames), min(size, peerBatchMaxBytes)
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
		return min(frames, heartbeatSlice), size
	}
	return 1, wireframe.MaxBytes
}

// gatherFresh returns first and the frames queued behind it, as many as one
// batch to this peer may hold; a frame that would overflow the batch is
// kept for the next one. It never waits.
func (s *peerSender) gatherFresh(first outboundFrame) []outboundFrame {
	maxFrames, maxBytes := s.batchBounds()
	frames, size := []outboundFrame{first}, len(first.line)+1
	for len(frames) < maxFrames {
		select {
		case f, ok := <-s.queue:
			if !ok {
				return frames // closed: run sees it on its next receive
			}
			s.dequeued(f)
			if size+len(f.line)+1 > maxBytes {
				s.carry = &f
				return frames
			}
			frames, size = append(frames, f), size+len(f.line)+1
		default:
			return frames
		}
	}
	return frames
}

// deliverFreshBatch delivers frames in order with bounded retries: each
// element the peer accepted is done, each it rejected is dropped, and the
// failed ones (with those it did not attempt after a failure) are retried,
// still in order. When the peer stops taking batches, or refuses this one
// as too large, what is left goes singly.
func (s *peerSender) deliverFreshBatch(frames []outboundFrame) {
	pending := frames
	var err error
	for attempt := 0; attempt < peerAttempts && len(pending) > 0; attempt++ {
		if attempt > 0 {
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(peerRetryBaseDelay << (attempt - 1)):
			}
			s.stats.retries.Add(1)
		}
		if !s.batching() || len(pending) == 1 {
			break
		}
		var results []peerBatchResult
		results, err = s.postBatch(s.ctx, linesOf(pending))
		for errors.Is(err, errDeferred) {
			// The peer asked to wait: not a failed attempt. The same
			// frames go again, in order, once the wait is over; an answer
			// then without the advertisement sends them singly.
			results, err = s.postBatch(s.ctx, linesOf(pending))
		}
		switch {
		case errors.Is(err, errNotBatching), errors.Is(err, errBatchTooLarge):
			s.deliverSingly(pending)
			return
		case errors.Is(err, errPermanent):
			s.dropFresh(pending, err)
			return
		case err != nil:
			s.stats.failedAttempts.Add(1)
			if s.ctx.Err() != nil {
				return
			}
			continue
		}
		pending = s.settle(pending, results)
	}
	if len(pending) > 0 && s.ctx.Err() == nil {
		if err == nil {
			s.deliverSingly(pending) // the peer stopped taking batches
			return
		}
		s.dropFresh(pending, fmt.Errorf("after %d attempts: %w", peerAttempts, err))
	}
}

// settle applies a batch answer: it counts what was delivered, drops what
// was rejected, and returns what is to be retried, in order.
func (s *peerSender) settle(sent []outboundFrame, results []peerBatchResult) (retry []outboundFrame) {
	for i, r := range results {
		f := sent[i]
		switch {
		case r.Status == http.StatusOK:
			s.delivered(f)
		case retryableAnswer(r.Status, r.Reason):
			s.stats.failedAttempts.Add(1)
			retry = append(retry, f)
		default:
			s.dropFresh([]outboundFrame{f}, fmt.Errorf("%w: status %d: %s", errPermanent, r.Status, r.Reason))
		}
	}
	return retry
}

// deliverSingly delivers frames one request each, in order.
func (s *peerSender) deliverSingly(frames []outboundFrame) {
	for _, f := range frames {
		if s.ctx.Err() != nil {
			return
		}
		s.deliverOne(f)
	}
}

// dropFresh gives frames up for this peer, with a rate-limited warning.
func (s *peerSender) dropFresh(frames []outboundFrame, err error) {
	s.stats.dropped.Add(uint64(len(frames)))
	s.failDrops.note(s.log, "peer delivery failed, frames dropped for this peer", "frames", len(frames), "reason", httpguard.ClipReason(err.Error()))
}

// postBatch makes one batch attempt and returns its per-element results.
// A transport error, a retryable status for the whole batch, or an answer
// that does not hold one result per element is an error worth retrying.
func (s *peerSender) postBatch(ctx context.Context, lines [][]byte) ([]peerBatchResult, error) {
	s.stats.batchesSent.Add(1)
	s.stats.batchFramesSent.Add(uint64(len(lines)))
	open := func() io.Reader { return newBatchBody(lines) }
	status, answer, err := s.exchange(ctx, open, batchBodySize(lines), peerBatchContentType, peerBatchAnswerCap)
	switch {
	case err != nil:
		return nil, err
	case !s.batching():
		return nil, errNotBatching
	case status == http.StatusRequestEntityTooLarge:
		return nil, errBatchTooLarge
	case retryableStatus(status):
		return nil, fmt.Errorf("batch: status %d", status)
	case status != http.StatusOK:
		return nil, fmt.Errorf("%w: batch: status %d", errPermanent, status)
	}
	var a peerBatchAnswer
	if err := json.Unmarshal(answer, &a); err != nil || len(a.Results) != len(lines) {
		return nil, fmt.Errorf("batch answer holds %d results for %d frames", len(a.Results), len(lines))
	}
	return a.Results, nil
}

// reassertBatch sends re-assertions in one batch, once: the next pass
// repairs what this one could not deliver. It reports whether the peer
// took the batch; a rejected element (a 4xx) does not count against it.
func (s *peerSender) reassertBatch(lines [][]byte) bool {
	results, err := s.postBatch(s.hbCtx, lines)
	for errors.Is(err, errDeferred) {
		// The peer asked to wait: the same slice goes again once the wait
		// is over, still published as in flight (peerlanes.go).
		results, err = s.postBatch(s.hbCtx, lines)
	}
	if err != nil {
		if s.hbCtx.Err() == nil {
			s.stats.reassertFailures.Add(uint64(len(lines)))
			s.hbErrors.note(s.log, "peer re-assertions failed; the next pass repeats them", "frames", len(lines), "reason", httpguard.ClipReason(err.Error()))
		}
		return false
	}
	ok := true
	for _, r := range results {
		switch {
		case r.Status == http.StatusOK:
			s.stats.reasserted.Add(1)
		case retryableAnswer(r.Status, r.Reason):
			s.stats.reassertFailures.Add(1)
			ok = false
		default:
			s.stats.reassertFailures.Add(1)
		}
	}
	return ok
}

// batchBody is a batch's NDJSON body, read straight from its lines with a
// newline after each. The lines are never modified once encoded (the
// re-sync set's and the queue's alike), so the body needs no copy of them:
// copied into one buffer, a heartbeat batch was 25 KB or more of garbage
// per request, hundreds of requests a second at a large set, and the
// garbage collector's cycles then took CPU from the fresh frames.
type batchBody struct {
	lines [][]byte
	line  int // the line being read
	off   int // how much of it was read; len(line) when only its newline is left
}

func newBatchBody(lines [][]byte) *batchBody { return &batchBody{lines: lines} }

func (b *batchBody) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && b.line < len(b.lines) {
		l := b.lines[b.line]
		if b.off < len(l) {
			c := copy(p[n:], l[b.off:])
			b.off += c
			n += c
			continue
		}
		p[n] = '\n'
		n++
		b.line, b.off = b.line+1, 0
	}
	if b.line == len(b.lines) {
		return n, io.EOF
	}
	return n, nil
}

// batchBodySize is the length of a batch's body: each line and a newline.
func batchBodySize(lines [][]byte) int64 {
	n := int64(len(lines))
	for _, l := range lines {
		n += int64(len(l))
	}
	return n
}

func linesOf(frames []outboundFrame) [][]byte {
	out := make([][]byte, len(frames))
	for i, f := range frames {
		out[i] = f.line
	}
	return out
}
