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
	reasserted, reassertFailures                  atomic.Uint64 // re-assertions delivered, and not
	passProgress, passSize                        atomic.Uint64 // entries visited in the pass under way, of the set's size at its start
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
	drops     dropLogger
	hbErrors  dropLogger // failed re-assertions, logged at most once per dropLogInterval
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
			s.reassert(s.heartbeat.nextLines(1, maxFrameBytes))
			continue
		}
		if !s.idleUntilNextPass() {
			return
		}
	}
}

// idleUntilNextPass waits for a fresh frame, which it delivers, or for the
// next pass, which it starts. It reports false when the sender is to stop.
func (s *peerSender) idleUntilNextPass() bool {
	due := time.NewTimer(s.heartbeat.untilDue())
	defer due.Stop()
	select {
	case <-s.ctx.Done():
		return false
	case f, ok := <-s.queue:
		if !ok {
			return false
		}
		s.deliverFresh(f)
	case now := <-due.C:
		s.heartbeat.begin(now)
	}
	return true
}

// deliverFresh delivers a fresh frame with retries; a frame that cannot be
// delivered is dropped for this peer with a warning.
func (s *peerSender) deliverFresh(f outboundFrame) {
	if err := s.deliver(f); err != nil && s.ctx.Err() == nil {
		s.stats.dropped.Add(1)
		s.log.Warn("peer delivery failed, frame dropped for this peer", "method", f.method, "reason", err)
	}
}

// reassert sends re-assertions once each, without retries: the next pass
// repairs what this one could not deliver, and a retry would hold back the
// fresh frames queued meanwhile.
func (s *peerSender) reassert(lines [][]byte) {
	for _, l := range lines {
		if err := s.post(outboundFrame{line: l}); err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.stats.reassertFailures.Add(1)
			s.hbErrors.note(s.log, "peer re-assertion failed; the next pass repeats it", "reason", err.Error())
			continue
		}
		s.stats.reasserted.Add(1)
	}
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

// post makes one delivery attempt within peerAttemptTimeout.
func (s *peerSender) post(f outboundFrame) error {
	ctx, cancel := context.WithTimeout(s.ctx, peerAttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(f.line))
	if err != nil {
		return fmt.Errorf("%w: %v", errPermanent, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	// Draining the body lets the connection go back to the pool.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, peerResponseDrainCap))
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		return nil
	case resp.StatusCode >= 500, resp.StatusCode == http.StatusTooManyRequests,
		// The peer may not have re-read its pins yet: worth another try.
		resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("status %d", resp.StatusCode)
	default:
		return fmt.Errorf("%w: status %d", errPermanent, resp.StatusCode)
	}
}
