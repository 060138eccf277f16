package main

// Benchmarks of the inbound peer path: the frame parser alone, the peer
// port's handler in process (no sockets: the figures are the daemon's own
// work per frame, allocations included), and the real mTLS port end to end.

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/peerserver"
	"nvpair-workload-manager/internal/wireframe"
)

// benchPeerFrame appends a peer's single frame: workload n of origin, as a
// stock daemon relays it (compact, origin stamped).
func benchPeerFrame(buf []byte, origin string, n int64) []byte {
	buf = append(buf, `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"peer-job-`...)
	buf = strconv.AppendInt(buf, n, 10)
	buf = append(buf, `","runId":"peer-job-`...)
	buf = strconv.AppendInt(buf, n, 10)
	buf = append(buf, `","seq":2,"model":"qwen3.5-9b","engine":"llamacpp","state":"running","createdAt":1789661457000,`+
		`"startedAt":1789661457000,"completedAt":null,"error":null,"requesterId":"my-scheduler","originatedFrom":"`...)
	buf = append(buf, origin...)
	return append(buf, `"}}}`...)
}

func BenchmarkParsePeerFrame(b *testing.B) {
	body := benchPeerFrame(nil, benchNodeID, 42)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := peerserver.ParseFrame(body, wireframe.DefaultWorkloadMaxBytes); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkServePeer runs the peer port's handler on distinct workloads
// from one pinned peer, with the broker side discarded: parse, origin
// check, dedup, broker write and the answer, at the info log level.
func BenchmarkServePeer(b *testing.B) {
	m := benchManager(b, io.Discard)
	self, err := devpki.Mint(benchNodeID)
	if err != nil {
		b.Fatal(err)
	}
	peer, err := devpki.Mint(devpki.NewUUID())
	if err != nil {
		b.Fatal(err)
	}
	if err := devpki.WriteIdentity(m.cfg.ClusterDir, self); err != nil {
		b.Fatal(err)
	}
	if err := devpki.PinIdentity(m.cfg.ClusterDir, peer); err != nil {
		b.Fatal(err)
	}
	m.trust.Reload()
	cert, err := peer.TLSCertificate()
	if err != nil {
		b.Fatal(err)
	}
	state := benchTLSState(b, cert.Certificate[0])
	var buf []byte
	var n int64
	b.ReportAllocs()
	for b.Loop() {
		n++
		buf = benchPeerFrame(buf[:0], peer.Principal, n)
		req := httptest.NewRequest(http.MethodPost, wireframe.EventsPath, bytes.NewReader(buf))
		req.Header.Set("Content-Type", "application/json")
		req.TLS = state
		w := httptest.NewRecorder()
		m.peers.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body.String())
		}
	}
}

// BenchmarkPeerInboundEndToEnd posts distinct workloads from 4 x
// GOMAXPROCS keep-alive mTLS clients of one pinned peer to a running
// Manager's peer port, the broker side drained.
func BenchmarkPeerInboundEndToEnd(b *testing.B) {
	r := benchRunManager(b, false)
	peer, err := devpki.Mint(devpki.NewUUID())
	if err != nil {
		b.Fatal(err)
	}
	if err := devpki.PinIdentity(r.clusterDir, peer); err != nil {
		b.Fatal(err)
	}
	r.m.trust.Reload()
	c := testkit.PeerClient(b, &peer, r.ident.DER)
	url := "https://" + r.m.PeerAddr().String() + wireframe.EventsPath
	var next atomic.Int64
	b.SetParallelism(4)
	benchPostInParallel(b, c, url, func(buf []byte) []byte { return benchPeerFrame(buf, peer.Principal, next.Add(1)) })
}

// benchTLSState is the connection state of a client that presented the
// certificate der.
func benchTLSState(b *testing.B, der []byte) *tls.ConnectionState {
	b.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		b.Fatal(err)
	}
	return &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{c}}
}
