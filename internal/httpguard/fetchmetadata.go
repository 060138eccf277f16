package httpguard

import (
	"fmt"
	"net/http"
)

// Fetch Metadata (spec 3.5): a browser tells the server, in Sec-Fetch-Site
// and Sec-Fetch-Mode, who made a request and how, on every request to a
// potentially trustworthy URL, which a loopback address is. A web page
// cannot leave these headers out or set them. The Origin check (3.5,
// RefuseBrowsers) does not see a no-cors GET, which carries no Origin: a
// page could have the ingress do the work of a read-back and drop the
// answer, for the CPU it costs or for the time the answer takes. These
// headers name that request, so it is refused before any work.

// RefuseFetchMetadata returns 403 for a request a browser marks as made by
// a web page: a Sec-Fetch-Site other than "none" (none is a request the
// user started, from the address bar or a bookmark: same-origin, same-site
// and cross-site are all a page's, and the ingress serves no page of its
// own), or a Sec-Fetch-Mode of no-cors (a request whose answer the page
// may not read: no client of the ingress has a use for one). It returns 0
// for a request with neither, as every program sends: a client that is not
// a browser sends no Sec-Fetch-Site, and Node's fetch sends Sec-Fetch-Mode
// cors, which is accepted.
func RefuseFetchMetadata(h http.Header) (int, string) {
	for _, v := range h.Values("Sec-Fetch-Site") {
		if v != "none" {
			return http.StatusForbidden, fmt.Sprintf("requests from web pages are refused (Sec-Fetch-Site: %s)", ClipReason(v))
		}
	}
	for _, v := range h.Values("Sec-Fetch-Mode") {
		if v == "no-cors" {
			return http.StatusForbidden, "requests from web pages are refused (Sec-Fetch-Mode: no-cors)"
		}
	}
	return 0, ""
}
