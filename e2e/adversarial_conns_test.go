//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
)

// The adversarial tests of the connection caps and the logs (spec 7) run
// the real binary and attack it as a client on the same machine would. They
// need Linux: /proc for the descriptor count, and loopback addresses other
// than 127.0.0.1 to flood from.

// flood opens n connections to addr from the loopback sources given, in
// turn, and keeps them open (sending nothing) until the test ends. It
// returns how many the kernel let it open; the daemon may close any.
func flood(t *testing.T, addr string, n int, sources ...string) int {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	opened := 0
	for i := range n {
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(sources[i%len(sources)])}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			continue
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		opened++
	}
	return opened
}

func TestAdversarialConnectionFloodLeavesRoomForRealClients(t *testing.T) {
	const peerCap, perSource, ingressCap, metricsCap = 48, 16, 32, 16
	nodes := writeCluster(t, 2)
	a := startDaemon(t, nodeArgs(nodes[0], 0, "--local-ingress", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
		"--peer-max-conns", itoa(peerCap), "--peer-max-conns-per-source", itoa(perSource),
		"--ingress-max-conns", itoa(ingressCap), "--metrics-max-conns", itoa(metricsCap))...)
	b := startDaemon(t, nodeArgs(nodes[1], 0)...)
	a.port, b.port = a.boundPeerPort(), b.boundPeerPort()
	ingress := "127.0.0.1:" + ingressPortOf(t, a)
	metricsAddr := a.loggedValue("metrics endpoint listening", "addr")
	a.discover(nodes[1], b.port)
	b.discover(nodes[0], a.port)
	b.waitLog("broadcast targets changed", "total=1")
	idleFDs := openFDs(t, a)

	// The flood: a few thousand connections that never send a request, to
	// every listener. On the peer port they come from addresses other than
	// the real peer's, so both caps are hit: first one source over its own
	// cap, then four more, 4 x 16 > 48. (In the other order the one source
	// would only ever close its own connections for room once it held the
	// most, below its cap: room is taken from the largest holder.)
	peerAddr := net.JoinHostPort("127.0.0.1", itoa(a.port))
	opened := flood(t, peerAddr, 200, "127.0.0.6") // one source over its cap
	opened += flood(t, peerAddr, 1500, "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
	opened += flood(t, ingress, 1500, "127.0.0.1")
	opened += flood(t, metricsAddr, 500, "127.0.0.1")
	t.Logf("flood: %d connections opened by the kernel", opened)

	// A real peer's frame reaches this node's broker within a second.
	start := time.Now()
	b.send(testframe.LifecycleLine("during-flood-peer", "running", nodes[1].ID))
	a.WaitUpserts("during-flood-peer", 1)
	if d := time.Since(start); d > time.Second {
		t.Fatalf("a pinned peer's frame took %v to reach the broker during the flood, want under 1s", d)
	}
	// A producer's frame is answered within a second.
	start = time.Now()
	if st, body := postIngressTo(t, ingress, testframe.LifecycleLine("during-flood-ingress", "running", nodes[0].ID)); st != http.StatusOK {
		t.Fatalf("an ingress post during the flood = %d %q, want 200", st, body)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("an ingress post took %v during the flood, want under 1s", d)
	}
	a.WaitUpserts("during-flood-ingress", 1)
	// And the metrics endpoint answers: both caps were hit.
	metrics := metricsAddr
	if n := testkit.ScrapeValue(t, metrics, `nvpair_wlm_connections_refused_total{listener="peer",reason="per_source"}`); n < 200-perSource {
		t.Fatalf("%v connections refused by the per-source cap, want at least %d of the one source's 200", n, 200-perSource)
	}
	for _, l := range []string{"peer", "ingress", "metrics"} {
		if n := testkit.ScrapeValue(t, metrics, `nvpair_wlm_connections_closed_for_room_total{listener="`+l+`"}`); n == 0 {
			t.Fatalf("no connection closed for room on the %s listener: the flood never reached its cap", l)
		}
	}

	fds := openFDs(t, a)
	limit := idleFDs + peerCap + ingressCap + metricsCap + 16
	t.Logf("descriptors: %d idle, %d during the flood (caps %d + %d + %d)", idleFDs, fds, peerCap, ingressCap, metricsCap)
	if fds > limit {
		t.Fatalf("the daemon holds %d descriptors during the flood, want at most %d (idle %d + the caps + 16)", fds, limit, idleFDs)
	}
}

// postIngressTo posts one frame to the ingress at addr.
func postIngressTo(t *testing.T, addr, frame string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Post("http://"+addr+peerEventsPath, "application/json", strings.NewReader(frame))
	if err != nil {
		t.Fatalf("ingress post: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func TestAdversarialUnauthenticatedPeerClientsGet403AClosedConnectionAndOneWarning(t *testing.T) {
	nodes := writeCluster(t, 1)
	a := startDaemon(t, nodeArgs(nodes[0], 0, "--log-level", "info")...)
	a.port = a.boundPeerPort()
	stranger, err := devpki.Mint(devpki.NewUUID())
	testkit.Must(t, err)
	cert, err := stranger.TLSCertificate()
	testkit.Must(t, err)
	url := "https://" + net.JoinHostPort("127.0.0.1", itoa(a.port)) + peerEventsPath
	body := []byte(testframe.LifecycleLine("stranger", "running", stranger.Principal))
	for i := range 200 {
		c, err := tls.Dial("tcp", net.JoinHostPort("127.0.0.1", itoa(a.port)), &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}})
		testkit.Must(t, err)
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		testkit.Must(t, req.Write(c))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		testkit.Must(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("request %d = %d, want 403", i, resp.StatusCode)
		}
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("request %d: the connection stayed open after the 403", i)
		}
		c.Close()
	}
	if n := countLines(a.stderr.String(), "peer request rejected", "status=403"); n != 1 {
		t.Fatalf("%d warnings for 200 refusals from one source in one interval, want 1:\n%s", n, a.stderr)
	}
	if lines := a.UpsertCount("stranger"); lines != 0 {
		t.Fatalf("a refused frame reached the broker %d time(s)", lines)
	}
}

