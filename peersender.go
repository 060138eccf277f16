package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/wireframe"
)

// peerStats counts one peer's deliveries and heartbeat passes, for the
// metrics.
type peerStats struct {
	peer                                                      string
	succeeded, failedAttempts, retries, dropped, queueDropped atomic.Uint64
	latency                                                   *promtext.Histogram

	passesStarted, passesCompleted, passesOverrun atomic.Uint64
	passesAbandoned                               atomic.Uint64 // ended at a failed re-assertion
	reasserted, reassertFailures                  atomic.Uint64 // re-assertions delivered, and not
	passProgress, passSize                        atomic.Uint64 // entries visited in the pass under way, of the set's size at its start
	batchesSent, batchFramesSent                  atomic.Uint64

	// Answers whose Retry-After was honoured, and the time they held
	// the peer's requests (peerretryafter.go).
	retryAfterWaits, retryAfterHeldNanos atomic.Uint64

	// overflowMarked counts frames that found the queue full (or their
	// workload marked) and marked their workload instead of being
	// dropped; overflowRecovered the frames sent from marks that the peer
	// took (overflow.go).
	overflowMarked, overflowRecovered atomic.Uint64
}

// peerSender delivers one peer's fresh frames in order on its fresh lane,
// and its heartbeat passes on its heartbeat lane, each lane on a pooled
// connection of its own (peerlanes.go says how the two keep their order).
type peerSender struct {
	target    peerTarget
	stats     *peerStats
	log       *slog.Logger
	queue     chan outboundFrame
	heartbeat *heartbeatStream // used by the heartbeat lane only
	lanes     *laneOrder
	client    *http.Client
	url       string
	ctx       context.Context // the sender's: ends at stop
	cancel    context.CancelFunc
	hbCtx     context.Context // the heartbeat lane's: also ends when the fresh lane does
	hbCancel  context.CancelFunc
	drops     dropLogger // queue-full drops, logged at most once per dropLogInterval
	failDrops dropLogger // frames of a batch given up, likewise
	hbErrors  dropLogger // failed re-assertions, likewise

	// hold is what the peer asked the lanes to wait for (Retry-After);
	// every request passes it first (exchange).
	hold          peerHold
	retryAfterLog dropLogger // the deferrals, logged at most once per dropLogInterval

	// overflow logs the bursts of marked workloads, each when it ends.
	overflow overflowLog

	// advert is what the peer's last answer on either lane advertised
	// (noteAdvert): the most frames a batch to it may have in the high 32
	// bits and the most bytes in the low 32, 0 when it takes no batches.
	// One word, so that a lane never reads the frames of one answer with
	// the bytes of another.
	advert atomic.Uint64
	// carry is a fresh frame taken from the queue that did not fit in the
	// batch being gathered; it goes first in the next one. Only the fresh
	// lane uses it.
	carry *outboundFrame

	// queueBytes is the bytes of the frames in queue: added by offer
	// before a frame is sent on it, taken back by the fresh lane when it
	// receives one (dequeued). queueMaxBytes bounds it (peerQueueMaxBytes;
	// a test may lower it before the first offer).
	queueBytes    atomic.Int64
	queueMaxBytes int64
}

func newPeerSender(t peerTarget, stats *peerStats, dialTLS func(context.Context, string, string) (net.Conn, error), hb *heartbeatStream, lanes *laneOrder, log *slog.Logger) *peerSender {
	ctx, cancel := context.WithCancel(context.Background())
	hbCtx, hbCancel := context.WithCancel(ctx)
	transport := &http.Transport{
		DialTLSContext:      dialTLS,
		MaxIdleConns:        peerMaxIdleConns,
		MaxIdleConnsPerHost: peerMaxIdleConns,
		IdleConnTimeout:     peerClientIdleTimeout,
		Protocols:           httpguard.HTTP1Only,
	}
	return &peerSender{
		target:    t,
		stats:     stats,
		log:       log.With("peer", t.name, "principal", t.principal),
		queue:     make(chan outboundFrame, peerQueueSize),
		heartbeat: hb,
		lanes:     lanes,
		client:    &http.Client{Transport: transport},
		// url.URL escapes an IPv6 zone ("%" -> "%25"); concatenation would
		// leave an invalid escape and every request to the peer would fail.
		url:      (&url.URL{Scheme: "https", Host: t.addrs[0], Path: peerEventsPath}).String(),
		ctx:      ctx,
		cancel:   cancel,
		hbCtx:    hbCtx,
		hbCancel: hbCancel,

		queueMaxBytes: peerQueueMaxBytes,
	}
}

