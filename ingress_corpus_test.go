package main

import (
	"bufio"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// The bypass corpus for the ingress's header checks: each case is a request
// written byte for byte on a raw connection (Go's client would normalize
// the very headers under test), with its expected answer and the reason.
// Several of these forms opened DNS-rebinding or CSRF holes in real loopback
// servers (Transmission, Syncthing, Jupyter, Ollama, Geth).

// rawExchange writes one request on a new connection and reads the answer.
func rawExchange(t *testing.T, addr, request string) *http.Response {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, testkit.WaitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testkit.WaitTimeout))
	if _, err := c.Write([]byte(request)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	resp.Body.Close()
	return resp
}

// corpusFrame is a valid frame, so that a request the header checks pass
// is answered 200.
const corpusFrame = `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"corpus","model":"m","engine":"e","state":"running"}}}`

// request builds a raw HTTP/1.1 POST of corpusFrame with the given header
// lines (each without its CRLF).
func request(headers ...string) string {
	return "POST " + wireframe.EventsPath + " HTTP/1.1\r\n" + strings.Join(headers, "\r\n") +
		"\r\nContent-Length: " + strconv.Itoa(len(corpusFrame)) + "\r\nConnection: close\r\n\r\n" + corpusFrame
}

func TestIngressHostBypassCorpus(t *testing.T) {
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	addr := n.m.IngressAddr()
	port := n.m.ingress.BoundPort()
	other, _ := strconv.Atoi(port)
	hostname, _ := os.Hostname()
	ct := "Content-Type: application/json"
	host := func(h string) string { return "Host: " + h }

	cases := []struct {
		name, request string
		want          int
		why           string
	}{
		{"loopback address", request(host("127.0.0.1:"+port), ct), 200, "the canonical loopback name"},
		{"localhost", request(host("localhost:"+port), ct), 200, "resolves to loopback on every resolver"},
		{"LOCALHOST", request(host("LOCALHOST:"+port), ct), 200, "host names are case-insensitive (RFC 4343); decided: accept"},
		{"LocalHost", request(host("LocalHost:"+port), ct), 200, "same"},
		{"127.0.0.2", request(host("127.0.0.2:"+port), ct), 200, "a real 127/8 address: loopback by definition"},
		{"[::1]", request(host("[::1]:"+port), ct), 200, "the IPv6 loopback"},
		{"localhost.", request(host("localhost.:"+port), ct), 421, "a trailing dot is another spelling; only the canonical one passes"},
		{"127.1", request(host("127.1:"+port), ct), 421, "inet_aton shorthand: parsers disagree on it"},
		{"2130706433", request(host("2130706433:"+port), ct), 421, "decimal IPv4: parsers disagree on it"},
		{"0x7f000001", request(host("0x7f000001:"+port), ct), 421, "hex IPv4"},
		{"0177.0.0.1", request(host("0177.0.0.1:"+port), ct), 421, "octal IPv4"},
		{"127.0.0.1.", request(host("127.0.0.1.:"+port), ct), 421, "trailing dot on an address"},
		{"0.0.0.0", request(host("0.0.0.0:"+port), ct), 421, "the unspecified address reaches loopback on Linux: a known rebinding bypass"},
		{"0", request(host("0:"+port), ct), 421, "shorthand for 0.0.0.0"},
		{"[::]", request(host("[::]:"+port), ct), 421, "the IPv6 unspecified address"},
		{"private address", request(host("192.168.1.10:"+port), ct), 421, "not loopback"},
		{"evil.localhost", request(host("evil.localhost:"+port), ct), 421, "browsers map *.localhost to loopback, but the page's origin is that name"},
		{"x.local", request(host("x.local:"+port), ct), 421, "mDNS name a page can use"},
		{"x.internal", request(host("x.internal:"+port), ct), 421, "a rebinding name"},
		{"own hostname", request(host(hostname+":"+port), ct), 421, "the machine's own name is not loopback-only"},
		{"mapped IPv4", request(host("[::ffff:127.0.0.1]:"+port), ct), 421, "IPv4-mapped IPv6: Go versions differ on it; decided: refuse"},
		{"mapped IPv4 hex", request(host("[::ffff:7f00:1]:"+port), ct), 421, "same, hex spelling"},
		{"zone", request(host("[::1%25lo0]:"+port), ct), 421, "a zone is not part of the loopback name"},
		{"[::1] without port", request(host("[::1]"), ct), 421, "the Host must carry the bound port"},
		{"wrong port", request(host("127.0.0.1:"+strconv.Itoa(other+1)), ct), 421, "another service's port: a rebinding page talking to us on its own port"},
		{"no port", request(host("127.0.0.1"), ct), 421, "the Host must carry the bound port"},
		{"empty name", request(host(":"+port), ct), 421, "an empty name bypassed one well-known server's check"},
		{"two Host headers", request(host("127.0.0.1:"+port), host("evil.example:"+port), ct), 400, "Go's server refuses it before any handler"},
		{"HTTP/1.0 without Host", "POST " + wireframe.EventsPath + " HTTP/1.0\r\n" + ct + "\r\nContent-Length: " +
			strconv.Itoa(len(corpusFrame)) + "\r\n\r\n" + corpusFrame, 421, "no Host at all: refuse"},
		{"absolute-form request line", "POST http://evil.example" + wireframe.EventsPath + " HTTP/1.1\r\n" + host("127.0.0.1:"+port) + "\r\n" + ct +
			"\r\nContent-Length: " + strconv.Itoa(len(corpusFrame)) + "\r\nConnection: close\r\n\r\n" + corpusFrame, 421,
			"Go takes the request line's host into r.Host, and r.Host is what the check reads"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if resp := rawExchange(t, addr, c.request); resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.want, c.why)
			}
		})
	}
}