func TestAdversarialLongPathMethodAndHostKeepEveryLogLineShort(t *testing.T) {
	nodes := writeCluster(t, 1)
	a := startDaemon(t, nodeArgs(nodes[0], 0, "--local-ingress", "127.0.0.1:0", "--metrics", "127.0.0.1:0")...)
	ingress := "127.0.0.1:" + ingressPortOf(t, a)
	metricsAddr := a.loggedValue("metrics endpoint listening", "addr")
	long := strings.Repeat("A", 900_000)
	for _, target := range []string{ingress, metricsAddr} {
		for name, req := range map[string]string{
			"path":   "POST /" + long + " HTTP/1.1\r\nHost: " + target + "\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
			"method": long + " " + peerEventsPath + " HTTP/1.1\r\nHost: " + target + "\r\nContent-Length: 2\r\n\r\n{}",
			"Host":   "GET /metrics HTTP/1.1\r\nHost: " + long + "\r\n\r\n",
		} {
			status := rawRequest(t, target, req)
			if status < 400 {
				t.Fatalf("%s at %s: status %d, want a refusal", name, target, status)
			}
		}
	}
	testkit.Eventually(t, "the refusals logged", func() bool { return strings.Count(a.stderr.String(), "request rejected") >= 4 })
	for _, line := range strings.Split(a.stderr.String(), "\n") {
		if len(line) > 1024 {
			t.Fatalf("a log line of %d bytes: %.300s...", len(line), line)
		}
	}
}

// rawRequest writes req on a new connection to addr and returns the
// answer's status.
func rawRequest(t *testing.T, addr, req string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	testkit.Must(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("write: %v", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		t.Fatalf("status line %q", line)
	}
	st, _ := strconv.Atoi(f[1])
	return st
}
