package main

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/gcpace"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/pairinstall"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// The daemon's numbers are kept by the components that produce them, as
// plain atomics (the broker writer counts its writes, the dedup its hits,
// each peer sender its deliveries); this file only adds the few labelled
// series the Manager owns and renders everything in the Prometheus text
// exposition format when the metrics endpoint is scraped.

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

// stdioMethods are the values wireframe.MetricMethod gives a broker's frames.
var stdioMethods = append(append([]string(nil), lifecycleAndRemoval...), "discovery:nodes", "log/set-level", "shutdown", "other")

// ingressCodes are the statuses the ingress answers (spec 3.5).
var ingressCodes = []string{"200", "400", "403", "404", "405", "408", "409", "413", "415", "421", "500", "503"}

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

// metricsIdleTimeout is how long the metrics endpoint keeps an idle
// connection from a scraper.
const metricsIdleTimeout = ingress.IdleTimeout

// metricsEndpoint serves GET /metrics in the Prometheus text format on a
// loopback address, with the same refusal of browsers as the ingress: the
// numbers are harmless, but a page must not read them either.
type metricsEndpoint struct {
	*httpguard.LoopbackBinding
	write   func(w io.Writer) error // renders every metric of the daemon
	log     *slog.Logger
	rejects *httpguard.SourceLog // its refusals, rate-limited per source
}

func (e *metricsEndpoint) Start(wg *sync.WaitGroup, ln net.Listener) *http.Server {
	return e.Serve(wg, ln, e, metricsIdleTimeout, e.log)
}

func (e *metricsEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	status, reason := e.RefuseBrowsers(r)
	switch {
	case status != 0:
	case r.URL.Path != "/metrics":
		status, reason = http.StatusNotFound, "no such endpoint; GET /metrics"
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		w.Header().Set("Allow", "GET, HEAD")
		status, reason = http.StatusMethodNotAllowed, "method must be GET or HEAD"
	}
	if status != 0 {
		reason = httpguard.ClipReason(reason) // it may quote the Host
		e.rejects.Log(e.log, slog.LevelWarn, r.RemoteAddr, status, "metrics request rejected", "status", status, "reason", reason)
		httpguard.Answer(w, status, reason)
		return
	}
	var b bytes.Buffer
	if err := e.write(&b); err != nil {
		httpguard.Answer(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(b.Bytes())
	}
}

// The loopback endpoint and every series it renders.

// EnableMetrics turns the metrics endpoint on at addr. It must be called
// before Run, which binds it. A non-loopback address is refused.
func (m *Manager) EnableMetrics(addr string) error {
	b, err := httpguard.NewLoopbackBinding("metrics endpoint", addr, m.conns.Metrics)
	if err != nil {
		return err
	}
	m.metrics = &metricsEndpoint{LoopbackBinding: b, write: m.writeMetrics, log: m.log, rejects: httpguard.NewSourceLog()}
	return nil
}

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
	gc := gcpace.ReadCollectorStats()
	t.Single("go_gc_cycles_total_gc_cycles_total", "counter", "Completed garbage collection cycles.", float64(gc.Cycles))
	t.Single("go_cpu_classes_gc_total_cpu_seconds_total", "counter", "Estimated CPU time the collector spent (the runtime's estimate: its workers, assists and idle marking).", gc.CPUSeconds)
	t.Single("nvpair_wlm_gc_percent", "gauge", "The collector's GOGC in force: 100 for a small heap, lower as the live heap grows (spec 4.1), or the operator's GOGC; -1 for off.", float64(m.cfg.Pacer.Current()))
	promtext.WriteProcessMetrics(&t)
	_, err := w.Write(t.Bytes())
	return err
}

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

