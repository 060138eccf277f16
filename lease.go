package main

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/wireframe"
)

// Producer leases (spec 3.5.1). A producer that opens a job and dies before
// it closes it would leave the job live on every member for as long as this
// daemon runs: the daemon re-asserts it on every heartbeat, and the brokers'
// staleness sweep exempts a node's own workloads. A lease is the producer's
// promise to report again before a deadline; when it does not, the daemon
// retires the job as the producer would have, with a failed terminal frame,
// through the ingress's own path (ingressorder.go).

// leaseHeader carries a lease on an ingress lifecycle frame, in seconds.
const leaseHeader = "Workload-Lease"

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
		return 0, fmt.Errorf("%s given %d times: send it once", leaseHeader, len(values))
	case f.isRemoval():
		return 0, fmt.Errorf("%s on a removal: a lease applies to a queued or running frame", leaseHeader)
	case f.life.Terminal():
		return 0, fmt.Errorf("%s on a %s frame: a lease applies to a queued or running frame; a terminal frame ends it", leaseHeader, f.life.Info.State)
	}
	v := values[0]
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n < minLeaseSeconds || n > maxLeaseSeconds {
		return 0, fmt.Errorf("%s %q: must be a whole number of seconds from %d to %d", leaseHeader, httpguard.ClipReason(v), minLeaseSeconds, maxLeaseSeconds)
	}
	return int(n), nil
}

// lease is one workload's lease: the run it retires, its length as the
// producer gave it and when it runs out.
type lease struct {
	ref      wireframe.WorkloadRef
	key      wireframe.WorkloadKey // the run the last leased frame was about
	seconds  int                   // the length the producer gave, for the expiry's error text
	deadline time.Time             // the lease runs out; after a failed expiry, the next try
	failures int                   // consecutive failed broker writes of its expiry
	index    int                   // its place in leaseTable.order
}

// leaseTable holds the leases, keyed by workload, and their deadlines in a
// min-heap, so arming, renewing or ending a lease is O(log n) and finding
// the next one due is O(1): the expiry loop never scans. A lease exists only
// while its workload has a live entry in the re-sync set (a terminal frame
// or a removal ends it, and the set prunes only terminal entries), so the
// table is bounded by the set's --max-live-workloads.
type leaseTable struct {
	// mu guards byRef and order. It is a leaf lock: taken under activeMu
	// by the one path every local frame takes (trackLocal) and by the
	// read-back, under ingestMu by the expiry, and alone by the expiry loop
	// and the metrics. Nothing is taken under it.
	mu    sync.Mutex
	byRef map[wireframe.WorkloadRef]*lease
	order leaseHeap

	// wake tells the expiry loop that the earliest deadline may have moved
	// earlier; one pending wake is enough.
	wake chan struct{}

	renewed  atomic.Uint64        // a lease armed again while it was held
	expired  atomic.Uint64        // jobs retired by expiry
	refused  atomic.Uint64        // requests refused for a bad Workload-Lease header
	failures *promtext.CounterVec // expiries that failed, by reason
}

func newLeaseTable() *leaseTable {
	return &leaseTable{byRef: map[wireframe.WorkloadRef]*lease{}, wake: make(chan struct{}, 1), failures: promtext.NewCounterVec()}
}

// arm starts or renews the lease of ref on run key: it runs out d after
// now. A renewal is counted.
func (t *leaseTable) arm(ref wireframe.WorkloadRef, key wireframe.WorkloadKey, seconds int, d time.Duration, now time.Time) {
	t.mu.Lock()
	l, held := t.byRef[ref]
	if held {
		l.key, l.seconds, l.deadline, l.failures = key, seconds, now.Add(d), 0
		heap.Fix(&t.order, l.index)
	} else {
		l = &lease{ref: ref, key: key, seconds: seconds, deadline: now.Add(d)}
		t.byRef[ref] = l
		heap.Push(&t.order, l)
	}
	first := l.index == 0
	t.mu.Unlock()
	if held {
		t.renewed.Add(1)
	}
	if first {
		t.signal()
	}
}

