package main

import (
	"io"
	"runtime"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/pairinstall"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/wireframe"
)

// The daemon's numbers are kept by the components that produce them, as
// plain atomics (the broker writer counts its writes, the dedup its hits,
// each peer sender its deliveries); this file only adds the few labelled
// series the Manager owns and renders everything in the Prometheus text
// exposition format when the metrics endpoint is scraped.

// writeMetrics renders every metric of the daemon.
func (m *Manager) writeMetrics(w io.Writer) error {
	m.presetSeries()
	var t promtext.Text
	t.Family("nvpair_wlm_build_info", "gauge", "Build information; the value is always 1.")
	t.Sample("nvpair_wlm_build_info", []string{"version"}, []string{m.cfg.Version}, 1)

	t.Family("nvpair_wlm_frames_received_total", "counter", "Frames received, by source (stdio, peer, ingress) and method; peer and ingress frames count once they passed validation.")
	t.CounterSamples("nvpair_wlm_frames_received_total", []string{"source", "method"}, m.framesReceived)
	t.Family("nvpair_wlm_ingress_responses_total", "counter", "Ingress answers, by HTTP status code.")
	t.CounterSamples("nvpair_wlm_ingress_responses_total", []string{"code"}, m.ingressResponses)
	m.out.WriteMetrics(&t)
	m.brokerLines.WriteMetrics(&t)
	m.peers.WriteDedupMetrics(&t)
	t.Family("nvpair_wlm_field_bound_refusals_total", "counter", "Frames refused because a field was over its bound, by source (stdio, peer, ingress).")
	t.CounterSamples("nvpair_wlm_field_bound_refusals_total", []string{"source"}, m.fieldBoundRefusals)
	m.writeWorkloadBoundMetrics(&t)
	m.bcast.WriteMetrics(&t)

	m.peers.WriteBatchMetrics(&t)
	t.Single("nvpair_wlm_targets", "gauge", "Current broadcast targets.", float64(m.bcast.TargetCount()))
	t.Single("nvpair_wlm_pinned_peers", "gauge", "Peers with a valid pin in the cluster directory.", float64(m.trust.PinCount()))
	t.Single("nvpair_wlm_clustered", "gauge", "1 while this node is a clustered member (identity and an active admission or a pin), else 0.", boolGauge(m.trust.Clustered()))
	files := m.trust.FileStats()
	t.Single("nvpair_wlm_trust_reloads_total", "counter", "Reloads of the cluster directory completed (one per second).", float64(files.Reloads))
	t.Single("nvpair_wlm_cluster_file_reads_total", "counter", "Files of the cluster directory opened for reading (node.crt, node.key, admission.json, pins); flat while none of them changes.", float64(files.Reads))
	t.Family("nvpair_wlm_cluster_files_refused_total", "counter", "Files of the cluster directory refused unread, by reason: not_regular (a device, a named pipe, a directory) or too_large (over nvpair_wlm_cluster_file_limit_bytes); counted each time a changed file is refused.")
	t.Sample("nvpair_wlm_cluster_files_refused_total", []string{"reason"}, []string{"not_regular"}, float64(files.NotRegular))
	t.Sample("nvpair_wlm_cluster_files_refused_total", []string{"reason"}, []string{"too_large"}, float64(files.TooLarge))
	t.Single("nvpair_wlm_cluster_file_limit_bytes", "gauge", "The largest file the daemon reads from its cluster and app directories; larger ones are refused.", pairinstall.MaxFileBytes)
	t.Family("nvpair_wlm_tls_handshakes_total", "counter", "Completed TLS handshakes on the inter-node channel, by side.")
	t.Sample("nvpair_wlm_tls_handshakes_total", []string{"side"}, []string{"server"}, float64(m.trust.ServerHandshakes()))
	t.Sample("nvpair_wlm_tls_handshakes_total", []string{"side"}, []string{"client"}, float64(m.bcast.Handshakes.Load()))
	t.Family("nvpair_wlm_tls_handshake_failures_total", "counter", "Failed TLS handshakes on the inter-node channel, by side.")
	t.Sample("nvpair_wlm_tls_handshake_failures_total", []string{"side"}, []string{"server"}, float64(m.serverHandshakeFailures.Load()))
	t.Sample("nvpair_wlm_tls_handshake_failures_total", []string{"side"}, []string{"client"}, float64(m.bcast.HandshakeFailures.Load()))

	sz := m.table.Sizes()
	writeDeprecatedGauges(&t, float64(sz.Runs), float64(m.cfg.MaxLiveWorkloads), float64(sz.Removals))
	m.conns.WriteMetrics(&t)
	m.bodies.WriteMetrics(&t)
	m.peers.WriteOriginMetrics(&t)
	brokerio.WriteWaitersMetrics(&t, m.peerWaiters, m.ingressWaiters)
	m.writeLeaseMetrics(&t)
	m.writeTableMetrics(&t)
	m.ingressStats.WriteMetrics(&t)
	t.Single("go_goroutines", "gauge", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine()))
	promtext.WriteProcessMetrics(&t)
	_, err := w.Write(t.Bytes())
	return err
}

