package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/wireframe"
)

// Every listener serves HTTP/1.1 and HTTP/1.0 and nothing else (spec 3.7,
// "Protocols"): these tests try each protocol a client can ask for, on
// each listener, with a real client where the standard library has one.

// protocolListener is one of the daemon's listeners as a client reaches
// it: dial opens a connection (TLS with a pinned certificate on the peer
// port) that offers the ALPN protocols given, and host is the Host a
// request must carry to get past the listener's own checks.
type protocolListener struct {
	name string
	host string
	tls  bool
	dial func(t *testing.T, alpn ...string) (net.Conn, error)
	// ok is the i-th request that the listener answers 200 and keeps the
	// connection open after, in HTTP/1.1, with extra header lines added.
	ok func(i int, extra string) string
}

// protocolListeners starts a node with all three listeners and returns
// them.
func protocolListeners(t *testing.T) []protocolListener {
	t.Helper()
	n := newTestNode(t)
	client := testkit.Mint(t, devpki.NewUUID())
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, client))
	testkit.Must(t, n.m.EnableLocalIngress("127.0.0.1:0"))
	testkit.Must(t, n.m.EnableMetrics("127.0.0.1:0"))
	n.start()
	testkit.Eventually(t, "loopback listeners bound", func() bool { return n.m.IngressAddr() != "" && n.m.MetricsAddr() != "" })
	cert, err := client.TLSCertificate()
	testkit.Must(t, err)
	plain := func(addr string) func(*testing.T, ...string) (net.Conn, error) {
		return func(*testing.T, ...string) (net.Conn, error) {
			return net.DialTimeout("tcp", addr, testkit.WaitTimeout)
		}
	}
	peerAddr := n.m.PeerAddr().String()
	post := func(host, body string) string {
		return "POST " + wireframe.EventsPath + " HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\n" +
			"Content-Length: " + itoa(len(body)) + "\r\n"
	}
	return []protocolListener{
		{name: "peer", host: peerAddr, tls: true, dial: func(t *testing.T, alpn ...string) (net.Conn, error) {
			d := &net.Dialer{Timeout: testkit.WaitTimeout}
			return tls.DialWithDialer(d, "tcp", peerAddr, &tls.Config{
				Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, NextProtos: alpn,
			})
		}, ok: func(i int, extra string) string {
			body := string(testframe.Lifecycle(testframe.Workload("proto-"+itoa(i), "running", client.Principal), nil))
			return post(peerAddr, body) + extra + "\r\n" + body
		}},
		{name: "ingress", host: n.m.IngressAddr(), dial: plain(n.m.IngressAddr()), ok: func(i int, extra string) string {
			body := string(testframe.Lifecycle(testframe.Workload("proto-"+itoa(i), "running", n.id), nil))
			return post(n.m.IngressAddr(), body) + extra + "\r\n" + body
		}},
		{name: "metrics", host: n.m.MetricsAddr(), dial: plain(n.m.MetricsAddr()), ok: func(_ int, extra string) string {
			return "GET /metrics HTTP/1.1\r\nHost: " + n.m.MetricsAddr() + "\r\n" + extra + "\r\n"
		}},
	}
}

// statusLines writes req on c and reads n answers' status lines, each
// answer's body skipped by its Content-Length.
func statusLines(t *testing.T, c net.Conn, req string, n int) []string {
	t.Helper()
	c.SetDeadline(time.Now().Add(testkit.WaitTimeout))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("write: %v", err)
	}
	br := bufio.NewReader(c)
	var lines []string
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d of %d: %v", len(lines)+1, n, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lines = append(lines, resp.Proto+" "+resp.Status)
	}
	return lines
}

// closedAfter reports whether the server closes c once its answers are
// read.
func closedAfter(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(testkit.WaitTimeout))
	_, err := c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF) || isConnReset(err)
}

func isConnReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

func TestEveryListenerRefusesHTTP2ByALPNAndByPriorKnowledge(t *testing.T) {
	for _, l := range protocolListeners(t) {
		t.Run(l.name, func(t *testing.T) {
			if l.tls {
				// A client that offers h2 alone fails the handshake.
				if c, err := l.dial(t, "h2"); err == nil {
					c.Close()
					t.Fatalf("a handshake offering only h2 succeeded, negotiating %q", c.(*tls.Conn).ConnectionState().NegotiatedProtocol)
				}
				// A client that offers both gets HTTP/1.1.
				c, err := l.dial(t, "h2", "http/1.1")
				testkit.Must(t, err)
				if p := c.(*tls.Conn).ConnectionState().NegotiatedProtocol; p != "http/1.1" {
					t.Errorf("offering h2 and http/1.1 negotiated %q, want http/1.1", p)
				}
				c.Close()
			}
			// The HTTP/2 connection preface, sent without negotiation (h2
			// prior knowledge, or h2c on plaintext), is answered 505 and
			// the connection closed.
			c, err := l.dial(t)
			testkit.Must(t, err)
			defer c.Close()
			got := statusLines(t, c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 1)
			if got[0] != "HTTP/1.1 505 HTTP Version Not Supported" {
				t.Errorf("the HTTP/2 preface got %q, want 505", got[0])
			}
			if !closedAfter(c) {
				t.Error("the connection stayed open after the preface's 505")
			}
		})
	}
}

