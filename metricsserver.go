package main

import (
	"bytes"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
)

// metricsIdleTimeout is how long the metrics endpoint keeps an idle
// connection from a scraper.
const metricsIdleTimeout = ingress.IdleTimeout

// metricsEndpoint serves GET /metrics in the Prometheus text format on a
// loopback address, with the same refusal of browsers as the ingress: the
// numbers are harmless, but a page must not read them either.
type metricsEndpoint struct {
	*httpguard.LoopbackBinding
	m       *Manager
	rejects *httpguard.SourceLog // its refusals, rate-limited per source
}

// EnableMetrics turns the metrics endpoint on at addr. It must be called
// before Run, which binds it. A non-loopback address is refused.
func (m *Manager) EnableMetrics(addr string) error {
	b, err := httpguard.NewLoopbackBinding("metrics endpoint", addr, m.conns.Metrics)
	if err != nil {
		return err
	}
	m.metrics = &metricsEndpoint{LoopbackBinding: b, m: m, rejects: httpguard.NewSourceLog()}
	return nil
}

// MetricsAddr returns the metrics endpoint's bound address, or "".
func (m *Manager) MetricsAddr() string {
	if m.metrics == nil {
		return ""
	}
	return m.metrics.BoundAddr()
}

func (e *metricsEndpoint) Start(wg *sync.WaitGroup, ln net.Listener) *http.Server {
	return e.Serve(wg, ln, e, metricsIdleTimeout, e.m.log)
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
		e.rejects.Log(e.m.log, slog.LevelWarn, r.RemoteAddr, status, "metrics request rejected", "status", status, "reason", reason)
		httpguard.Answer(w, status, reason)
		return
	}
	var b bytes.Buffer
	if err := e.m.writeMetrics(&b); err != nil {
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
