package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// Producer leases (spec 3.5.1). A producer that opens a job and dies before
// it closes it would leave the job live on every member for as long as this
// daemon runs: the daemon re-asserts it on every heartbeat, and the brokers'
// staleness sweep exempts a node's own workloads. A lease is the producer's
// promise to report again before a deadline; when it does not, the daemon
// retires the job as the producer would have, with a failed terminal frame,
// through the ingress's own path (ingressorder.go).

// The lengths a lease may have, in seconds. A producer renews at a third
// of its lease: at 5 s that is every 1.7 s, often enough to notice a crash
// within seconds and rarely enough not to load the ingress; a day is the
// longest a crashed producer's job may stay live.
const (
	minLeaseSeconds = 5
	maxLeaseSeconds = 86400
)

// Bounded backoff of an expiry whose broker write failed: the lease is
// tried again after this, doubled per failure up to the maximum, never
// dropped. A failed broker write also shuts the daemon down, so in practice
// the retry is what runs while it does.
const (
	leaseRetryFirst = time.Second
	leaseRetryMax   = 30 * time.Second
)

// parseLeaseHeader reads the Workload-Lease header of a request for frame f
// and returns the lease's length in seconds, or 0 when the header is
// absent. Any other form of the header is the producer's mistake.
func parseLeaseHeader(values []string, f *localFrame) (int, error) {
	switch {
	case len(values) == 0:
		return 0, nil
	case len(values) > 1:
		return 0, fmt.Errorf("%s given %d times: send it once", ingress.LeaseHeader, len(values))
	case f.isRemoval():
		return 0, fmt.Errorf("%s on a removal: a lease applies to a queued or running frame", ingress.LeaseHeader)
	case f.life.Terminal():
		return 0, fmt.Errorf("%s on a %s frame: a lease applies to a queued or running frame; a terminal frame ends it", ingress.LeaseHeader, f.life.Info.State)
	}
	v := values[0]
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n < minLeaseSeconds || n > maxLeaseSeconds {
		return 0, fmt.Errorf("%s %q: must be a whole number of seconds from %d to %d", ingress.LeaseHeader, httpguard.ClipReason(v), minLeaseSeconds, maxLeaseSeconds)
	}
	return int(n), nil
}

// leaseStats counts the leases' events; the leases live on their runs in
// the state table.
type leaseStats struct {
	expired  atomic.Uint64        // jobs retired by expiry
	refused  atomic.Uint64        // requests refused for a bad Workload-Lease header
	failures *promtext.CounterVec // expiries that failed, by reason
}

// leaseExpiryError is the error text of a job retired by its lease.
func leaseExpiryError(seconds int) string {
	return fmt.Sprintf("producer stopped reporting: lease of %d s expired", seconds)
}

// noLiveRunError is an expiry whose run the re-sync set no longer holds
// live: its lease is dropped.
type noLiveRunError struct{ error }

// buildExpiryInfo is the workload object of an expiry, from the params of
// the run's latest event.
func buildExpiryInfo(params json.RawMessage, errText string, now time.Time, seq int64, hasSeq, knownOnly bool) (json.RawMessage, error) {
	pm, err := wireframe.ValidObjectMembers(params)
	if err != nil {
		return nil, fmt.Errorf("tracked params: %w", err)
	}
	raw, ok := wireframe.MemberNamed(pm, "workloadInfo")
	if !ok {
		return nil, errors.New("tracked params hold no workloadInfo")
	}
	ms, err := wireframe.ValidObjectMembers(raw)
	if err != nil {
		return nil, fmt.Errorf("tracked workloadInfo: %w", err)
	}
	if knownOnly {
		kept := ms[:0:0]
		for _, mb := range ms {
			if wireframe.IsWorkloadField(mb.Name) {
				kept = append(kept, mb)
			}
		}
		ms = kept
	}
	quoted, _ := json.Marshal(errText)
	ms = wireframe.WithMember(ms, "state", json.RawMessage(`"failed"`))
	ms = wireframe.WithMember(ms, "completedAt", strconv.AppendInt(nil, now.UnixMilli(), 10))
	ms = wireframe.WithMember(ms, "error", quoted)
	if hasSeq {
		// At the largest seq there is no next one: the expiry keeps it,
		// and its state tells it apart from the run's last event.
		next := seq
		if seq < math.MaxInt64 {
			next = seq + 1
		}
		ms = wireframe.WithMember(ms, "seq", strconv.AppendInt(nil, next, 10))
	}
	return wireframe.EncodeMembers(ms), nil
}