func TestIngressOriginContentTypeAndBodyCorpus(t *testing.T) {
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	addr := n.m.IngressAddr()
	host := "Host: " + addr
	ct := "Content-Type: application/json"
	cases := []struct {
		name, request string
		want          int
		why           string
	}{
		{"Origin null", request(host, ct, "Origin: null"), 403, "sandboxed frames and file pages send null"},
		{"Origin empty", request(host, ct, "Origin:"), 403, "present at all means a browser"},
		{"two Origins", request(host, ct, "Origin: http://a.example", "Origin: http://b.example"), 403, "present at all means a browser"},
		{"Application/JSON", request(host, "Content-Type: Application/JSON"), 200, "media types are case-insensitive"},
		{"charset", request(host, "Content-Type: application/json; charset=utf-8"), 200, "parameters are allowed"},
		{"application/jsonx", request(host, "Content-Type: application/jsonx"), 415, "a prefix match would take it"},
		{"text/plain", request(host, "Content-Type: text/plain"), 415, "what a page can send without a preflight"},
		{"no content type", request(host), 415, "a form or beacon may send none"},
		{"vendor +json", request(host, "Content-Type: application/vnd.x+json"), 415, "only application/json itself"},
		{"two content types", request(host, ct, "Content-Type: text/plain"), 415, "ambiguous: refuse"},
	}
	accepted := 0
	for _, c := range cases {
		if c.want == http.StatusOK {
			accepted++
		}
		t.Run(c.name, func(t *testing.T) {
			if resp := rawExchange(t, addr, c.request); resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.want, c.why)
			}
		})
	}

	t.Run("understated Content-Length", func(t *testing.T) {
		// The body goes on past its declared length: the ingress reads the
		// declared bytes only, accepts that frame, and the rest is read as
		// the next request on the connection, which Go refuses.
		//
		// The count starts once the broker has recorded every frame the
		// cases above had accepted. A 200 means the daemon's write to the
		// broker pipe returned, which is when the recorder read the line,
		// not when it appended it: on a loaded machine the last accepted
		// case's upsert could still be on its way, and would have been
		// counted as this request's second.
		before := len(n.broker.WaitMethod(wireframe.MethodUpsert, accepted))
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(testkit.WaitTimeout))
		req := "POST " + wireframe.EventsPath + " HTTP/1.1\r\n" + host + "\r\n" + ct + "\r\nContent-Length: " +
			strconv.Itoa(len(corpusFrame)) + "\r\n\r\n" + corpusFrame + `{"smuggled":true}`
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		// Nothing more comes: the server refuses the trailing bytes at once
		// instead of waiting out its header timeout for the rest of them.
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		first, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		first.Body.Close()
		if first.StatusCode != 200 {
			t.Fatalf("first answer %d, want 200 for the declared frame", first.StatusCode)
		}
		if second, err := http.ReadResponse(br, nil); err == nil && second.StatusCode == 200 {
			t.Fatal("the bytes past the declared length were accepted as a frame")
		}
		ups := n.broker.WaitMethod(wireframe.MethodUpsert, before+1)
		if len(ups) != before+1 || strings.Contains(string(ups[len(ups)-1].Params), "smuggled") {
			t.Fatalf("broker got %d upserts, last %s", len(ups)-before, ups[len(ups)-1].Params)
		}
	})
}
