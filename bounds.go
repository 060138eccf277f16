package main

import (
	"fmt"

	"nvpair-workload-manager/internal/wireframe"
)

// Field bounds. Every string that identifies a workload or one of its
// events is at most wireframe.MaxKeyFieldBytes (internal/wireframe/workloadtypes.go, checked by the
// parse step the local channel, the ingress and the peer port share), and
// the ingress bounds a producer's error text too (internal/wireframe/ingressframe.go). A frame
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