// dialInOrder dials the candidate addresses in order and returns the first
// connection that succeeds. The peer is authenticated by its pin, not by the
// name in the URL, so any of its addresses will do.
func dialInOrder(addrs []string) func(ctx context.Context, network, _ string) (net.Conn, error) {
	d := &net.Dialer{Timeout: peerDialTimeout, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		var errs []error
		for _, a := range addrs {
			c, err := d.DialContext(ctx, network, a)
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
		return nil, errors.Join(errs...)
	}
}

// offer hands a frame to the sender without blocking. A frame that finds
// the queue full (in frames or in bytes, queueFull), or its workload
// already marked, marks its workload for this peer instead (overflow.go):
// its latest state follows on the heartbeat lane. Called by the
// dispatcher under broadcaster.mu.
func (s *peerSender) offer(f outboundFrame) {
	if s.lanes.marks.holds(f.ref) || !s.tryQueue(f) {
		removal := f.method == wireframe.MethodRemove
		s.markOverflow(f.ref, removal, !removal, 1, f.queuedAt)
	}
}

// tryQueue puts f in the peer's queue unless the queue is full, and
// reports whether it did: the one place that decides whether this peer's
// queue is full.
func (s *peerSender) tryQueue(f outboundFrame) bool {
	s.lanes.queued() // before the send: the fresh lane may settle it at once
	if !s.queueFull(f) {
		// Counted before the send: the fresh lane may take it at once.
		n := int64(len(f.line))
		s.queueBytes.Add(n)
		select {
		case s.queue <- f:
			s.lanes.accepted()
			return true
		default: // not reached: only the dispatcher sends, after queueFull
			s.queueBytes.Add(-n)
		}
	}
	s.lanes.withdrawn()
	return false
}

// markOverflow marks ref for this peer, standing for frames frames (the
// latest a removal or a state), to go once the frames queued so far have
// settled. With the marks at their bound the frames are dropped, as every
// overflow was before marks: the heartbeat's next pass repairs a
// lifecycle state, a removal is lost. Called under broadcaster.mu.
func (s *peerSender) markOverflow(ref wireframe.WorkloadRef, removal, state bool, frames uint64, at time.Time) {
	marks := s.lanes.marks
	ok, began := marks.add(ref, removal, state, frames, s.lanes.sent.Load(), at)
	if !ok {
		s.stats.queueDropped.Add(frames)
		s.drops.note(s.log, "peer queue full and its overflow marks at their bound, dropping the newest frame for this peer", "limit", marks.limit)
		return
	}
	s.stats.overflowMarked.Add(frames)
	if began {
		s.overflow.began(s.log, "peer queue full: marking workloads, their latest state goes on the heartbeat lane",
			"queue", peerQueueSize, "limit", marks.limit)
	}
	if s.lanes.marksReady() {
		s.lanes.wake()
	}
}

// recoverMarked sends the marked workloads that are due, a heartbeat
// request's worth (rule 3, peerlanes.go): each one's removal and latest
// state, taken in one hold with the workloads published as in flight.
// They are delivered as fresh frames are, with retries; a burst's line is
// written when its last mark has been sent and the set is empty.
func (s *peerSender) recoverMarked() {
	maxFrames, _ := s.heartbeatBounds()
	var taken []overflowMark
	var states [][][]byte
	s.lanes.takeInFlight(func() reassertions {
		taken = s.lanes.marks.takeReady(s.lanes.settledCount.Load(), maxFrames)
		refs := make([]wireframe.WorkloadRef, len(taken))
		for i := range taken {
			refs[i] = taken[i].ref
		}
		states = s.heartbeat.src.latestLines(refs)
		return reassertions{refs: refs}
	})
	frames, lost := recoveryFrames(taken, states)
	if lost > 0 {
		s.stats.queueDropped.Add(lost)
	}
	before := s.stats.overflowRecovered.Load()
	s.deliverMarked(frames)
	s.lanes.endInFlight()
	if s.ctx.Err() != nil {
		return // stopped: the marks are abandoned with the queue
	}
	recovered := s.stats.overflowRecovered.Load() - before
	if sum, ended := s.lanes.marks.settle(len(taken), recovered, uint64(len(frames))-recovered, lost); ended {
		s.overflow.ended(s.log, sum)
	}
}

// recoveryFrames are the frames that recover the marks taken, given the
// lines the re-sync set holds for each: its removal, then its runs' latest
// states. A mark for a state the set does not hold has nothing to send:
// the set did not track the workload (it was full, --max-live-workloads,
// and the frame was relayed once), or its terminal entry aged out. Those
// are counted lost.
func recoveryFrames(taken []overflowMark, states [][][]byte) (frames []outboundFrame, lost uint64) {
	for i, m := range taken {
		if m.removal {
			frames = append(frames, outboundFrame{method: wireframe.MethodRemove, line: removalLine(m.ref), ref: m.ref, queuedAt: m.at, recovery: true})
		}
		if !m.state {
			continue
		}
		if len(states[i]) == 0 && !m.removal {
			lost++
		}
		for _, line := range states[i] {
			frames = append(frames, outboundFrame{method: "re-assertion", line: line, ref: m.ref, queuedAt: m.at, recovery: true})
		}
	}
	return frames, lost
}

// deliverMarked delivers recovered frames in order, in batches within the
// peer's bounds when it takes them, with the fresh frames' retries.
func (s *peerSender) deliverMarked(frames []outboundFrame) {
	for len(frames) > 0 && s.ctx.Err() == nil {
		maxFrames, maxBytes := s.batchBounds()
		n, size := 1, len(frames[0].line)+1
		for n < len(frames) && n < maxFrames && size+len(frames[n].line)+1 <= maxBytes {
			size += len(frames[n].line) + 1
			n++
		}
		if n == 1 {
			s.deliverOne(frames[0])
		} else {
			s.deliverFreshBatch(frames[:n])
		}
		frames = frames[n:]
	}
}

// delivered counts a frame the peer took.
func (s *peerSender) delivered(f outboundFrame) {
	s.stats.succeeded.Add(1)
	s.stats.latency.Observe(time.Since(f.queuedAt))
	if f.recovery {
		s.stats.overflowRecovered.Add(1)
	}
}

// queueFull reports whether the peer's queue cannot take f: it holds
// peerQueueSize frames, or f would take its bytes past queueMaxBytes. A
// queue that holds no bytes takes any frame, so a frame larger than the
// byte bound is not refused by every queue for good. Only the dispatcher
// adds to the queue (under broadcaster.mu), so the room it finds here is
// still there for its send.
func (s *peerSender) queueFull(f outboundFrame) bool {
	if len(s.queue) == cap(s.queue) {
		return true
	}
	held := s.queueBytes.Load()
	return held > 0 && held+int64(len(f.line)) > s.queueMaxBytes
}

// dequeued takes a frame the fresh lane received out of the queue's bytes.
func (s *peerSender) dequeued(f outboundFrame) { s.queueBytes.Add(-int64(len(f.line))) }

func (s *peerSender) stop() {
	s.cancel()
}

// run is the fresh lane: it delivers the queue until it is closed or the
// sender is stopped. It starts the heartbeat lane and stops it when it
// ends; the lane's first pass, begun when the sender was created, is the
// new target's backfill.
func (s *peerSender) run() {
	defer s.client.CloseIdleConnections()
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		defer s.heartbeat.close()
		s.runHeartbeat()
	}()
	defer func() { s.hbCancel(); <-hbDone }()
	for {
		if f := s.carry; f != nil {
			s.carry = nil
			s.deliverFresh(*f)
			continue
		}
		select {
		case <-s.ctx.Done():
			return
		case f, ok := <-s.queue:
			if !ok {
				s.awaitMarksSent()
				return
			}
			s.dequeued(f)
			s.deliverFresh(f)
		}
	}
}

