package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/pairinstall"
	"nvpair-workload-manager/internal/wireframe"
)

// The daemon's numbers are kept by the components that produce them, as
// plain atomics (the broker writer counts its writes, the dedup its hits,
// each peer sender its deliveries); this file only adds the few labelled
// series the Manager owns and renders everything in the Prometheus text
// exposition format when the metrics endpoint is scraped.

// counterVec is a family of counters told apart by label values. The set
// of label values is bounded by the callers (known methods, status codes).
type counterVec struct {
	mu     sync.RWMutex // guards series; a leaf lock
	series map[string]*labelledCounter
}

type labelledCounter struct {
	values []string
	n      atomic.Uint64
}

func newCounterVec() *counterVec { return &counterVec{series: map[string]*labelledCounter{}} }

// inc adds one to the counter with these label values.
// It is on every frame's path: a series that exists is found under the
// read lock with a key built on the stack, with no allocation; only a new
// series takes the write lock and copies its values.
func (v *counterVec) inc(values ...string) {
	var stack [128]byte
	key := appendSeriesKey(stack[:0], values)
	v.mu.RLock()
	c := v.series[string(key)]
	v.mu.RUnlock()
	if c == nil {
		c = v.add(string(key), values)
	}
	c.n.Add(1)
}

// add returns the series for key, making it if no caller has yet.
func (v *counterVec) add(key string, values []string) *labelledCounter {
	v.mu.Lock()
	defer v.mu.Unlock()
	c := v.series[key]
	if c == nil {
		c = &labelledCounter{values: slices.Clone(values)}
		v.series[key] = c
	}
	return c
}

// appendSeriesKey appends the key of a series: its label values, each
// followed by a NUL.
func appendSeriesKey(dst []byte, values []string) []byte {
	for _, val := range values {
		dst = append(append(dst, val...), 0)
	}
	return dst
}

// get returns the counter's value, for tests.
func (v *counterVec) get(values ...string) uint64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if c := v.series[string(appendSeriesKey(nil, values))]; c != nil {
		return c.n.Load()
	}
	return 0
}

// snapshot returns the series sorted by label values.
func (v *counterVec) snapshot() []*labelledCounter {
	v.mu.Lock()
	out := make([]*labelledCounter, 0, len(v.series))
	for _, c := range v.series {
		out = append(out, c)
	}
	v.mu.Unlock()
	slices.SortFunc(out, func(a, b *labelledCounter) int { return slices.Compare(a.values, b.values) })
	return out
}

// latencyBuckets are the upper bounds, in seconds, of the delivery latency
// histogram: from a healthy LAN delivery to the retry budget of a dead peer.
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20}

// histogram is a Prometheus histogram with fixed buckets.
type histogram struct {
	mu     sync.Mutex // guards counts, sum and count; a leaf lock
	counts []uint64   // per bucket, not cumulative
	sum    float64
	count  uint64
}

func newHistogram() *histogram { return &histogram{counts: make([]uint64, len(latencyBuckets))} }

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i, _ := slices.BinarySearch(latencyBuckets, s)
	h.mu.Lock()
	if i < len(h.counts) {
		h.counts[i]++
	}
	h.sum += s
	h.count++
	h.mu.Unlock()
}

// metricsText renders the Prometheus text exposition format.
type metricsText struct{ b bytes.Buffer }

