package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
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
