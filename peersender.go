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
)

// peerStats counts one peer's deliveries and heartbeat passes, for the
// metrics.
type peerStats struct {
	peer                                                      string
	succeeded, failedAttempts, retries, dropped, queueDropped atomic.Uint64
	latency                                                   *histogram

	passesStarted, passesCompleted, passesOverrun atomic.Uint64
	passesAbandoned                               atomic.Uint64 // ended at a failed re-assertion
	reasserted, reassertFailures                  atomic.Uint64 // re-assertions delivered, and not
	passProgress, passSize                        atomic.Uint64 // entries visited in the pass under way, of the set's size at its start
	batchesSent, batchFramesSent                  atomic.Uint64
}

// peerSender delivers one peer's fresh frames in order over pooled
// connections, and between them its heartbeat passes.
type peerSender struct {
	target    peerTarget
	stats     *peerStats
	log       *slog.Logger
	queue     chan outboundFrame
	heartbeat *heartbeatStream
	client    *http.Client
	url       string
	ctx       context.Context
	cancel    context.CancelFunc
	drops     dropLogger // queue-full drops, logged at most once per dropLogInterval
	failDrops dropLogger // frames of a batch given up, likewise
	hbErrors  dropLogger // failed re-assertions, likewise

	// What the peer's last answer advertised (noteAdvert): the most frames
	// and bytes a batch to it may have, both 0 when it takes no batches.
	// Like carry, only the sender's goroutine uses them.
	batchFrames, batchBytes int
	// carry is a fresh frame taken from the queue that did not fit in the
	// batch being gathered; it goes first in the next one.
	carry *outboundFrame
}

func newPeerSender(t peerTarget, stats *peerStats, dialTLS func(context.Context, string, string) (net.Conn, error), hb *heartbeatStream, log *slog.Logger) *peerSender {
	ctx, cancel := context.WithCancel(context.Background())
	transport := &http.Transport{
		DialTLSContext:      dialTLS,
		MaxIdleConns:        peerMaxIdleConns,
		MaxIdleConnsPerHost: peerMaxIdleConns,
		IdleConnTimeout:     peerClientIdleTimeout,
	}
	return &peerSender{
		target:    t,
		stats:     stats,
		log:       log.With("peer", t.name, "principal", t.principal),
		queue:     make(chan outboundFrame, peerQueueSize),
		heartbeat: hb,
		client:    &http.Client{Transport: transport},
		// url.URL escapes an IPv6 zone ("%" -> "%25"); concatenation would
		// leave an invalid escape and every request to the peer would fail.
		url:    (&url.URL{Scheme: "https", Host: t.addrs[0], Path: peerEventsPath}).String(),
		ctx:    ctx,
		cancel: cancel,
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

// offer hands a frame to the sender without blocking; a full queue drops the
// frame for this peer only. Called by the dispatcher under broadcaster.mu.
func (s *peerSender) offer(f outboundFrame) {
	select {
	case s.queue <- f:
	default:
		s.stats.queueDropped.Add(1)
		s.drops.note(s.log, "peer queue full, dropping the newest frame for this peer", "method", f.method)
	}
}

func (s *peerSender) stop() {
	s.cancel()
}

// run delivers the queue until it is closed or the sender is stopped, and
// the heartbeat passes while the queue is empty. The first pass, begun when
// the sender was created, is the new target's backfill.
func (s *peerSender) run() {
	defer s.client.CloseIdleConnections()
	defer s.heartbeat.close()
	for {
		// Fresh frames first, always: a re-assertion never delays one by
		// more than the delivery in flight.
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
				return
			}
			s.deliverFresh(f)
			continue
		default:
		}
		if s.heartbeat.active {
			if wait := s.heartbeat.paceWait(time.Now()); wait > 0 {
				if !s.idle(wait, func(time.Time) {}) {
					return
				}
				continue
			}
			if !s.reassert(s.heartbeat.nextLines(s.heartbeatBounds())) && s.heartbeat.active {
				s.heartbeat.abandon(time.Now())
			}
			continue
		}
		if !s.idle(s.heartbeat.untilDue(), s.heartbeat.begin) {
			return
		}
	}
}

// idle waits up to d for a fresh frame, which it delivers; when d passes
// first it calls onTimeout. It reports false when the sender is to stop.
func (s *peerSender) idle(d time.Duration, onTimeout func(time.Time)) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return false
	case f, ok := <-s.queue:
		if !ok {
			return false
		}
		s.deliverFresh(f)
	case now := <-t.C:
		onTimeout(now)
	}
	return true
}

// deliverFresh delivers a fresh frame, with the frames queued behind it in
// one batch when the peer takes batches.
func (s *peerSender) deliverFresh(f outboundFrame) {
	if s.batching() {
		if frames := s.gatherFresh(f); len(frames) > 1 {
			s.deliverFreshBatch(frames)
			return
		}
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
// repairs what this one could not deliver, and a retry would hold back the
// fresh frames queued meanwhile. It reports whether the peer took them.
func (s *peerSender) reassert(lines [][]byte) bool {
	if len(lines) > 1 {
		return s.reassertBatch(lines)
	}
	for _, l := range lines {
		if err := s.post(outboundFrame{line: l}); err != nil {
			if s.ctx.Err() == nil {
				s.stats.reassertFailures.Add(1)
				s.hbErrors.note(s.log, "peer re-assertion failed; the next pass repeats it", "reason", clipReason(err.Error()))
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

// deliver sends one frame with bounded exponential-backoff retries.
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
		if err = s.post(f); err == nil {
			s.stats.succeeded.Add(1)
			s.stats.latency.observe(time.Since(f.queuedAt))
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
func (s *peerSender) post(f outboundFrame) error {
	status, _, err := s.exchange(f.line, "application/json", 0)
	if err != nil {
		return err
	}
	switch {
	case status == http.StatusOK:
		return nil
	case retryableStatus(status):
		return fmt.Errorf("status %d", status)
	default:
		return fmt.Errorf("%w: status %d", errPermanent, status)
	}
}

// retryableStatus reports whether an answer may change on another try:
// server errors, 429, and 403 (the peer may not have re-read its pins yet).
func retryableStatus(status int) bool {
	return status >= 500 || status == http.StatusTooManyRequests || status == http.StatusForbidden
}

// exchange makes one request within peerAttemptTimeout and returns the
// answer's status and up to keep bytes of its body. Every answer updates
// what the sender knows of the peer's batch advertisement. The rest of the
// body is drained, up to a bound, so the connection goes back to the pool.
func (s *peerSender) exchange(body []byte, contentType string, keep int64) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(s.ctx, peerAttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", errPermanent, err)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	s.noteAdvert(resp.Header.Get(peerBatchHeader))
	kept, err := io.ReadAll(io.LimitReader(resp.Body, keep))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, peerResponseDrainCap))
	if err != nil {
		return 0, nil, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, kept, nil
}