func (t *metricsText) family(name, typ, help string) {
	fmt.Fprintf(&t.b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func (t *metricsText) sample(name string, labels []string, values []string, v float64) {
	t.b.WriteString(name)
	if len(labels) > 0 {
		t.b.WriteByte('{')
		for i, l := range labels {
			if i > 0 {
				t.b.WriteByte(',')
			}
			fmt.Fprintf(&t.b, `%s="%s"`, l, escapeLabel(values[i]))
		}
		t.b.WriteByte('}')
	}
	t.b.WriteByte(' ')
	t.b.WriteString(formatValue(v))
	t.b.WriteByte('\n')
}

func (t *metricsText) single(name, typ, help string, v float64) {
	t.family(name, typ, help)
	t.sample(name, nil, nil, v)
}

func (t *metricsText) histogram(name, label, value string, h *histogram) {
	h.mu.Lock()
	counts, sum, count := slices.Clone(h.counts), h.sum, h.count
	h.mu.Unlock()
	labels, values := []string{label, "le"}, []string{value, ""}
	var cum uint64
	for i, ub := range latencyBuckets {
		cum += counts[i]
		values[1] = formatValue(ub)
		t.sample(name+"_bucket", labels, values, float64(cum))
	}
	values[1] = "+Inf"
	t.sample(name+"_bucket", labels, values, float64(count))
	t.sample(name+"_sum", labels[:1], values[:1], sum)
	t.sample(name+"_count", labels[:1], values[:1], float64(count))
}

func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

func formatValue(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// knownMethod bounds the method label: anything else is "other".
func knownMethod(m string) string {
	switch m {
	case wireframe.MethodSubmitted, wireframe.MethodStarted, wireframe.MethodCompleted, wireframe.MethodErrored, wireframe.MethodRemove,
		"discovery:nodes", "log/set-level", "shutdown":
		return m
	}
	return "other"
}

// writeMetrics renders every metric of the daemon.
func (m *Manager) writeMetrics(w io.Writer) error {
	m.presetSeries()
	var t metricsText
	t.family("nvpair_wlm_build_info", "gauge", "Build information; the value is always 1.")
	t.sample("nvpair_wlm_build_info", []string{"version"}, []string{m.cfg.Version}, 1)

	t.family("nvpair_wlm_frames_received_total", "counter", "Frames received, by source (stdio, peer, ingress) and method; peer and ingress frames count once they passed validation.")
	for _, c := range m.framesReceived.snapshot() {
		t.sample("nvpair_wlm_frames_received_total", []string{"source", "method"}, c.values, float64(c.n.Load()))
	}
	t.family("nvpair_wlm_ingress_responses_total", "counter", "Ingress answers, by HTTP status code.")
	for _, c := range m.ingressResponses.snapshot() {
		t.sample("nvpair_wlm_ingress_responses_total", []string{"code"}, c.values, float64(c.n.Load()))
	}
	t.single("nvpair_wlm_broker_writes_total", "counter", "Frames written to the broker.", float64(m.out.writes.Load()))
	t.single("nvpair_wlm_broker_write_failures_total", "counter", "Writes to the broker that failed.", float64(m.out.failures.Load()))
	t.single("nvpair_wlm_broker_lines_refused_total", "counter", "Frames not written to the broker because their line would exceed its line limit (--broker-line-max).", float64(m.out.refused.Load()))
	m.writeBrokerGroupMetrics(&t)
	m.brokerLines.writeMetrics(&t)
	t.single("nvpair_wlm_dedup_hits_total", "counter", "Peer frames not written to the broker because they were already seen.", float64(m.dedup.hits.Load()))
	t.single("nvpair_wlm_dedup_keys", "gauge", fmt.Sprintf("Keys the peer dedup remembers (at most %d).", dedupCapacity), float64(m.dedup.len()))
	t.single("nvpair_wlm_dedup_bytes", "gauge", fmt.Sprintf("Estimated heap bytes of the peer dedup's keys: %d per key, whatever the frames carried (at most %d).", dedupEntryBytes, dedupMaxBytes), float64(m.dedup.bytes()))
	t.family("nvpair_wlm_field_bound_refusals_total", "counter", "Frames refused because a field was over its bound, by source (stdio, peer, ingress).")
	for _, c := range m.fieldBoundRefusals.snapshot() {
		t.sample("nvpair_wlm_field_bound_refusals_total", []string{"source"}, c.values, float64(c.n.Load()))
	}
	m.writeWorkloadBoundMetrics(&t)
	t.single("nvpair_wlm_outbound_frames_queued_total", "counter", "Frames queued for the peers at the ordered enqueue point.", float64(m.bcast.queued.Load()))
	t.single("nvpair_wlm_outbound_frames_dropped_total", "counter", "Frames dropped because the outbound queue was full.", float64(m.bcast.dropped.Load()))
	t.single("nvpair_wlm_outbound_queue_frames", "gauge", fmt.Sprintf("Frames waiting at the ordered enqueue point for the dispatcher (at most %d).", outboundQueueSize), float64(len(m.bcast.queue)))

	stats := m.bcast.peerStatsSnapshot()
	perPeer := []struct {
		name, kind, help string
		get              func(*peerStats) uint64
	}{
		{"nvpair_wlm_peer_deliveries_succeeded_total", "counter", "Frames delivered to a peer.", func(s *peerStats) uint64 { return s.succeeded.Load() }},
		{"nvpair_wlm_peer_delivery_failures_total", "counter", "Failed delivery attempts to a peer.", func(s *peerStats) uint64 { return s.failedAttempts.Load() }},
		{"nvpair_wlm_peer_delivery_retries_total", "counter", "Delivery attempts to a peer that were retries.", func(s *peerStats) uint64 { return s.retries.Load() }},
		{"nvpair_wlm_peer_deliveries_dropped_total", "counter", "Frames given up for a peer after their last attempt.", func(s *peerStats) uint64 { return s.dropped.Load() }},
		{"nvpair_wlm_peer_queue_dropped_total", "counter", "Frames dropped for a peer because its queue was full.", func(s *peerStats) uint64 { return s.queueDropped.Load() }},
		{"nvpair_wlm_peer_batches_sent_total", "counter", "Batch requests sent to a peer that advertised batches.", func(s *peerStats) uint64 { return s.batchesSent.Load() }},
		{"nvpair_wlm_peer_batch_frames_sent_total", "counter", "Frames sent to a peer inside batches (fresh frames and re-assertions).", func(s *peerStats) uint64 { return s.batchFramesSent.Load() }},
		{"nvpair_wlm_heartbeat_passes_started_total", "counter", "Heartbeat passes over the re-sync set started for a peer (the first is its backfill).", func(s *peerStats) uint64 { return s.passesStarted.Load() }},
		{"nvpair_wlm_heartbeat_passes_completed_total", "counter", "Heartbeat passes that reached the end of the re-sync set for a peer.", func(s *peerStats) uint64 { return s.passesCompleted.Load() }},
		{"nvpair_wlm_heartbeat_passes_overrun_total", "counter", "Heartbeat passes for a peer that took longer than the re-sync interval.", func(s *peerStats) uint64 { return s.passesOverrun.Load() }},
		{"nvpair_wlm_heartbeat_passes_abandoned_total", "counter", "Heartbeat passes for a peer ended early because it failed a re-assertion; the next pass repeats them.", func(s *peerStats) uint64 { return s.passesAbandoned.Load() }},
		{"nvpair_wlm_heartbeat_reasserted_total", "counter", "Re-assertions delivered to a peer.", func(s *peerStats) uint64 { return s.reasserted.Load() }},
		{"nvpair_wlm_heartbeat_reassert_failures_total", "counter", "Re-assertions a peer did not accept; the next pass repeats them.", func(s *peerStats) uint64 { return s.reassertFailures.Load() }},
		{"nvpair_wlm_heartbeat_pass_progress_entries", "gauge", "Entries the heartbeat pass under way (or the last one) has visited for a peer.", func(s *peerStats) uint64 { return s.passProgress.Load() }},
		{"nvpair_wlm_heartbeat_pass_size_entries", "gauge", "Entries the re-sync set held when a peer's current (or last) heartbeat pass started.", func(s *peerStats) uint64 { return s.passSize.Load() }},
	}
	for _, f := range perPeer {
		t.family(f.name, f.kind, f.help)
		for _, s := range stats {
			t.sample(f.name, []string{"peer"}, []string{s.peer}, float64(f.get(s)))
		}
	}
	writeRetryAfterMetrics(&t, stats)
	depths := m.bcast.peerQueueDepths()
	t.family("nvpair_wlm_peer_queue_frames", "gauge", fmt.Sprintf("Fresh frames waiting in a peer's queue for delivery (at most %d; a full queue drops the newest); 0 for a peer that left.", peerQueueSize))
	for _, s := range stats {
		t.sample("nvpair_wlm_peer_queue_frames", []string{"peer"}, []string{s.peer}, float64(depths[s.peer]))
	}
	writePeerQueueBytes(&t, stats, m.bcast.peerQueueBytes())
	t.family("nvpair_wlm_peer_delivery_latency_seconds", "histogram", "Time from queueing a frame to its successful delivery to a peer.")
	for _, s := range stats {
		t.histogram("nvpair_wlm_peer_delivery_latency_seconds", "peer", s.peer, s.latency)
	}

	t.single("nvpair_wlm_peer_batches_received_total", "counter", "Batch requests processed on the peer port.", float64(m.batchesReceived.Load()))
	t.single("nvpair_wlm_peer_batch_frames_received_total", "counter", "Elements of the batches processed on the peer port.", float64(m.batchFramesReceived.Load()))
	t.single("nvpair_wlm_targets", "gauge", "Current broadcast targets.", float64(m.bcast.targetCount()))
	t.single("nvpair_wlm_pinned_peers", "gauge", "Peers with a valid pin in the cluster directory.", float64(m.trust.PinCount()))
	t.single("nvpair_wlm_clustered", "gauge", "1 while this node is a clustered member (identity and an active admission or a pin), else 0.", boolGauge(m.trust.Clustered()))
	files := m.trust.FileStats()
	t.single("nvpair_wlm_trust_reloads_total", "counter", "Reloads of the cluster directory completed (one per second).", float64(files.Reloads))
	t.single("nvpair_wlm_cluster_file_reads_total", "counter", "Files of the cluster directory opened for reading (node.crt, node.key, admission.json, pins); flat while none of them changes.", float64(files.Reads))
	t.family("nvpair_wlm_cluster_files_refused_total", "counter", "Files of the cluster directory refused unread, by reason: not_regular (a device, a named pipe, a directory) or too_large (over nvpair_wlm_cluster_file_limit_bytes); counted each time a changed file is refused.")
	t.sample("nvpair_wlm_cluster_files_refused_total", []string{"reason"}, []string{"not_regular"}, float64(files.NotRegular))
	t.sample("nvpair_wlm_cluster_files_refused_total", []string{"reason"}, []string{"too_large"}, float64(files.TooLarge))
	t.single("nvpair_wlm_cluster_file_limit_bytes", "gauge", "The largest file the daemon reads from its cluster and app directories; larger ones are refused.", pairinstall.MaxFileBytes)
	t.family("nvpair_wlm_tls_handshakes_total", "counter", "Completed TLS handshakes on the inter-node channel, by side.")
	t.sample("nvpair_wlm_tls_handshakes_total", []string{"side"}, []string{"server"}, float64(m.trust.ServerHandshakes()))
	t.sample("nvpair_wlm_tls_handshakes_total", []string{"side"}, []string{"client"}, float64(m.bcast.handshakes.Load()))
	t.family("nvpair_wlm_tls_handshake_failures_total", "counter", "Failed TLS handshakes on the inter-node channel, by side.")
	t.sample("nvpair_wlm_tls_handshake_failures_total", []string{"side"}, []string{"server"}, float64(m.serverHandshakeFailures.Load()))
	t.sample("nvpair_wlm_tls_handshake_failures_total", []string{"side"}, []string{"client"}, float64(m.bcast.handshakeFailures.Load()))

	m.activeMu.Lock()
	resyncSize, removedSize, resyncBytes := m.resync.len(), m.removed.len(), m.resync.size()
	m.activeMu.Unlock()
	t.single("nvpair_wlm_resync_set_entries", "gauge", "Workload runs held in the re-sync set.", float64(resyncSize))
	t.single("nvpair_wlm_resync_set_limit_entries", "gauge", "The most workload runs the re-sync set may hold (--max-live-workloads).", float64(m.resync.limit))
	t.single("nvpair_wlm_resync_set_bytes", "gauge", "Bytes of the re-assertion lines the re-sync set holds.", float64(resyncBytes))
	t.single("nvpair_wlm_resync_set_limit_bytes", "gauge", "The most bytes of re-assertion lines the re-sync set may hold (--max-live-workload-bytes).", float64(m.resync.maxBytes))
	t.single("nvpair_wlm_resync_untracked_total", "counter", "Broker frames relayed but not tracked because the re-sync set was full, in entries (a new workload) or in bytes.", float64(m.resyncUntracked.Load()))
	t.single("nvpair_wlm_removal_memory_entries", "gauge", "Ingress removals remembered against a replay.", float64(removedSize))
	writeDeprecatedGauges(&t, float64(resyncSize), float64(m.resync.limit), float64(removedSize))
	m.conns.writeMetrics(&t)
	m.bodies.writeMetrics(&t)
	m.origins.writeMetrics(&t)
	writeBrokerWaitersMetrics(&t, m.peerWaiters, m.ingressWaiters)
	m.writeLeaseMetrics(&t)
	m.writeReadBackMetrics(&t)
	t.single("go_goroutines", "gauge", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine()))
	writeProcessMetrics(&t)
	_, err := w.Write(t.b.Bytes())
	return err
}

// boolGauge renders a yes-or-no state as a 0/1 gauge value.
func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
