package main

import (
	"errors"
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
//   - the re-sync set's bytes, beside its entries: --max-live-workload-bytes;
//   - each peer queue's bytes, beside its frames: peerQueueMaxBytes.

const (
	// defaultMaxLiveWorkloadBytes bounds the bytes the re-sync set holds:
	// 100,000 workloads (the entry bound's default) of some 2.6 KiB each.
	defaultMaxLiveWorkloadBytes = 256 << 20
	// minMaxLiveWorkloadBytes is the least --max-live-workload-bytes
	// accepted: at least one frame of the largest workload bound.
	minMaxLiveWorkloadBytes = wireframe.MaxWorkloadMaxBytes
	// maxMaxLiveWorkloadBytes is the most: 1 TiB, past any node.
	maxMaxLiveWorkloadBytes = 1 << 40

	// peerQueueMaxBytes bounds the bytes of the fresh frames waiting in one
	// peer's queue, beside its peerQueueSize frames: 1,024 real frames of
	// up to 2 KiB fit, and one slow peer cannot hold more than 8 MiB of
	// frames however large each is (they held 250 MiB). A frame's line is
	// shared by every queue it is in, so N peers that all lag hold it
	// once; the bound is per peer because a queue is. A constant, like
	// peerQueueSize: the frames a queue holds are a burst waiting for one
	// peer, not something to tune per node.
	peerQueueMaxBytes = 8 << 20
)

// peerWorkloadSlack is what the peer port takes beyond the workload bound:
// what the origin may add to a frame it took at the bound before relaying
// it. Its ingress measures a producer's params as sent and then stamps the
// origin (`,"originatedFrom":"<id>"`, the id at most maxKeyFieldBytes),
// and its heartbeat adds the re-assertion marker (`"resync":true,`). A
// peer with the same bound must take all of it, or a frame a producer
// was told was accepted would be refused, for good, at every peer.
const peerWorkloadSlack = len(`,"originatedFrom":""`) + wireframe.MaxKeyFieldBytes + resyncMarkerBytes

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
	if err == nil {
		return false // the common case, without errors.As's allocation
	}
	var tooLarge *wireframe.WorkloadTooLargeError
	if !errors.As(err, &tooLarge) {
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

// writePeerQueueBytes renders the bytes waiting in each peer's queue (0
// for a peer that left) and their bound.
func writePeerQueueBytes(t *promtext.Text, stats []*peerStats, bytes map[string]int64) {
	t.Family("nvpair_wlm_peer_queue_bytes", "gauge", fmt.Sprintf("Bytes of the fresh frames waiting in a peer's queue (at most %d, beside its frames; a queue at either bound is full); 0 for a peer that left.", peerQueueMaxBytes))
	for _, s := range stats {
		t.Sample("nvpair_wlm_peer_queue_bytes", []string{"peer"}, []string{s.peer}, float64(bytes[s.peer]))
	}
	t.Single("nvpair_wlm_peer_queue_limit_bytes", "gauge", "The most bytes of fresh frames one peer's queue holds.", peerQueueMaxBytes)
}
