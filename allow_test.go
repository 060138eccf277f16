package main

import (
	"io"
	"net/http"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// TestEvery405NamesTheAllowedMethods: on each of the daemon's three HTTP
// listeners, a request with a method the path does not take is answered
// 405 with an Allow header naming the methods it does take (RFC 9110).
func TestEvery405NamesTheAllowedMethods(t *testing.T) {
	n := newMetricsNode(t, true)
	client := testkit.Mint(t, devpki.NewUUID())
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, client))
	n.start()
	peer := testkit.PeerClient(t, &client, n.ident.DER)
	cases := []struct {
		listener, method, url, allow string
		c                            *http.Client
	}{
		{"ingress", http.MethodGet, "http://" + n.m.IngressAddr() + wireframe.EventsPath, "POST", http.DefaultClient},
		{"ingress", http.MethodPut, "http://" + n.m.IngressAddr() + wireframe.EventsPath, "POST", http.DefaultClient},
		{"ingress", http.MethodDelete, "http://" + n.m.IngressAddr() + wireframe.EventsPath, "POST", http.DefaultClient},
		{"metrics", http.MethodPost, "http://" + n.m.MetricsAddr() + "/metrics", "GET, HEAD", http.DefaultClient},
		{"metrics", http.MethodDelete, "http://" + n.m.MetricsAddr() + "/metrics", "GET, HEAD", http.DefaultClient},
		{"peer", http.MethodGet, "https://" + n.m.PeerAddr().String() + wireframe.EventsPath, "POST", peer},
		{"peer", http.MethodPut, "https://" + n.m.PeerAddr().String() + wireframe.EventsPath, "POST", peer},
	}
	for _, tc := range cases {
		t.Run(tc.listener+" "+tc.method, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, tc.url, nil)
			testkit.Must(t, err)
			resp, err := tc.c.Do(req)
			testkit.Must(t, err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != tc.allow {
				t.Fatalf("%s %s: %d with Allow %q, want 405 with Allow %q", tc.method, tc.url, resp.StatusCode, resp.Header.Get("Allow"), tc.allow)
			}
		})
	}
}