// restartLeaseGrace is the least time a lease restored from the journal is
// given, in lease units (a second each): a producer that outlived the
// daemon's restart renews at a third of its lease, and its renewals failed
// while the daemon was down. A lease whose deadline passed while the
// daemon was down runs out this long after the start; one still ahead
// keeps its deadline.
const restartLeaseGrace = minLeaseSeconds

// The expiry: a leased run that is not renewed in time is retired as its
// producer would have retired it, through the ingress's own path.

// runLeases retires leased jobs as their leases run out, until ctx ends.
// It is the one goroutine that drives expiry: it sleeps until the earliest
// deadline (or until a lease is armed earlier than that) and never scans.
func (m *Manager) runLeases(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		at, held := m.table.NextLease()
		wait := time.Duration(math.MaxInt64)
		if held {
			wait = at.Sub(m.now())
		}
		if wait <= 0 {
			m.expireDue()
			continue
		}
		// Since Go 1.23 a Reset discards a value the timer sent before
		// it, so a wake-up never leaves a stale tick behind.
		timer.Reset(min(wait, time.Hour))
		select {
		case <-ctx.Done():
		case <-m.table.LeaseWake():
		case <-timer.C:
		}
	}
}

// expireDue retires the job of the lease due first, if one still is, the
// way an ingress post would: under ingestMu it takes its place in the
// broker order, so it is ordered with every producer frame; it is written
// up to the broker first, then committed to the state table
// (ingressorder.go). Its commit is a terminal frame, which ends the lease.
// A failed broker write keeps the lease and tries again after a bounded
// backoff.
func (m *Manager) expireDue() {
	turn, l, log, err := m.enterExpiry()
	if l == nil {
		return // no lease due
	}
	if err == nil {
		err = turn.wait()
	}
	switch {
	case err == nil:
		m.leases.expired.Add(1)
		log.Info("lease expired: job retired as failed", "runId", httpguard.ClipLogged(l.Key.RunID))
	case errors.As(err, new(noLiveRunError)):
		m.dropLease(log, *l, "no_entry", err)
	case errors.Is(err, wireframe.ErrLineOverLimit):
		m.dropLease(log, *l, "line_limit", err)
	default:
		m.leases.failures.Inc("broker_write")
		retry := m.table.PostponeLease(l.Key, m.now(), leaseRetryFirst, leaseRetryMax)
		log.Warn("lease expiry not written to the broker; trying again", "reason", err, "retryIn", retry)
	}
}