// end drops ref's lease, if any, and reports whether there was one.
func (t *leaseTable) end(ref wireframe.WorkloadRef) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, held := t.byRef[ref]
	if held {
		heap.Remove(&t.order, l.index)
		delete(t.byRef, ref)
	}
	return held
}

// postpone moves ref's lease to be tried again after a failed expiry, with
// a backoff that doubles per consecutive failure up to leaseRetryMax. It
// returns the delay, or 0 when the lease is no longer held.
func (t *leaseTable) postpone(ref wireframe.WorkloadRef, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, held := t.byRef[ref]
	if !held {
		return 0
	}
	// The shift stops at 5: 1 s << 5 is past the maximum already, and a
	// larger one would overflow after enough failures.
	d := min(leaseRetryFirst<<min(l.failures, 5), leaseRetryMax)
	l.failures++
	l.deadline = now.Add(d)
	heap.Fix(&t.order, l.index)
	return d
}

// next returns the earliest deadline, or false when no lease is held.
func (t *leaseTable) next() (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.order) == 0 {
		return time.Time{}, false
	}
	return t.order[0].deadline, true
}

// due returns a copy of the lease with the earliest deadline when that
// deadline has passed.
func (t *leaseTable) due(now time.Time) (lease, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.order) == 0 || t.order[0].deadline.After(now) {
		return lease{}, false
	}
	return *t.order[0], true
}

// deadlineOf returns the deadline of ref's lease when it retires run key.
func (t *leaseTable) deadlineOf(ref wireframe.WorkloadRef, key wireframe.WorkloadKey) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, held := t.byRef[ref]; held && l.key == key {
		return l.deadline, true
	}
	return time.Time{}, false
}

// leaseOf returns the length and deadline of ref's lease, 0 seconds for
// none.
func (t *leaseTable) leaseOf(ref wireframe.WorkloadRef) (int, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, held := t.byRef[ref]; held {
		return l.seconds, l.deadline
	}
	return 0, time.Time{}
}

func (t *leaseTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.order)
}

func (t *leaseTable) signal() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// leaseHeap orders leases by deadline, earliest first (container/heap).
type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.index = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.index = -1
	return l
}

// applyLease updates the lease of f's workload once f is tracked, and marks
// the run as reported through the ingress. Called from trackLocal with
// activeMu held, so a lease changes in the same step as the set, in the
// order the frames were committed.
//
//   - A removal or a terminal frame, from any source, ends the lease: the
//     job is closed, or gone from the Jobs list, and an expiry would bring
//     it back.
//   - An ingress frame without the header ends it: the producer reports
//     this job unleased from now on.
//   - An ingress frame with the header arms or renews it on the frame's
//     run, while the set holds that run live (a frame that came too late to
//     move a finished run is not a sign of life of the run).
//   - A broker frame that is not terminal leaves it alone.
func (m *Manager) applyLease(f *localFrame, src frameSource, now time.Time) {
	if f.isRemoval() {
		m.leases.end(f.removal.Ref)
		return
	}
	ref, key := f.life.Ref(), f.life.Key()
	if f.life.Terminal() {
		m.leases.end(ref)
	}
	if src != fromIngress {
		return
	}
	e := m.resync.entries[key]
	if e != nil {
		e.ingress = true
	}
	switch {
	case f.life.Terminal():
	case f.leaseSeconds == 0:
		m.leases.end(ref)
	case e != nil && e.terminalAt.IsZero():
		m.leases.arm(ref, key, f.leaseSeconds, time.Duration(f.leaseSeconds)*m.leaseUnit, now)
	}
}

// runLeases retires leased jobs as their leases run out, until ctx ends.
// It is the one goroutine that drives expiry: it sleeps until the earliest
// deadline (or until a lease is armed earlier than that) and never scans.
func (m *Manager) runLeases(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		at, held := m.leases.next()
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
		case <-m.leases.wake:
		case <-timer.C:
		}
	}
}

// leaseExpiryError is the error text of a job retired by its lease.
func leaseExpiryError(seconds int) string {
	return fmt.Sprintf("producer stopped reporting: lease of %d s expired", seconds)
}

