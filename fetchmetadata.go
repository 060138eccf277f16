package main

import (
	"fmt"
	"net/http"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/promtext"
)

// Fetch Metadata (spec 3.5): a browser tells the server, in Sec-Fetch-Site
// and Sec-Fetch-Mode, who made a request and how, on every request to a
// potentially trustworthy URL, which a loopback address is. A web page
// cannot leave these headers out or set them. The Origin check (3.5,
// loopback.go) does not see a no-cors GET, which carries no Origin: a page
// could have the ingress do the work of a read-back (readback.go) and drop
// the answer, for the CPU it costs or for the time the answer takes. These
// headers name that request, so it is refused before any work.

// refuseFetchMetadata returns 403 for a request a browser marks as made by
// a web page: a Sec-Fetch-Site other than "none" (none is a request the
// user started, from the address bar or a bookmark: same-origin, same-site
// and cross-site are all a page's, and the ingress serves no page of its
// own), or a Sec-Fetch-Mode of no-cors (a request whose answer the page
// may not read: no client of the ingress has a use for one). It returns 0
// for a request with neither, as every program sends: a client that is not
// a browser sends no Sec-Fetch-Site, and Node's fetch sends Sec-Fetch-Mode
// cors, which is accepted.
func refuseFetchMetadata(h http.Header) (int, string) {
	for _, v := range h.Values("Sec-Fetch-Site") {
		if v != "none" {
			return http.StatusForbidden, fmt.Sprintf("requests from web pages are refused (Sec-Fetch-Site: %s)", httpguard.ClipReason(v))
		}
	}
	for _, v := range h.Values("Sec-Fetch-Mode") {
		if v == "no-cors" {
			return http.StatusForbidden, "requests from web pages are refused (Sec-Fetch-Mode: no-cors)"
		}
	}
	return 0, ""
}

// refusePages applies the ingress's browser checks, in order: Origin (403)
// and Host (421) as on every loopback listener, then Fetch Metadata (403),
// counted. It returns 0 when none applies. Every ingress path runs it
// first, before it reads a body or looks at the re-sync set.
func (li *localIngress) refusePages(r *http.Request) (int, string) {
	if status, reason := li.refuseBrowsers(r); status != 0 {
		return status, reason
	}
	status, reason := refuseFetchMetadata(r.Header)
	if status != 0 {
		li.m.readBacks.fetchMetadataRefused.Add(1)
	}
	return status, reason
}

// writeFetchMetadataMetrics renders the count of ingress requests refused
// by their Fetch Metadata.
func (m *Manager) writeFetchMetadataMetrics(t *promtext.Text) {
	n := m.readBacks.fetchMetadataRefused.Load()
	t.Single("nvpair_wlm_ingress_fetch_metadata_refusals_total", "counter", "Ingress requests refused 403 because a browser marked them as a web page's (Sec-Fetch-Site other than none, or Sec-Fetch-Mode no-cors).", float64(n))
}
