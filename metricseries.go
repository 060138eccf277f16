package main

import "nvpair-workload-manager/internal/wireframe"

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
var ingressCodes = []string{"200", "400", "403", "404", "405", "413", "415", "421", "500", "503"}

// presetSeries creates, at zero, the labelled series whose label values
// are known: frames received by source and method, the field-bound and
// workload-bound refusals by source and, with the ingress on, its answers
// by code. It is idempotent, so writeMetrics calls it on every scrape.
func (m *Manager) presetSeries() {
	sources := []string{"stdio", "peer"}
	if m.ingress != nil {
		sources = append(sources, "ingress")
		for _, code := range ingressCodes {
			m.ingressResponses.touch(code)
		}
	}
	for _, src := range sources {
		m.fieldBoundRefusals.touch(src)
		m.workloadBoundRefusals.touch(src)
		methods := lifecycleAndRemoval
		if src == "stdio" {
			methods = stdioMethods
		}
		for _, method := range methods {
			m.framesReceived.touch(src, method)
		}
	}
}

// touch creates the counter with these label values, at zero, when it
// does not exist yet.
func (v *counterVec) touch(values ...string) {
	v.add(string(appendSeriesKey(nil, values)), values)
}

// writeDeprecatedGauges renders the gauges under the names they had before
// they were given their unit (spec 3.6, renamed series): an alert on an old
// name would otherwise stop firing without a word, since a query for a
// series that is gone returns nothing rather than an error. They go in a
// later release.
func writeDeprecatedGauges(t *metricsText, resyncEntries, resyncLimit, removalEntries float64) {
	t.single("nvpair_wlm_resync_set_size", "gauge", "Deprecated: use nvpair_wlm_resync_set_entries.", resyncEntries)
	t.single("nvpair_wlm_resync_set_limit", "gauge", "Deprecated: use nvpair_wlm_resync_set_limit_entries.", resyncLimit)
	t.single("nvpair_wlm_removal_memory_size", "gauge", "Deprecated: use nvpair_wlm_removal_memory_entries.", removalEntries)
}
