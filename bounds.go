package main

import (
	"fmt"
	"time"

	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// Field bounds. Every string that identifies a workload or one of its
// events is at most wireframe.MaxKeyFieldBytes (internal/wireframe/workloadtypes.go,
// checked by the parse step the local channel, the ingress and the peer
// port share), and the ingress bounds a producer's error text too
// (internal/wireframe/ingressframe.go). A frame
// over a bound is refused: 400 naming the field and the bound on the
// ingress and the peer port, a rate-limited warning on the local channel,
// never broadcast or written. Each refusal is counted by source.

// Bytes, not entries, bound what the daemon keeps (issue 20). Before these
// bounds a member of a producer's own was bounded only by the broker's line
// limit: 1,500 ingress posts each with a 250 KiB member were all taken,
// the re-sync set kept every one and a slow peer's queue a thousand more,
// and the daemon grew from 10 to 650 MiB and stayed there. Three bounds
// now hold it:
//
//   - one workload frame's content, its params (the workloadInfo and any
//     member beside it), on every path: --workload-max-bytes;
//   - the state table's re-asserted runs' bytes, beside their count:
//     --max-live-workload-bytes;
//   - the ends it keeps for members that lack them: --max-ended-bytes.
//
// A slow peer holds no queue of its own: what it has not taken is what lies
// above its mark in the table.

// The state table's bounds (spec 7.1), in one place: each has its
// default, its range, its flag (or the reason it has none) and one check,
// which both main.go's flags and NewManager's Config go through.
const (
	// retentionIntervals is how many re-sync intervals an end is
	// re-asserted and holds its id (statetable.Config.Retention): two, so
	// a peer that missed one heartbeat's re-assertion of a job's end still
	// gets the next one. No flag: it follows --resync-interval.
	retentionIntervals = 2

	// defaultMaxLiveWorkloads bounds the runs the table re-asserts
	// (--max-live-workloads, 1 to maxMaxLiveWorkloads). An entry costs
	// about its re-assertion line plus 200 bytes, so 100,000 typical
	// workloads hold some 60 MB, and a heartbeat pass over them takes a
	// batching peer a few seconds of a 30 s interval.
	defaultMaxLiveWorkloads = 100_000
	// maxMaxLiveWorkloads is the most: a set that size holds gigabytes,
	// past any node this daemon serves.
	maxMaxLiveWorkloads = 10_000_000

	// defaultMaxLiveWorkloadBytes bounds the bytes of those runs' lines
	// (--max-live-workload-bytes): 100,000 workloads (the entry bound's
	// default) of some 2.6 KiB each.
	defaultMaxLiveWorkloadBytes = 256 << 20
	// minMaxLiveWorkloadBytes is the least accepted: at least one frame of
	// the largest workload bound.
	minMaxLiveWorkloadBytes = wireframe.MaxWorkloadMaxBytes
	// maxMaxLiveWorkloadBytes is the most: 1 TiB, past any node.
	maxMaxLiveWorkloadBytes = 1 << 40

	// defaultMaxEndedBytes bounds the ends kept for members that have not
	// taken them (--max-ended-bytes): 64 MiB is some 150,000 ends of
	// typical frames, past what a member away for an hour of a busy node
	// misses.
	defaultMaxEndedBytes = 64 << 20
	// minMaxEndedBytes is the least: room for the ends of a few hundred
	// typical workloads, so a burst is not all evicted at once.
	minMaxEndedBytes = 64 << 10
	// maxMaxEndedBytes is the most: 1 TiB, past any node.
	maxMaxEndedBytes = 1 << 40

	// defaultMemberClaim is how long a member that left discovery keeps
	// its claim on the ends it lacks: PAIR's broker keeps finished jobs
	// for 7 days, so a member back within them is told how each ended. No
	// flag: it is PAIR's retention, not an operator's choice (a test sets
	// Config.MemberClaim).
	defaultMemberClaim = 7 * 24 * time.Hour
)

// checkMaxLiveWorkloads refuses a --max-live-workloads outside its range.
func checkMaxLiveWorkloads(n int) error {
	if n < 1 || n > maxMaxLiveWorkloads {
		return fmt.Errorf("must be between 1 and %d", maxMaxLiveWorkloads)
	}
	return nil
}

// checkMaxLiveWorkloadBytes refuses a --max-live-workload-bytes outside
// its range.
func checkMaxLiveWorkloadBytes(n int64) error {
	if n < minMaxLiveWorkloadBytes || n > maxMaxLiveWorkloadBytes {
		return fmt.Errorf("must be between %d and %d bytes", int64(minMaxLiveWorkloadBytes), int64(maxMaxLiveWorkloadBytes))
	}
	return nil
}

// checkMaxEndedBytes refuses a --max-ended-bytes outside its range.
func checkMaxEndedBytes(n int64) error {
	if n < minMaxEndedBytes || n > maxMaxEndedBytes {
		return fmt.Errorf("must be between %d and %d bytes", int64(minMaxEndedBytes), int64(maxMaxEndedBytes))
	}
	return nil
}

// applyTableBounds gives a Config's zero table bounds their defaults and
// refuses one outside its range, naming its flag.
func applyTableBounds(cfg *Config) error {
	if cfg.MaxLiveWorkloads == 0 {
		cfg.MaxLiveWorkloads = defaultMaxLiveWorkloads
	}
	if err := checkMaxLiveWorkloads(cfg.MaxLiveWorkloads); err != nil {
		return fmt.Errorf("--max-live-workloads %d: %w", cfg.MaxLiveWorkloads, err)
	}
	if cfg.MaxLiveWorkloadBytes == 0 {
		cfg.MaxLiveWorkloadBytes = defaultMaxLiveWorkloadBytes
	}
	if err := checkMaxLiveWorkloadBytes(cfg.MaxLiveWorkloadBytes); err != nil {
		return fmt.Errorf("--max-live-workload-bytes %d: %w", cfg.MaxLiveWorkloadBytes, err)
	}
	if cfg.MaxEndedBytes == 0 {
		cfg.MaxEndedBytes = defaultMaxEndedBytes
	}
	if err := checkMaxEndedBytes(cfg.MaxEndedBytes); err != nil {
		return fmt.Errorf("--max-ended-bytes %d: %w", cfg.MaxEndedBytes, err)
	}
	if cfg.MemberClaim <= 0 {
		cfg.MemberClaim = defaultMemberClaim
	}
	return nil
}

// tableConfig is the state table's configuration from a Config whose
// bounds applyTableBounds has applied.
func tableConfig(cfg *Config, now func() time.Time) statetable.Config {
	return statetable.Config{
		Self:          cfg.NodeID,
		Retention:     retentionIntervals * cfg.ResyncInterval,
		MaxLive:       cfg.MaxLiveWorkloads,
		MaxLiveBytes:  cfg.MaxLiveWorkloadBytes,
		MaxEndedBytes: cfg.MaxEndedBytes,
		MemberClaim:   cfg.MemberClaim,
		Now:           now,
		LeaseUnit:     time.Second,
	}
}

// The refusals of a frame over a bound are counted by source.

// refusedOverBound reports whether err refuses a frame for a field over its
// bound, and counts it for source (stdio, peer, ingress) when it does.
func (m *Manager) refusedOverBound(err error, source string) bool {
	if !wireframe.IsFieldTooLong(err) {
		return false
	}
	m.fieldBoundRefusals.Inc(source)
	return true
}

// refusedOverWorkloadBound reports whether err refuses a frame for its
// size, and counts it for source (stdio, peer, ingress) when it does.
func (m *Manager) refusedOverWorkloadBound(err error, source string) bool {
	if !wireframe.IsWorkloadTooLarge(err) {
		return false
	}
	m.workloadBoundRefusals.Inc(source)
	return true
}

// writeWorkloadBoundMetrics renders the workload byte bound and its
// refusals by source.
func (m *Manager) writeWorkloadBoundMetrics(t *promtext.Text) {
	t.Family("nvpair_wlm_workload_bound_refusals_total", "counter", "Frames refused because their params were over the workload byte bound (--workload-max-bytes), by source (stdio, peer, ingress).")
	t.CounterSamples("nvpair_wlm_workload_bound_refusals_total", []string{"source"}, m.workloadBoundRefusals)
	t.Single("nvpair_wlm_workload_limit_bytes", "gauge", "The most bytes a frame's params may have on every path (--workload-max-bytes).", float64(m.cfg.WorkloadMaxBytes))
}