// awaitMarksSent waits, once the queue is closed and delivered, until the
// heartbeat lane has sent the marked workloads, or the sender is stopped:
// at shutdown they get the drain timeout as the queue does.
func (s *peerSender) awaitMarksSent() {
	marks := s.lanes.marks
	for marks.busy() {
		select {
		case <-marks.drained:
		case <-s.ctx.Done():
			return
		}
	}
}

// deliverFresh delivers a fresh frame, with the frames queued behind it in
// one batch when the peer takes batches, once no heartbeat request in
// flight names one of their workloads.
func (s *peerSender) deliverFresh(f outboundFrame) {
	frames := []outboundFrame{f}
	if s.batching() {
		frames = s.gatherFresh(f)
	}
	defer s.lanes.settled(len(frames))
	if !s.lanes.awaitNoConflict(s.ctx, frames) {
		return
	}
	if len(frames) > 1 {
		s.deliverFreshBatch(frames)
		return
	}
	s.deliverOne(f)
}

// deliverOne delivers one fresh frame with retries; a frame that cannot be
// delivered is dropped for this peer with a warning.
func (s *peerSender) deliverOne(f outboundFrame) {
	if err := s.deliver(f); err != nil && s.ctx.Err() == nil {
		s.stats.dropped.Add(1)
		s.log.Warn("peer delivery failed, frame dropped for this peer", "method", f.method, "reason", err)
	}
}