// writeTableMetrics renders the state table's gauges, counters and bounds.
func (m *Manager) writeTableMetrics(t *promtext.Text) {
	sz := m.table.Sizes()
	st := m.table.Stats()
	t.Single("nvpair_wlm_resync_set_entries", "gauge", "Workload runs this node re-asserts: live ones, and ended ones within their retention.", float64(sz.Runs))
	t.Single("nvpair_wlm_resync_set_limit_entries", "gauge", "The most workload runs re-asserted at once (--max-live-workloads).", float64(m.cfg.MaxLiveWorkloads))
	t.Single("nvpair_wlm_resync_set_bytes", "gauge", "Bytes of the re-assertion lines of those runs.", float64(sz.RunBytes))
	t.Single("nvpair_wlm_resync_set_limit_bytes", "gauge", "The most bytes of re-assertion lines held (--max-live-workload-bytes).", float64(m.cfg.MaxLiveWorkloadBytes))
	t.Single("nvpair_wlm_resync_untracked_total", "counter", "Broker frames not relayed because the state table was at a bound, in runs (a new workload) or in bytes.", float64(st.Untracked.Load()))
	t.Single("nvpair_wlm_ends_bytes", "gauge", "Bytes of the ends (ended runs and removals) this node keeps until every member has them.", float64(sz.EndedBytes))
	t.Single("nvpair_wlm_ends_limit_bytes", "gauge", "The most bytes of ends kept (--max-ended-bytes); past it the oldest goes first.", float64(m.cfg.MaxEndedBytes))
	t.Single("nvpair_wlm_ends_evicted_total", "counter", "Ends taken out at the byte bound; one a member lacked is kept in its small form until it has it.", float64(st.Evicted.Load()))
	t.Single("nvpair_wlm_ends_kept_small_total", "counter", "Ends evicted at the byte bound while a member lacked them, kept in their small form (the run's key, state, seq and times).", float64(st.Compacted.Load()))
	t.Single("nvpair_wlm_ends_small", "gauge", "Ends kept in their small form until every member has them.", float64(sz.EndKeys))
	t.Single("nvpair_wlm_ends_small_bytes", "gauge", "Bytes of the ends kept in their small form, each its line, key and 256 bytes.", float64(sz.EndKeyBytes))
	t.Single("nvpair_wlm_ends_small_limit_bytes", "gauge", "The most bytes of ends kept in their small form: the larger of --max-ended-bytes and 16 MiB.", float64(max(m.cfg.MaxEndedBytes, statetable.DefaultMinEndKeyBytes)))
	t.Single("nvpair_wlm_ends_small_evicted_total", "counter", "Small ends dropped at their bound before every member had them; such a member is sent the whole table.", float64(st.KeysEvicted.Load()))
	t.Single("nvpair_wlm_ends_unheld_bytes", "gauge", "Bytes of the removals of workloads this node held no run of, kept within an eighth of --max-ended-bytes of their own.", float64(sz.UnheldBytes))
	t.Single("nvpair_wlm_ends_unheld_evicted_total", "counter", "Removals of workloads this node held no run of, dropped at their own bound before every member had them.", float64(st.EvictedUnheld.Load()))
	t.Single("nvpair_wlm_ends_forgotten_total", "counter", "Ends forgotten once every member had them and their retention had passed.", float64(st.Forgotten.Load()))
	t.Single("nvpair_wlm_removals_held", "gauge", "Removal tombstones held.", float64(sz.Removals))
	t.Single("nvpair_wlm_members", "gauge", "Members this node keeps a mark for: targets, and nodes that left within their claim.", float64(sz.Members))
	t.Single("nvpair_wlm_member_claims_expired_total", "counter", "Members forgotten because they stayed away past their claim.", float64(st.ClaimsExpired.Load()))
	t.Single("nvpair_wlm_members_gone", "gauge", "Members that left discovery and still hold their claim.", float64(sz.GoneMembers))
	t.Single("nvpair_wlm_members_gone_bytes", "gauge", "What the members that left take: their ids and about 256 bytes each.", float64(sz.GoneBytes))
	t.Single("nvpair_wlm_members_gone_limit", "gauge", "The most members that left kept; past it, or past the byte limit, the one that left longest ago is forgotten.", float64(statetable.DefaultMaxGoneMembers))
	t.Single("nvpair_wlm_members_gone_limit_bytes", "gauge", "The most bytes of members that left kept.", float64(statetable.DefaultMaxGoneBytes))
	t.Single("nvpair_wlm_members_gone_dropped_total", "counter", "Members that left, forgotten at the bound on their count or bytes before their claim ran out.", float64(st.GoneDropped.Load()))
	t.Single("nvpair_wlm_members_gone_replaced_total", "counter", "Members that left, forgotten when their node came back under a new hostUuid with the same principal.", float64(st.GoneReplaced.Load()))
	t.Single("nvpair_wlm_member_marks_written_total", "counter", "Members' marks written to the journal, together once per prune tick.", float64(st.MarksWritten.Load()))
	t.Single("nvpair_wlm_ingress_ownership_refusals_total", "counter", "Ingress frames refused 409 because they named a workload the broker owns.", float64(st.Refused409.Load()))
	t.Single("nvpair_wlm_ingress_marks_enabled", "gauge", "1 when this node marks its ingress frames to the broker (it has its ingress mark key), else 0.", boolGauge(m.marker != nil))
	t.Single("nvpair_wlm_ingress_replay_claims_total", "counter", "Broker replays of an ingress job the journal did not hold, made its producer's again by their ingress mark.", float64(m.replayClaims.Load()))
	t.Single("nvpair_wlm_ingress_marks_unchecked_total", "counter", "Broker frames carrying an ingress mark this node did not make; the mark is cut out and the workload is the broker's.", float64(m.marksUnchecked.Load()))
	m.journal.writeMetrics(t)
}