// enterExpiry takes the lease due first, if any, and gives the frame that
// retires its job a place in the broker order, under ingestMu. It returns
// a nil lease when none is due.
func (m *Manager) enterExpiry() (ingressTurn, *statetable.Lease, *slog.Logger, error) {
	m.ingestMu.Lock()
	defer m.ingestMu.Unlock()
	// Every ingress frame placed before this one is committed first (or
	// has failed), so a producer frame that renewed or ended the lease
	// while this waited for ingestMu has taken effect when the lease is
	// read.
	m.ingressFlight.waitSettled()
	now := m.now()
	l, ok := m.table.DueLease(now)
	if !ok {
		return ingressTurn{}, nil, nil, nil
	}
	log := m.log.With("channel", "lease", "id", httpguard.ClipLogged(l.Key.ID), "leaseSeconds", l.Seconds)
	f, err := m.expiryFrame(l, now, false)
	if err != nil {
		return ingressTurn{}, &l, log, noLiveRunError{err}
	}
	if len(f.params) > m.cfg.WorkloadMaxBytes {
		// A job at the workload bound (3.2) is over it with the expiry's
		// fields, and every peer would refuse it, for good: it is
		// retired with its known fields only, as for the line limit.
		log.Warn("lease expiry frame over the workload bound: retiring the job with its known fields only", "bytes", len(f.params), "limit", m.cfg.WorkloadMaxBytes)
		if f, err = m.expiryFrame(l, now, true); err != nil {
			return ingressTurn{}, &l, log, noLiveRunError{err}
		}
	}
	turn, err := m.enterLocalFrame(f)
	if errors.Is(err, wireframe.ErrLineOverLimit) {
		// The job's own fields and what the producer added are kept when
		// they fit; a job whose frame does not fit with the expiry's
		// fields is retired with its known fields only.
		log.Warn("lease expiry frame over the broker line limit: retiring the job with its known fields only", "reason", err)
		if f, err = m.expiryFrame(l, now, true); err == nil {
			turn, err = m.enterLocalFrame(f)
		}
	}
	return turn, &l, log, err
}

// dropLease gives up a lease whose expiry can never be written, loudly.
func (m *Manager) dropLease(log *slog.Logger, l statetable.Lease, reason string, err error) {
	m.table.EndLease(l.Ref())
	m.leases.failures.Inc(reason)
	log.Error("lease expired but the job could not be retired; the lease is dropped", "reason", err)
}

// expiryFrame builds the failed terminal frame that retires l's run, from
// the run's latest event in the re-sync set: the same members (id, runId,
// model, engine, origin, scheduledOn, createdAt, startedAt, requesterId and
// every field of the producer's own, in their order), with state failed,
// completedAt now, the lease's error, and seq one more than the last when
// the run had one. knownOnly keeps only the workload fields the daemon
// knows, for a run whose whole frame would not fit the broker's line. The
// frame goes through parseLocalFrame like any other.
func (m *Manager) expiryFrame(l statetable.Lease, now time.Time, knownOnly bool) (localFrame, error) {
	params, seq, hasSeq, ok := m.table.LiveRun(l.Key)
	if !ok {
		return localFrame{}, fmt.Errorf("the state table holds no live run %q of the workload", l.Key.RunID)
	}
	info, err := buildExpiryInfo(params, leaseExpiryError(l.Seconds), now, seq, hasSeq, knownOnly)
	if err != nil {
		return localFrame{}, err
	}
	p := make([]byte, 0, len(info)+20)
	p = append(append(append(p, `{"workloadInfo":`...), info...), '}')
	return parseLocalFrame(wireframe.MethodErrored, p)
}

// writeLeaseMetrics renders the leases.
func (m *Manager) writeLeaseMetrics(t *promtext.Text) {
	t.Single("nvpair_wlm_leases_active", "gauge", "Ingress workloads held under a producer lease (Workload-Lease) now.", float64(m.table.Sizes().Leases))
	t.Single("nvpair_wlm_leases_limit", "gauge", "The most leases this node holds: one per live workload, so --max-live-workloads.", float64(m.cfg.MaxLiveWorkloads))
	t.Single("nvpair_wlm_leases_renewed_total", "counter", "Leases renewed by a producer's frame while they were held.", float64(m.table.Stats().LeaseRenewed.Load()))
	t.Single("nvpair_wlm_leases_expired_total", "counter", "Jobs retired as failed because their producer's lease ran out.", float64(m.leases.expired.Load()))
	t.Single("nvpair_wlm_lease_header_refusals_total", "counter", "Ingress frames refused with 400 for a bad Workload-Lease header.", float64(m.leases.refused.Load()))
	t.Family("nvpair_wlm_lease_expiry_failures_total", "counter", "Expiries that could not be written: broker_write (retried with backoff), line_limit or no_entry (the lease is dropped, logged at error).")
	t.CounterSamples("nvpair_wlm_lease_expiry_failures_total", []string{"reason"}, m.leases.failures)
}
