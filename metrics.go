package main

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/promtext"
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