// The standard library's own HTTP/2 client, asked for HTTP/2 only, gets
// no answer from any listener.
func TestEveryListenerRefusesTheStandardLibrarysHTTP2Client(t *testing.T) {
	for _, l := range protocolListeners(t) {
		t.Run(l.name, func(t *testing.T) {
			var p http.Protocols
			tr := &http.Transport{Protocols: &p}
			scheme := "http://"
			if l.tls {
				p.SetHTTP2(true)
				tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
				scheme = "https://"
			} else {
				p.SetUnencryptedHTTP2(true)
			}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: testkit.WaitTimeout}).Get(scheme + l.host + "/nope")
			if err == nil {
				resp.Body.Close()
				t.Fatalf("an HTTP/2-only client was answered %s over %s", resp.Status, resp.Proto)
			}
		})
	}
}

func TestEveryListenerIgnoresAnH2CUpgradeAndAnswersInHTTP1(t *testing.T) {
	for _, l := range protocolListeners(t) {
		t.Run(l.name, func(t *testing.T) {
			c, err := l.dial(t)
			testkit.Must(t, err)
			defer c.Close()
			upgrade := l.ok(1, "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n")
			// The same connection then still speaks HTTP/1.1.
			got := statusLines(t, c, upgrade+l.ok(2, ""), 2)
			for i, g := range got {
				if g != "HTTP/1.1 200 OK" {
					t.Errorf("answer %d to an h2c upgrade then a plain request: %q, want HTTP/1.1 200 (no 101)", i+1, g)
				}
			}
		})
	}
}

func TestEveryListenerServesHTTP10AndClosesAfterTheAnswer(t *testing.T) {
	for _, l := range protocolListeners(t) {
		t.Run(l.name, func(t *testing.T) {
			c, err := l.dial(t)
			testkit.Must(t, err)
			defer c.Close()
			got := statusLines(t, c, "GET /nope HTTP/1.0\r\nHost: "+l.host+"\r\n\r\n", 1)
			if got[0] != "HTTP/1.0 404 Not Found" {
				t.Errorf("an HTTP/1.0 request got %q, want HTTP/1.0 404", got[0])
			}
			if !closedAfter(c) {
				t.Error("an HTTP/1.0 connection without keep-alive stayed open")
			}
		})
	}
}

func TestEveryListenerAnswersPipelinedRequestsInOrder(t *testing.T) {
	for _, l := range protocolListeners(t) {
		t.Run(l.name, func(t *testing.T) {
			c, err := l.dial(t)
			testkit.Must(t, err)
			defer c.Close()
			got := statusLines(t, c, l.ok(1, "")+l.ok(2, "")+l.ok(3, ""), 3)
			for i, g := range got {
				if g != "HTTP/1.1 200 OK" {
					t.Errorf("pipelined answer %d: %q, want HTTP/1.1 200", i+1, g)
				}
			}
		})
	}
}

// A client that sends requests and never reads their answers (a receive
// window of 0) loses its connection, and the listener its slot, at the
// answer's write deadline. The metrics endpoint's answers are tens of KiB,
// so a few hundred pipelined scrapes fill the socket buffers; the deadline
// is armed by httpguard.HTTP1Answers, which wraps every listener alike (the 505 tests
// above see the same wrapper on each).
func TestAnAnswerTheClientDoesNotReadEndsAtTheWriteDeadline(t *testing.T) {
	waitsOutRealTime(t, "the answer write deadline")
	n := newTestNode(t)
	testkit.Must(t, n.m.EnableMetrics("127.0.0.1:0"))
	n.start()
	testkit.Eventually(t, "metrics bound", func() bool { return n.m.MetricsAddr() != "" })
	c, err := net.DialTimeout("tcp", n.m.MetricsAddr(), testkit.WaitTimeout)
	testkit.Must(t, err)
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetReadBuffer(4096)
	}
	scrape := "GET /metrics HTTP/1.1\r\nHost: " + n.m.MetricsAddr() + "\r\n\r\n"
	writeErr := make(chan error, 1)
	go func() {
		for {
			if _, err := io.WriteString(c, scrape); err != nil {
				writeErr <- err
				return
			}
		}
	}()
	// The client never reads. The server's writes block once the buffers
	// are full, then fail at the deadline and the server closes the
	// connection: the client's own writes then fail too.
	if !testkit.HoldsWithin(httpguard.AnswerWriteTimeout+testkit.WaitTimeout, func() bool { return n.m.conns.Metrics.OpenConns() == 0 && len(writeErr) == 1 }) {
		t.Fatalf("%s after the client stopped reading: %d connection(s) still open, the client's writes still accepted",
			httpguard.AnswerWriteTimeout+testkit.WaitTimeout, n.m.conns.Metrics.OpenConns())
	}
}
