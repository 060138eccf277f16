package main

import (
	"fmt"

	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/wireframe"
)

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

const (
	// defaultMaxLiveWorkloadBytes bounds the bytes the re-sync set holds:
	// 100,000 workloads (the entry bound's default) of some 2.6 KiB each.
	defaultMaxLiveWorkloadBytes = 256 << 20
	// minMaxLiveWorkloadBytes is the least --max-live-workload-bytes
	// accepted: at least one frame of the largest workload bound.
	minMaxLiveWorkloadBytes = wireframe.MaxWorkloadMaxBytes
	// maxMaxLiveWorkloadBytes is the most: 1 TiB, past any node.
	maxMaxLiveWorkloadBytes = 1 << 40
)

// checkMaxLiveWorkloadBytes refuses a --max-live-workload-bytes outside
// its range.
func checkMaxLiveWorkloadBytes(n int64) error {
	if n < minMaxLiveWorkloadBytes || n > maxMaxLiveWorkloadBytes {
		return fmt.Errorf("must be between %d and %d bytes", int64(minMaxLiveWorkloadBytes), int64(maxMaxLiveWorkloadBytes))
	}
	return nil
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