// reassert sends re-assertions once each, without retries: the next pass
// repairs what this one could not deliver. It reports whether the peer
// took them.
func (s *peerSender) reassert(lines [][]byte) bool {
	if len(lines) > 1 {
		return s.reassertBatch(lines)
	}
	for _, l := range lines {
		err := s.post(s.hbCtx, outboundFrame{line: l})
		for errors.Is(err, errDeferred) {
			// The peer asked to wait: the same re-assertion goes again
			// once the wait is over (post waits for it).
			err = s.post(s.hbCtx, outboundFrame{line: l})
		}
		if err != nil {
			if s.hbCtx.Err() == nil {
				s.stats.reassertFailures.Add(1)
				s.hbErrors.note(s.log, "peer re-assertion failed; the next pass repeats it", "reason", httpguard.ClipReason(err.Error()))
			}
			// A rejection is about this entry (a peer refuses it as too
			// large, say): the rest of the pass goes on. Any other failure
			// is about the peer.
			return errors.Is(err, errPermanent)
		}
		s.stats.reasserted.Add(1)
	}
	return true
}

// errPermanent marks a peer answer that a retry cannot change.
var errPermanent = errors.New("rejected by peer")

// deliver sends one frame with bounded exponential-backoff retries. An
// answer that asks the sender to wait (errDeferred) is not an attempt: the
// frame waits as long as the peer asks, each wait capped, while the queue
// behind it is bounded as always.
func (s *peerSender) deliver(f outboundFrame) error {
	var err error
	for attempt := 0; attempt < peerAttempts; attempt++ {
		if attempt > 0 {
			select {
			case <-s.ctx.Done():
				return s.ctx.Err()
			case <-time.After(peerRetryBaseDelay << (attempt - 1)):
			}
			s.stats.retries.Add(1)
		}
		err = s.post(s.ctx, f)
		for errors.Is(err, errDeferred) {
			// The peer asked to wait: that is not a failed attempt. The
			// frame goes again, in its place, once the wait is over (post
			// waits for it, or for the sender's stop).
			err = s.post(s.ctx, f)
		}
		if err == nil {
			s.delivered(f)
			s.log.Debug("delivered to peer", "method", f.method)
			return nil
		}
		s.stats.failedAttempts.Add(1)
		if errors.Is(err, errPermanent) || s.ctx.Err() != nil {
			return err
		}
	}
	return fmt.Errorf("after %d attempts: %w", peerAttempts, err)
}

// post makes one single-frame delivery attempt within peerAttemptTimeout.
// It keeps the start of the answer's text, enough to tell a refusal for
// origin, which is final, from a 403 that a peer's next pin reload may
// change.
func (s *peerSender) post(ctx context.Context, f outboundFrame) error {
	open := func() io.Reader { return bytes.NewReader(f.line) }
	status, text, err := s.exchange(ctx, open, int64(len(f.line)), "application/json", int64(len(originRefusalPrefix)))
	if err != nil {
		return err
	}
	switch {
	case status == http.StatusOK:
		return nil
	case retryableAnswer(status, string(text)):
		return fmt.Errorf("status %d", status)
	default:
		return fmt.Errorf("%w: status %d", errPermanent, status)
	}
}

// retryableStatus reports whether an answer may change on another try:
// server errors, 429, and 403 (the peer may not have re-read its pins yet),
// except a 403 that refused the frame for its origin (retryableAnswer).
func retryableStatus(status int) bool {
	return status >= 500 || status == http.StatusTooManyRequests || status == http.StatusForbidden
}

// exchange makes one request within peerAttemptTimeout and returns the
// answer's status and up to keep bytes of its body, or errDeferred for an
// answer that asks the sender to wait (peerretryafter.go). Every answer updates
// what the sender knows of the peer's batch advertisement. The rest of the
// body is drained, up to a bound, so the connection goes back to the pool.
//
// The body is given as a function that opens it, size bytes long, so the
// transport can open it again for a request it may resend.
func (s *peerSender) exchange(ctx context.Context, open func() io.Reader, size int64, contentType string, keep int64) (int, []byte, error) {
	// While the peer has asked to wait, no request goes to it, from either
	// lane; the attempt's timeout starts once the wait is over.
	probe, err := s.hold.wait(ctx)
	if err != nil {
		return 0, nil, err
	}
	var status int
	var deferFor time.Duration // the wait the answer asks for, when the sender honours it
	defer func() { s.settleHold(probe, status, deferFor) }()
	ctx, cancel := context.WithTimeout(ctx, peerAttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, open())
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", errPermanent, err)
	}
	req.ContentLength = size
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(open()), nil }
	req.Header.Set("Content-Type", contentType)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	s.noteAdvert(resp.Header.Get(peerBatchHeader))
	status, deferFor = resp.StatusCode, retryAfterOf(resp)
	kept, err := io.ReadAll(io.LimitReader(resp.Body, keep))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, peerResponseDrainCap))
	if err != nil {
		return 0, nil, fmt.Errorf("read answer: %w", err)
	}
	if deferFor > 0 {
		return status, kept, fmt.Errorf("%w: status %d, Retry-After %s", errDeferred, status, deferFor)
	}
	return resp.StatusCode, kept, nil
}
