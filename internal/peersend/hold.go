package peersend

import (
	"context"
	"errors"
	"sync"
	"time"

	"nvpair-workload-manager/internal/promtext"
)

// A peer that answers 503 or 429 with Retry-After is asking its senders to
// come back later: its broker is not reading, its request-body budget is
// full, it is shedding load. Retrying it on the sender's own backoff (250
// ms, then 500 ms, then the next frame) ignores the request, keeps the
// peer as busy as before, and gives frames up after three attempts that
// the peer never had a chance to take. So the sender honours it (spec 4):
// for the time asked, capped, no request goes to that peer on any lane,
// and the frames wait in their place.

// errDeferred is an answer (503 or 429) whose Retry-After the sender
// honours: not a failed attempt. The same request goes again once the wait
// is over.
var errDeferred = errors.New("peer asked to wait")

// peerHold is what a peer has asked its sender to wait for, shared by the
// sender's two lanes: every request to the peer passes wait first. Until
// the time asked for, no request goes; after it, while the last answer was
// a deferral, one request at a time (the probe) goes, so two lanes that
// both waited do not both find the peer still busy; the first answer that
// is not a deferral lets every request go again.
type peerHold struct {
	mu      sync.Mutex    // guards the fields below; a leaf lock, never held across a request or a wait
	until   time.Time     // no request to the peer before this
	asked   bool          // the last answer settled was a deferral
	probing bool          // a probe is in flight
	settled chan struct{} // closed when the probe in flight settles; nil when none waits for it
}

// wait returns once a request may go to the peer, or with ctx's error when
// ctx ends first, which it does at the sender's stop: a hold never keeps a
// shutdown past its drain timeout. It reports whether the request is the
// probe; every request that wait let go must be settled.
func (h *peerHold) wait(ctx context.Context) (probe bool, err error) {
	for {
		h.mu.Lock()
		if d := time.Until(h.until); d > 0 {
			h.mu.Unlock()
			if !sleepCtx(ctx, d) {
				return false, ctx.Err()
			}
			continue
		}
		if !h.asked {
			h.mu.Unlock()
			return false, nil
		}
		if !h.probing {
			h.probing = true
			h.mu.Unlock()
			return true, nil
		}
		if h.settled == nil {
			h.settled = make(chan struct{})
		}
		settled := h.settled
		h.mu.Unlock()
		select {
		case <-settled:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// settle records the answer to a request that wait let go: deferFor is the
// wait it asked for, 0 when it was not a deferral. It returns how much
// later the hold now ends than it did (0 when the peer was already held as
// long), the time the peer's requests are held for this answer.
func (h *peerHold) settle(probe bool, deferFor time.Duration, now time.Time) (added time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if probe {
		h.probing = false
		if h.settled != nil {
			close(h.settled)
			h.settled = nil
		}
	}
	h.asked = deferFor > 0
	if deferFor <= 0 {
		return 0
	}
	from := h.until
	if from.Before(now) {
		from = now
	}
	if end := now.Add(deferFor); end.After(from) {
		h.until = end
		added = end.Sub(from)
	}
	return added
}

// settleHold settles a request with the peer's hold and counts and logs a
// deferral.
func (s *peerSender) settleHold(probe bool, status int, deferFor time.Duration) {
	added := s.hold.settle(probe, deferFor, time.Now())
	if deferFor <= 0 {
		return
	}
	s.stats.RetryAfterWaits.Add(1)
	s.stats.RetryAfterHeldNanos.Add(uint64(added))
	s.retryAfterLog.NoteCounted(s.log, "waits", "peer asked to wait (Retry-After): no request goes to it until then", "status", status, "wait", deferFor)
}

// writeRetryAfterMetrics renders the peers' deferrals.
func writeRetryAfterMetrics(t *promtext.Text, stats []*Stats) {
	const waits, held = "nvpair_wlm_peer_retry_after_waits_total", "nvpair_wlm_peer_retry_after_held_seconds_total"
	t.Family(waits, "counter", "Answers from a peer (503 or 429) whose Retry-After this node honoured: no request went to the peer until the wait (at most 30 s) was over.")
	for _, s := range stats {
		t.Sample(waits, []string{"peer"}, []string{s.Peer}, float64(s.RetryAfterWaits.Load()))
	}
	t.Family(held, "counter", "Seconds a peer's Retry-After held every request to it.")
	for _, s := range stats {
		t.Sample(held, []string{"peer"}, []string{s.Peer}, time.Duration(s.RetryAfterHeldNanos.Load()).Seconds())
	}
}
