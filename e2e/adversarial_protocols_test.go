//go:build linux

package e2e

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// The HTTP/2 lockout of issue 20, against the real binary: clients with no
// certificate that ask for HTTP/2 (by ALPN, or by sending its preface
// after an HTTP/1.1 handshake) or that post over HTTP/1.1 and never read
// their answers, from several loopback sources at once and beyond the
// peer port's connection cap, for as long as the test runs. A pinned
// peer's frames and a producer's posts are still answered 200 throughout,
// and the daemon's goroutines stay bounded. Before HTTP/2 was refused,
// such clients held every slot of the peer port and a pinned peer's
// connections got EOF for as long as they liked.
func TestAdversarialHTTP2AndNonReadingClientsCannotLockThePeerPortOut(t *testing.T) {
	const peerCap = 64
	nodes := writeCluster(t, 2)
	a := startNode(t, nodes[0], "--peer-max-conns", itoa(peerCap), "--peer-max-conns-per-source", itoa(peerCap),
		"--local-ingress", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--log-level", "info")
	ingressAddr := a.loggedValue("local ingress listening", "addr")
	peerAddr := net.JoinHostPort("127.0.0.1", itoa(a.port))
	before := scrapeProc(t, a)["go_goroutines"]

	ctx, stop := context.WithCancel(context.Background())
	var attackers sync.WaitGroup
	var mu sync.Mutex
	attempts := map[string]int{}
	attack := func(kind string, source string, once func(net.Conn)) {
		attackers.Go(func() {
			d := &net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
			for ctx.Err() == nil {
				raw, err := d.DialContext(ctx, "tcp", peerAddr)
				if err != nil {
					continue
				}
				if tc, ok := raw.(*net.TCPConn); ok {
					tc.SetReadBuffer(1024) // a receive window close to 0
				}
				once(raw)
				mu.Lock()
				attempts[kind]++
				mu.Unlock()
				// Held until the daemon closes it or the test ends; what
				// the daemon sends is taken a byte at a time, as slowly as
				// the small receive buffer lets it be sent.
				release := context.AfterFunc(ctx, func() { raw.Close() })
				for {
					if _, err := raw.Read(make([]byte, 1)); err != nil {
						break
					}
				}
				release()
				raw.Close()
			}
		})
	}
	handshake := func(raw net.Conn, alpn ...string) *tls.Conn {
		c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: alpn})
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if c.Handshake() != nil {
			return nil
		}
		c.SetDeadline(time.Time{})
		return c
	}
	post := "POST " + wireframe.EventsPath + " HTTP/1.1\r\nHost: " + peerAddr + "\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	for i, source := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		for range peerCap / 2 {
			switch i % 3 {
			case 0:
				attack("alpn-h2", source, func(raw net.Conn) {
					if c := handshake(raw, "h2"); c != nil {
						// Only a server that speaks HTTP/2 gets this far: the
						// attack proper, one POST under a window of 0.
						io.WriteString(c, h2ZeroWindowPost(peerAddr))
					}
				})
			case 1:
				attack("h2-preface", source, func(raw net.Conn) {
					if c := handshake(raw, "h2", "http/1.1"); c != nil {
						// The preface, then SETTINGS with an initial window of 0.
						io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00")
					}
				})
			case 2:
				attack("http1-no-cert", source, func(raw net.Conn) {
					if c := handshake(raw, "http/1.1"); c != nil {
						for range 64 { // pipelined, their 403s never read
							io.WriteString(c, post)
						}
					}
				})
			}
		}
	}
	defer func() { stop(); attackers.Wait() }()
	testkit.Eventually(t, "every kind of attack under way", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return attempts["alpn-h2"] > peerCap && attempts["h2-preface"] > peerCap && attempts["http1-no-cert"] > peerCap
	})

	peer := testkit.PeerClient(t, &nodes[1].Identity, nodes[0].Identity.DER)
	var slowest time.Duration
	for i := range 20 {
		id := "under-attack-" + itoa(i)
		start := time.Now()
		if st, text := netPostAnswer(t, peer, peerAddr, testframe.Lifecycle(testframe.Workload(id, "running", nodes[1].ID), nil)); st != http.StatusOK {
			t.Fatalf("pinned peer's frame %d during the attack: %d %q", i, st, text)
		}
		slowest = max(slowest, time.Since(start))
		start = time.Now()
		if st, text := postIngressTo(t, ingressAddr, string(testframe.Lifecycle(testframe.Workload("local-"+id, "running", nodes[0].ID), nil))); st != http.StatusOK {
			t.Fatalf("producer's post %d during the attack: %d %q", i, st, text)
		}
		slowest = max(slowest, time.Since(start))
		peer.CloseIdleConnections() // a fresh connection each time, through the attackers' churn
	}
	a.WaitUpserts("under-attack-19", 1)
	after := scrapeProc(t, a)
	mu.Lock()
	t.Logf("attempts %v; slowest answer %v; goroutines %v before, %v during; connections refused at the accept %v, closed for room %v",
		attempts, slowest, before, after["go_goroutines"],
		after[`nvpair_wlm_connections_refused_total{listener="peer",reason="full"}`], after[`nvpair_wlm_connections_closed_for_room_total{listener="peer"}`])
	mu.Unlock()
	// Every connection holds a few goroutines at most (its server loop, its
	// background read); the cap holds 64 of them.
	if g := after["go_goroutines"]; g > before+4*peerCap {
		t.Errorf("%v goroutines during the attack, %v before: more than %d connections' worth", g, before, peerCap)
	}
}

// h2ZeroWindowPost is what an HTTP/2 client with no certificate sends to
// hold a stream: the connection preface, SETTINGS with an initial window of
// 0 (so no answer's body can ever be sent to it), and one POST with no body
// (HEADERS with END_STREAM), its header block in HPACK: :method POST,
// :scheme https and :path / from the static table, :authority as a literal.
func h2ZeroWindowPost(authority string) string {
	frame := func(typ, flags byte, stream uint32, payload string) string {
		n := len(payload)
		return string([]byte{byte(n >> 16), byte(n >> 8), byte(n), typ, flags,
			byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}) + payload
	}
	settings := "\x00\x04\x00\x00\x00\x00" // SETTINGS_INITIAL_WINDOW_SIZE = 0
	headers := "\x83\x87\x84\x41" + string([]byte{byte(len(authority))}) + authority
	return "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(0x4, 0, 0, settings) + frame(0x1, 0x5, 1, headers)
}