// expireDue retires the job of the lease due first, if one still is, the
// way an ingress post would: under ingestMu it takes its place in the
// broker order, so it is ordered with every producer frame; it is written
// up to the broker first, then tracked and queued for the peers
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
		log.Info("lease expired: job retired as failed", "runId", httpguard.ClipLogged(l.key.RunID))
	case errors.As(err, new(noLiveRunError)):
		m.dropLease(log, *l, "no_entry", err)
	case errors.Is(err, wireframe.ErrLineOverLimit):
		m.dropLease(log, *l, "line_limit", err)
	default:
		m.leases.failures.Inc("broker_write")
		retry := m.leases.postpone(l.ref, m.now())
		log.Warn("lease expiry not written to the broker; trying again", "reason", err, "retryIn", retry)
	}
}

// noLiveRunError is an expiry whose run the re-sync set no longer holds
// live: its lease is dropped.
type noLiveRunError struct{ error }

// enterExpiry takes the lease due first, if any, and gives the frame that
// retires its job a place in the broker order, under ingestMu. It returns
// a nil lease when none is due.
func (m *Manager) enterExpiry() (ingressTurn, *lease, *slog.Logger, error) {
	m.ingestMu.Lock()
	defer m.ingestMu.Unlock()
	// Every ingress frame placed before this one is committed first (or
	// has failed), so a producer frame that renewed or ended the lease
	// while this waited for ingestMu has taken effect when the lease is
	// read.
	m.ingressFlight.waitSettled()
	now := m.now()
	l, ok := m.leases.due(now)
	if !ok {
		return ingressTurn{}, nil, nil, nil
	}
	log := m.log.With("channel", "lease", "id", httpguard.ClipLogged(l.ref.ID), "leaseSeconds", l.seconds)
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
func (m *Manager) dropLease(log *slog.Logger, l lease, reason string, err error) {
	m.leases.end(l.ref)
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
func (m *Manager) expiryFrame(l lease, now time.Time, knownOnly bool) (localFrame, error) {
	m.activeMu.Lock()
	e := m.resync.entries[l.key]
	var params json.RawMessage
	var seq int64
	var hasSeq bool
	if e != nil && e.terminalAt.IsZero() {
		params, seq, hasSeq = e.params(), e.seq, e.hasSeq
	}
	m.activeMu.Unlock()
	if params == nil {
		return localFrame{}, fmt.Errorf("the re-sync set holds no live run %q of the workload", l.key.RunID)
	}
	info, err := buildExpiryInfo(params, leaseExpiryError(l.seconds), now, seq, hasSeq, knownOnly)
	if err != nil {
		return localFrame{}, err
	}
	p := make([]byte, 0, len(info)+20)
	p = append(append(append(p, `{"workloadInfo":`...), info...), '}')
	return parseLocalFrame(wireframe.MethodErrored, p)
}

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

// writeLeaseMetrics renders the leases.
func (m *Manager) writeLeaseMetrics(t *promtext.Text) {
	t.Single("nvpair_wlm_leases_active", "gauge", "Ingress workloads held under a producer lease (Workload-Lease) now.", float64(m.leases.len()))
	t.Single("nvpair_wlm_leases_limit", "gauge", "The most leases this node holds: one per live workload, so --max-live-workloads.", float64(m.resync.limit))
	t.Single("nvpair_wlm_leases_renewed_total", "counter", "Leases renewed by a producer's frame while they were held.", float64(m.leases.renewed.Load()))
	t.Single("nvpair_wlm_leases_expired_total", "counter", "Jobs retired as failed because their producer's lease ran out.", float64(m.leases.expired.Load()))
	t.Single("nvpair_wlm_lease_header_refusals_total", "counter", "Ingress frames refused with 400 for a bad Workload-Lease header.", float64(m.leases.refused.Load()))
	t.Family("nvpair_wlm_lease_expiry_failures_total", "counter", "Expiries that could not be written: broker_write (retried with backoff), line_limit or no_entry (the lease is dropped, logged at error).")
	t.CounterSamples("nvpair_wlm_lease_expiry_failures_total", []string{"reason"}, m.leases.failures)
}