// boolGauge renders a yes-or-no state as a 0/1 gauge value.
func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Labelled series whose label values are known before anything happens
// are rendered from the first scrape, at zero: Prometheus' rate() and
// increase() need two samples of a series, so a series that appeared only
// with its first event would hide that event from them. Series labelled by
// peer appear when the peer does.

// lifecycleAndRemoval are the methods a peer or a producer may send.
var lifecycleAndRemoval = []string{wireframe.MethodSubmitted, wireframe.MethodStarted, wireframe.MethodCompleted, wireframe.MethodErrored, wireframe.MethodRemove}

// stdioMethods are the values knownMethod gives a broker's frames.
var stdioMethods = append(append([]string(nil), lifecycleAndRemoval...), "discovery:nodes", "log/set-level", "shutdown", "other")

// ingressCodes are the statuses the ingress answers (spec 3.5).
var ingressCodes = []string{"200", "400", "403", "404", "405", "408", "409", "413", "415", "421", "500", "503"}

// presetSeries creates, at zero, the labelled series whose label values
// are known: frames received by source and method, the field-bound and
// workload-bound refusals by source and, with the ingress on, its answers
// by code. It is idempotent, so writeMetrics calls it on every scrape.
func (m *Manager) presetSeries() {
	sources := []string{"stdio", "peer"}
	if m.ingress != nil {
		sources = append(sources, "ingress")
		for _, code := range ingressCodes {
			m.ingressResponses.Touch(code)
		}
	}
	for _, src := range sources {
		m.fieldBoundRefusals.Touch(src)
		m.workloadBoundRefusals.Touch(src)
		methods := lifecycleAndRemoval
		if src == "stdio" {
			methods = stdioMethods
		}
		for _, method := range methods {
			m.framesReceived.Touch(src, method)
		}
	}
}

// writeDeprecatedGauges renders the gauges under the names they had before
// they were given their unit (spec 3.6, renamed series): an alert on an old
// name would otherwise stop firing without a word, since a query for a
// series that is gone returns nothing rather than an error. They go in a
// later release.
func writeDeprecatedGauges(t *promtext.Text, resyncEntries, resyncLimit, removalEntries float64) {
	t.Single("nvpair_wlm_resync_set_size", "gauge", "Deprecated: use nvpair_wlm_resync_set_entries.", resyncEntries)
	t.Single("nvpair_wlm_resync_set_limit", "gauge", "Deprecated: use nvpair_wlm_resync_set_limit_entries.", resyncLimit)
	t.Single("nvpair_wlm_removal_memory_size", "gauge", "Deprecated: use nvpair_wlm_removals_held.", removalEntries)
}
