package main

import (
	"net/http"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// A request a browser marks as a web page's, by its Fetch Metadata, is
// refused 403 on every ingress path, after the Origin and Host checks and
// before anything else: no frame is taken, no entry of the set looked at.
// What programs send (no Fetch Metadata, or Node's fetch with
// Sec-Fetch-Mode cors) passes.
func TestFetchMetadataOfAPageIsRefusedOnEveryIngressPathBeforeAnyWork(t *testing.T) {
	n, _ := readBackNode(t)
	addr := n.m.IngressAddr()
	postLeased(t, n, leasedInfo("fm-job", "running", 1), 0)
	frame := string(testframe.Lifecycle(leasedInfo("fm-job", "running", 2), nil))
	port := addr[strings.LastIndexByte(addr, ':')+1:]

	type path struct {
		name string
		send func(headers ...string) (int, string)
	}
	paths := []path{
		{"events", func(h ...string) (int, string) { return testkit.PostIngress(t, addr, frame, h...) }},
		{"read-back", func(h ...string) (int, string) {
			st, _, body := testkit.GetReadBack(t, addr, "requesterId=lease-test&limit=1", h...)
			return st, strings.TrimSpace(string(body))
		}},
		{"node", func(h ...string) (int, string) {
			st, _, body := testkit.GetNodeInfo(t, addr, "", h...)
			return st, strings.TrimSpace(string(body))
		}},
		{"unknown path", func(h ...string) (int, string) {
			rq := testkit.Request{Method: http.MethodGet, Path: "/v1/other", Header: http.Header{}}
			for i := 0; i+1 < len(h); i += 2 {
				rq.Header.Add(h[i], h[i+1])
			}
			return testkit.MustDo(t, addr, rq)
		}},
	}
	refused := []struct {
		name    string
		headers []string
		reason  string
	}{
		{"no-cors GET from another site", []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "no-cors", "Sec-Fetch-Dest", "empty"}, "(Sec-Fetch-Site: cross-site)"},
		{"another port of 127.0.0.1 (same-site)", []string{"Sec-Fetch-Site", "same-site", "Sec-Fetch-Mode", "cors"}, "(Sec-Fetch-Site: same-site)"},
		{"same-origin", []string{"Sec-Fetch-Site", "same-origin", "Sec-Fetch-Mode", "same-origin"}, "(Sec-Fetch-Site: same-origin)"},
		{"a top-level navigation from a page", []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate"}, "(Sec-Fetch-Site: cross-site)"},
		{"an unknown site value", []string{"Sec-Fetch-Site", "elsewhere"}, "(Sec-Fetch-Site: elsewhere)"},
		{"an empty site value", []string{"Sec-Fetch-Site", ""}, "(Sec-Fetch-Site: )"},
		{"none with a page's value beside it", []string{"Sec-Fetch-Site", "none", "Sec-Fetch-Site", "cross-site"}, "(Sec-Fetch-Site: cross-site)"},
		{"no-cors mode alone", []string{"Sec-Fetch-Mode", "no-cors"}, "(Sec-Fetch-Mode: no-cors)"},
	}
	accepted := []struct {
		name    string
		headers []string
	}{
		{"no Fetch Metadata (curl, Python, Go)", nil},
		{"Node's fetch: Sec-Fetch-Mode cors, no site", []string{"Sec-Fetch-Mode", "cors"}},
		{"a request the user started (address bar)", []string{"Sec-Fetch-Site", "none", "Sec-Fetch-Mode", "navigate"}},
	}

	for _, p := range paths {
		for _, c := range refused {
			t.Run(p.name+"/"+c.name, func(t *testing.T) {
				refusedBefore, scannedBefore := n.m.ingressStats.FetchMetadataRefused(), n.m.ingressStats.Scanned()
				received := n.m.framesReceived.Get("ingress", wireframe.MethodStarted)
				st, text := p.send(c.headers...)
				if st != http.StatusForbidden || text != "requests from web pages are refused "+c.reason {
					t.Fatalf("%d %q, want 403 naming %s", st, text, c.reason)
				}
				if got := n.m.ingressStats.FetchMetadataRefused() - refusedBefore; got != 1 {
					t.Errorf("nvpair_wlm_ingress_fetch_metadata_refusals_total moved by %d, want 1", got)
				}
				if n.m.ingressStats.Scanned() != scannedBefore || n.m.framesReceived.Get("ingress", wireframe.MethodStarted) != received {
					t.Errorf("the refused request did work: entries looked at %d -> %d, frames received %d -> %d",
						scannedBefore, n.m.ingressStats.Scanned(), received, n.m.framesReceived.Get("ingress", wireframe.MethodStarted))
				}
			})
		}
		for _, c := range accepted {
			t.Run(p.name+"/"+c.name, func(t *testing.T) {
				st, text := p.send(c.headers...)
				want := http.StatusOK
				if p.name == "unknown path" {
					want = http.StatusNotFound
				}
				if st != want {
					t.Fatalf("%d %q, want %d", st, text, want)
				}
			})
		}
	}

	// Origin and Host are checked first, as before: their answers do not
	// change when Fetch Metadata comes with them.
	before := n.m.ingressStats.FetchMetadataRefused()
	if st, text := testkit.PostIngress(t, addr, frame, "Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"); st != http.StatusForbidden || !strings.Contains(text, "Origin header") {
		t.Errorf("Origin and Fetch Metadata: %d %q, want the Origin check's 403", st, text)
	}
	if st, _, body := testkit.GetReadBack(t, addr, "", "Host", "rebind.example:"+port, "Sec-Fetch-Site", "same-origin"); st != http.StatusMisdirectedRequest {
		t.Errorf("a rebinding page's read-back: %d %s, want the Host check's 421", st, body)
	}
	if got := n.m.ingressStats.FetchMetadataRefused(); got != before {
		t.Errorf("requests the Origin or Host check refused counted as Fetch Metadata refusals: %d -> %d", before, got)
	}
}
