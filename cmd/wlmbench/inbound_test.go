package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
)

func TestPeerFramesAreDistinctWorkloadsOfThePeersOwnOrigin(t *testing.T) {
	ids := []devpki.Identity{{Principal: "node-a"}, {Principal: "node-b"}}
	body := peerBody(ids, "in4-0")
	seen := map[string]bool{}
	for peer := range ids {
		for n := range 3 {
			var f struct {
				JSONRPC, Method string
				Params          struct {
					WorkloadInfo map[string]any
				}
			}
			if err := json.Unmarshal(body(nil, peer, n), &f); err != nil {
				t.Fatalf("peer %d frame %d is not JSON: %v", peer, n, err)
			}
			wi := f.Params.WorkloadInfo
			if f.JSONRPC != "2.0" || f.Method != "workload:started" || wi["state"] != "running" || wi["seq"] != 1.0 {
				t.Errorf("peer %d frame %d: %+v", peer, n, f)
			}
			if wi["originatedFrom"] != ids[peer].Principal {
				t.Errorf("peer %d frame %d: originatedFrom %v, want the peer's own %s", peer, n, wi["originatedFrom"], ids[peer].Principal)
			}
			id := wi["id"].(string)
			if seen[id] || wi["runId"] != id {
				t.Errorf("peer %d frame %d: workload %q repeated or runId %v differs", peer, n, id, wi["runId"])
			}
			seen[id] = true
		}
	}
}

// ceilingRequest is a request as the inbound ceiling's handler sees it
// after the TLS handshake, presenting the certificate der.
func ceilingRequest(der []byte, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, ingressPath, strings.NewReader(body))
	r.TLS = &tls.ConnectionState{}
	if der != nil {
		r.TLS.PeerCertificates = []*x509.Certificate{{Raw: der}}
	}
	return r
}

func TestInboundCeilingWritesOnlyPinnedValidFramesAsLines(t *testing.T) {
	pinned, other := []byte("pinned-der"), []byte("other-der")
	var out strings.Builder
	h := &inboundCeiling{pins: map[string]bool{string(pinned): true}, out: &out}
	frame := string(appendPeerFrame(nil, "node-a", "in1-0", 0, 0))
	for _, tc := range []struct {
		name   string
		der    []byte
		body   string
		status int
	}{
		{"a pinned peer's frame is written", pinned, frame, http.StatusOK},
		{"an unpinned certificate is refused", other, frame, http.StatusForbidden},
		{"no certificate is refused", nil, frame, http.StatusForbidden},
		{"a body that is not JSON is refused", pinned, "{nope", http.StatusBadRequest},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, ceilingRequest(tc.der, tc.body))
		if w.Code != tc.status {
			t.Errorf("%s: status %d, want %d", tc.name, w.Code, tc.status)
		}
	}
	if out.String() != frame+"\n" {
		t.Errorf("stdout = %q, want the one accepted frame as a line", out.String())
	}
}

func TestDaemonPeerPortComesFromItsStartedLine(t *testing.T) {
	d := &daemon{name: "t", ingress: make(chan string, 1), peer: make(chan string, 1)}
	log := `time=2026-12-03T08:28:28.266Z level=INFO msg="cluster membership" clustered=true
time=2026-12-03T08:28:28.266Z level=INFO msg=started nodeId=abc nodeIdFile=/tmp/x/node-id.json version=dev peerAddr=[::]:45927
`
	d.parseStderr(strings.NewReader(log), io.Discard)
	port, err := d.peerPort(time.Second)
	if err != nil || port != 45927 {
		t.Fatalf("peerPort = %d, %v; want 45927", port, err)
	}
	if _, err := d.peerPort(10 * time.Millisecond); err == nil {
		t.Fatal("a second peerPort without a started line did not time out")
	}
}
