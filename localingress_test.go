package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/wireframe"
)

// liSeedFrame is the producer example from the feature's description,
// as curl would send it: no originatedFrom, pretty-printed.
const liSeedFrame = `{
  "jsonrpc": "2.0", "method": "workload:started",
  "params": {"workloadInfo": {"id": "job-42", "runId": "job-42", "seq": 1, "model": "qwen3.5-9b", "engine": "llamacpp",
             "state": "running", "createdAt": 1789661457000, "startedAt": 1789661457000,
             "completedAt": null, "error": null, "requesterId": "my-scheduler"}}}`

// liRejectionBudget is how long a rejection whose declared body never
// arrives may take; the server's read timeout is ten times longer.
const liRejectionBudget = time.Second

// The checks that run on the headers alone, in the seed's order of trust
// checks: Origin, then Host.

func TestLocalIngressRefusesRequestsWithAnOriginHeader(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	cases := []struct {
		name   string
		origin []string // nil: no Origin header
		want   int
	}{
		{"web page origin", []string{"http://evil.example"}, http.StatusForbidden},
		{"loopback origin", []string{"http://127.0.0.1:8080"}, http.StatusForbidden},
		{"null origin (sandboxed frame, file:)", []string{"null"}, http.StatusForbidden},
		{"empty value", []string{""}, http.StatusForbidden},
		{"two Origin headers", []string{"http://a.example", "http://b.example"}, http.StatusForbidden},
		{"no Origin header (a producer)", nil, http.StatusOK},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Content-Type": {"application/json"}}
			if tc.origin != nil {
				h["Origin"] = tc.origin
			}
			got, text := testkit.MustDo(t, addr, testkit.Request{Header: h, Body: liFrame("origin-" + itoa(i))})
			if got != tc.want {
				t.Fatalf("status = %d (%q), want %d", got, text, tc.want)
			}
		})
	}
}

func TestLocalIngressRequiresALoopbackHostWithTheBoundPort(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	otherPort := strconv.Itoa(p%65535 + 1)
	cases := []struct {
		host string
		want int
	}{
		// A DNS-rebinding page reaches the ingress under its own name.
		{"evil.example:" + port, http.StatusMisdirectedRequest},
		{"evil.localhost:" + port, http.StatusMisdirectedRequest},
		{"127.0.0.1:" + otherPort, http.StatusMisdirectedRequest},
		{"127.0.0.1", http.StatusMisdirectedRequest},
		{"localhost", http.StatusMisdirectedRequest},
		{":" + port, http.StatusMisdirectedRequest},
		// Spellings some resolvers map to loopback: refused, so the answer
		// never depends on whose parser reads the name.
		{"localhost.:" + port, http.StatusMisdirectedRequest},
		{"127.1:" + port, http.StatusMisdirectedRequest},
		{"[::ffff:127.0.0.1]:" + port, http.StatusMisdirectedRequest},
		{"[127.0.0.1]:" + port, http.StatusMisdirectedRequest},
		{"0.0.0.0:" + port, http.StatusMisdirectedRequest},
		{"[0:0:0:0:0:0:0:1]:" + port, http.StatusMisdirectedRequest},
		{"[::1%25lo0]:" + port, http.StatusMisdirectedRequest},
		// Loopback names with the bound port. 127.0.0.2 and ::1 are only
		// the Host here: the socket still goes to 127.0.0.1.
		{"localhost:" + port, http.StatusOK},
		{"LOCALHOST:" + port, http.StatusOK},
		{"127.0.0.1:" + port, http.StatusOK},
		{"127.0.0.2:" + port, http.StatusOK},
		{"[::1]:" + port, http.StatusOK},
	}
	for i, tc := range cases {
		t.Run(tc.host, func(t *testing.T) {
			// A raw request: Go's client would rewrite some of these Host
			// values (it drops an IPv6 zone, for one).
			got, err := liRawPost(addr, tc.host, liFrame("host-"+itoa(i)), false)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("Host %q: status = %d, want %d", tc.host, got, tc.want)
			}
		})
	}
}

// Go's server takes the host of an absolute-form request line as r.Host and
// drops the Host header from the map: the check must read r.Host.
func TestLocalIngressHostCheckReadsTheRequestLineHostNotTheHeader(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	body := liFrame("absolute-form")
	for _, tc := range []struct {
		target string
		want   int
	}{
		{"http://evil.example" + wireframe.EventsPath, http.StatusMisdirectedRequest},
		{"http://" + addr + wireframe.EventsPath, http.StatusOK},
	} {
		req := "POST " + tc.target + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
			"Content-Length: " + itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body
		resp, _, closed := liRaw(t, addr, req, liRejectionBudget)
		if !closed {
			t.Fatalf("request line %q: the server did not close the connection", tc.target)
		}
		if resp.StatusCode != tc.want {
			t.Fatalf("request line %q with Host %s: status = %d, want %d", tc.target, addr, resp.StatusCode, tc.want)
		}
	}
}

func TestLocalIngressAcceptsOnlyPOST(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	for _, tc := range []struct {
		method string
		want   int
	}{
		{http.MethodGet, http.StatusMethodNotAllowed},
		{http.MethodPut, http.StatusMethodNotAllowed},
		{http.MethodDelete, http.StatusMethodNotAllowed},
		{http.MethodPost, http.StatusOK},
	} {
		t.Run(tc.method, func(t *testing.T) {
			got, text := testkit.MustDo(t, addr, testkit.Request{
				Method: tc.method, Header: http.Header{"Content-Type": {"application/json"}},
				Body: liFrame("method-" + tc.method),
			})
			if got != tc.want {
				t.Fatalf("%s: status = %d (%q), want %d", tc.method, got, text, tc.want)
			}
		})
	}
}

func TestLocalIngressRequiresJSONContentType(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	cases := []struct {
		name string
		ct   []string // nil: no Content-Type header
		want int
	}{
		// A page can send text/plain, form types without a preflight.
		{"text/plain with a JSON body", []string{"text/plain"}, http.StatusUnsupportedMediaType},
		{"form", []string{"application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType},
		{"missing", nil, http.StatusUnsupportedMediaType},
		{"application/jsonx", []string{"application/jsonx"}, http.StatusUnsupportedMediaType},
		{"structured suffix", []string{"application/vnd.x+json"}, http.StatusUnsupportedMediaType},
		{"two Content-Type headers", []string{"application/json", "application/json"}, http.StatusUnsupportedMediaType},
		{"plain", []string{"application/json"}, http.StatusOK},
		{"charset parameter", []string{"application/json; charset=utf-8"}, http.StatusOK},
		{"letter case", []string{"Application/JSON"}, http.StatusOK},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			if tc.ct != nil {
				h["Content-Type"] = tc.ct
			}
			got, text := testkit.MustDo(t, addr, testkit.Request{Header: h, Body: liFrame("ct-" + itoa(i))})
			if got != tc.want {
				t.Fatalf("Content-Type %q: status = %d (%q), want %d", tc.ct, got, text, tc.want)
			}
		})
	}
}

func TestLocalIngressOtherPathsAreNotFoundAfterTheTrustChecks(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name string
		rq   testkit.Request
		want int
	}{
		{"POST elsewhere", testkit.Request{Path: "/v1/jobs", Header: jsonCT}, http.StatusNotFound},
		{"GET /", testkit.Request{Method: http.MethodGet, Path: "/"}, http.StatusNotFound},
		{"Origin elsewhere", testkit.Request{Path: "/x", Header: http.Header{"Origin": {"null"}}}, http.StatusForbidden},
		{"bad Host elsewhere", testkit.Request{Path: "/x", Host: "evil.example", Header: jsonCT}, http.StatusMisdirectedRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.rq.Body = liFrame("path")
			if got, text := testkit.MustDo(t, addr, tc.rq); got != tc.want {
				t.Fatalf("status = %d (%q), want %d", got, text, tc.want)
			}
		})
	}
}

// Every request gets one deterministic answer: the first failing check in
// the order Origin, Host, method, content type decides it.
func TestLocalIngressChecksRunInTheSpecifiedOrder(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	for _, tc := range []struct {
		name string
		rq   testkit.Request
		want int
	}{
		{"Origin before Host", testkit.Request{Host: "evil.example", Method: http.MethodGet,
			Header: http.Header{"Origin": {"http://evil.example"}, "Content-Type": {"text/plain"}}}, http.StatusForbidden},
		{"Host before method", testkit.Request{Host: "evil.example", Method: http.MethodGet,
			Header: http.Header{"Content-Type": {"text/plain"}}}, http.StatusMisdirectedRequest},
		{"method before content type", testkit.Request{Method: http.MethodPut,
			Header: http.Header{"Content-Type": {"text/plain"}}}, http.StatusMethodNotAllowed},
		{"content type before body", testkit.Request{Header: http.Header{"Content-Type": {"text/plain"}}}, http.StatusUnsupportedMediaType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.rq.Body = "not json"
			if got, text := testkit.MustDo(t, addr, tc.rq); got != tc.want {
				t.Fatalf("status = %d (%q), want %d", got, text, tc.want)
			}
		})
	}
}

// The rejections decided from the headers never touch the body, and say
// that the connection will be closed.
func TestLocalIngressHeaderRejectionsDoNotReadTheBody(t *testing.T) {
	n := newTestNode(t)
	li, err := newLocalIngress(n.m, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Bound, so that the Host check has a port; the test calls the handler
	// directly and never accepts on ln.
	ln, err := li.Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	url := "http://" + li.BoundAddr() + wireframe.EventsPath
	cases := []struct {
		name   string
		method string
		edit   func(r *http.Request)
		want   int
	}{
		{"Origin", http.MethodPost, func(r *http.Request) { r.Header.Set("Origin", "null") }, http.StatusForbidden},
		{"Host", http.MethodPost, func(r *http.Request) { r.Host = "evil.example:" + li.BoundPort() }, http.StatusMisdirectedRequest},
		{"method", http.MethodPut, func(*http.Request) {}, http.StatusMethodNotAllowed},
		{"content type", http.MethodPost, func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }, http.StatusUnsupportedMediaType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spy := &liReadSpy{r: strings.NewReader(liFrame("spy"))}
			r := httptest.NewRequest(tc.method, url, spy)
			r.Header.Set("Content-Type", "application/json")
			tc.edit(r)
			w := httptest.NewRecorder()
			li.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("status = %d (%q), want %d", w.Code, w.Body.String(), tc.want)
			}
			if spy.read.Load() {
				t.Fatalf("a %d rejection read the request body", tc.want)
			}
			if got := w.Header().Get("Connection"); got != "close" {
				t.Fatalf("Connection = %q on a rejection with an unread body, want close", got)
			}
		})
	}
	// Control: a request that passes the header checks does read the body,
	// so the spy would have seen a read.
	spy := &liReadSpy{r: strings.NewReader("{}")}
	r := httptest.NewRequest(http.MethodPost, url, spy)
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	li.ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest || !spy.read.Load() {
		t.Fatalf("control: status %d, body read %v; want 400 after reading the body", w.Code, spy.read.Load())
	}
}

// A rejection whose declared body never arrives is answered at once (not
// after the 10 s read timeout), tells the client the connection is done
// (Connection: close) and the server then closes it. net/http still drains
// up to 256 KiB of an unread body after the handler, so with a body that
// never comes the close itself happens when the read timeout fires.
func TestLocalIngressRejectionWithUnsentBodyIsAnsweredAtOnce(t *testing.T) {
	waitsOutRealTime(t, "a body that never arrives")
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	var wg sync.WaitGroup
	for _, tc := range []struct {
		name, head string
		want       int
	}{
		{"Origin", "POST " + wireframe.EventsPath + " HTTP/1.1\r\nHost: " + addr + "\r\nOrigin: null\r\nContent-Type: application/json\r\n", http.StatusForbidden},
		{"Host", "POST " + wireframe.EventsPath + " HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\n", http.StatusMisdirectedRequest},
		{"method", "PUT " + wireframe.EventsPath + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n", http.StatusMethodNotAllowed},
		{"content type", "POST " + wireframe.EventsPath + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: text/plain\r\n", http.StatusUnsupportedMediaType},
	} {
		wg.Go(func() {
			// Each waits for the server's read timeout: run them together.
			resp, took, closed, err := liRawAnswer(addr, tc.head+"Content-Length: 1000\r\n\r\n", httpguard.ServerReadTimeout+2*time.Second)
			switch {
			case err != nil:
				t.Errorf("%s: %v", tc.name, err)
			case resp.StatusCode != tc.want:
				t.Errorf("%s: status = %d, want %d", tc.name, resp.StatusCode, tc.want)
			case took > liRejectionBudget:
				t.Errorf("%s: answered after %s, want within %s", tc.name, took, liRejectionBudget)
			case !resp.Close:
				t.Errorf("%s: a %d rejection with an unread body did not say Connection: close", tc.name, tc.want)
			case !closed:
				t.Errorf("%s: the server kept the connection open after a %d rejection with an unread body", tc.name, tc.want)
			}
		})
	}
	wg.Wait()
}

// The body cap refuses whatever is over the workload bound plus the
// envelope allowance (32 KiB at the defaults), declared or chunked, and is
// never over 1 MiB whatever the bound. The
// bodies are a valid frame padded with whitespace, so only the cap can
// refuse them. They go over a raw connection: the server answers 413
// before it has read the body, and a client that is still writing may see
// a reset instead of the answer.
func TestLocalIngressBodyCap(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	capped := int(ingress.BodyMax(wireframe.DefaultWorkloadMaxBytes))
	if capped != wireframe.DefaultWorkloadMaxBytes+ingress.EnvelopeAllowance || ingress.BodyMax(wireframe.MaxWorkloadMaxBytes) != wireframe.MaxBytes {
		t.Fatalf("the cap is %d at the default bound and %d at the largest, want %d and %d",
			capped, ingress.BodyMax(wireframe.MaxWorkloadMaxBytes), wireframe.DefaultWorkloadMaxBytes+ingress.EnvelopeAllowance, wireframe.MaxBytes)
	}
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
		want    int
	}{
		{"exactly the cap", capped, false, http.StatusOK},
		{"the cap + 1", capped + 1, false, http.StatusRequestEntityTooLarge},
		{"1 MiB", wireframe.MaxBytes, false, http.StatusRequestEntityTooLarge},
		{"chunked, exactly the cap", capped, true, http.StatusOK},
		{"chunked, the cap + 1", capped + 1, true, http.StatusRequestEntityTooLarge},
		{"chunked, 1 MiB", wireframe.MaxBytes, true, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := liPaddedFrame(t, liFrame("cap-"+strings.NewReplacer(" ", "-", ",", "").Replace(tc.name)), tc.size)
			got, err := liRawPost(addr, addr, body, tc.chunked)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("%d-byte body: status = %d, want %d", tc.size, got, tc.want)
			}
		})
	}
}

func TestLocalIngressServerTimeouts(t *testing.T) {
	n := newTestNode(t)
	li, err := newLocalIngress(n.m, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := li.Listen()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	srv := li.Start(&wg, ln)
	defer wg.Wait()
	defer srv.Close()
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Fatalf("timeouts: header %s, read %s, idle %s; all must be set", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.IdleTimeout)
	}
	// net/http's write deadline covers the whole handler, broker write
	// included: a slow broker would drop the answer to an accepted frame.
	if srv.WriteTimeout != 0 {
		t.Fatalf("WriteTimeout = %s, want none", srv.WriteTimeout)
	}
}

// A broker that is slow to take a frame delays the answer; it must not lose
// it, since the frame has landed by then and the producer would retry it.
func TestLocalIngressAnswersAfterASlowBrokerWrite(t *testing.T) {
	waitsOutRealTime(t, "a slow broker write")
	stall := &liStallingWriter{match: []byte(`"method":"workloads:upsert"`), entered: make(chan struct{}), release: make(chan struct{})}
	n := newTestNode(t, func(c *Config) { stall.w = c.Out; c.Out = stall })
	t.Cleanup(stall.unblock)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	type result struct {
		status int
		err    error
	}
	res := make(chan result, 1)
	go func() {
		status, _, err := testkit.Do(n.m.IngressAddr(), testkit.Request{
			Header: http.Header{"Content-Type": {"application/json"}}, Body: liFrame("slow-broker")})
		res <- result{status, err}
	}()
	select {
	case <-stall.entered:
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("the upsert never reached the broker writer")
	}
	// The broker takes longer than an answer's write deadline: a deadline
	// armed before the answer starts would drop it.
	time.Sleep(httpguard.AnswerWriteTimeout + time.Second)
	stall.unblock()
	select {
	case r := <-res:
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("after a slow broker write: status %d, err %v; want 200", r.status, r.err)
		}
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("no answer after the broker took the frame")
	}
	n.broker.WaitMethod(wireframe.MethodUpsert, 1)
}

func TestLocalIngressStopsWhenContextCancelled(t *testing.T) {
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	run := liRunOwned(t, n)
	n.broker.WaitMethod("ready", 1)
	addr := n.m.IngressAddr()
	hdr := http.Header{"Content-Type": {"application/json"}}
	if got, text := testkit.MustDo(t, addr, testkit.Request{Header: hdr, Body: liFrame("before")}); got != http.StatusOK {
		t.Fatalf("before cancel: status %d (%q), want 200", got, text)
	}
	run.cancel()
	if err := run.wait(t); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	status, _, err := testkit.Do(addr, testkit.Request{Header: hdr, Body: liFrame("after")})
	if err == nil {
		t.Fatalf("after cancel the ingress still answered %d", status)
	}
}

func TestManagerRunFailsWhenIngressPortIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress(taken.Addr().String()); err != nil {
		t.Fatal(err)
	}
	run := liRunOwned(t, n)
	select {
	case <-run.finished:
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not fail on a taken ingress port")
	}
	if run.err == nil || !strings.Contains(run.err.Error(), taken.Addr().String()) {
		t.Fatalf("Run = %v, want a listen error naming %s", run.err, taken.Addr())
	}
	// The peer listener it had already bound is released.
	peer := n.m.PeerAddr()
	if peer == nil {
		t.Fatal("the peer port was never bound")
	}
	ln, err := net.Listen("tcp", peer.String())
	if err != nil {
		t.Fatalf("peer port %s still held after the failed start: %v", peer, err)
	}
	ln.Close()
	if len(n.broker.All()) != 0 {
		t.Fatalf("a daemon that failed to start wrote to the broker: %v", n.broker.All())
	}
}

func TestLocalIngressRefusesNonLoopbackBindAddresses(t *testing.T) {
	for _, addr := range []string{
		"0.0.0.0:1", "192.168.1.10:1", "[::]:1", "example.com:1", ":14324",
		"127.0.0.1", "localhost:http", "127.1:1", "[::ffff:127.0.0.1]:1", "localhost.:1", "[::1%lo]:1", "[0:0:0:0:0:0:0:1]:1",
	} {
		t.Run(addr, func(t *testing.T) {
			n := newTestNode(t)
			if li, err := newLocalIngress(n.m, addr); err == nil {
				t.Fatalf("newLocalIngress(%q) = %+v, want an error", addr, li)
			}
			err := n.m.EnableLocalIngress(addr)
			if err == nil || !strings.Contains(err.Error(), addr) {
				t.Fatalf("EnableLocalIngress(%q) = %v, want an error naming the address", addr, err)
			}
			if n.m.ingress != nil {
				t.Fatal("a refused address left the ingress enabled")
			}
		})
	}
	for _, addr := range []string{"localhost:0", "LocalHost:14324", "127.0.0.1:0", "127.0.0.5:14324", "[::1]:0"} {
		t.Run(addr, func(t *testing.T) {
			n := newTestNode(t)
			if _, err := newLocalIngress(n.m, addr); err != nil {
				t.Fatalf("newLocalIngress(%q) = %v, want it accepted", addr, err)
			}
			if err := n.m.EnableLocalIngress(addr); err != nil || n.m.ingress == nil {
				t.Fatalf("EnableLocalIngress(%q) = %v, want it enabled", addr, err)
			}
		})
	}
}

func TestResolveIngressAddrFlagAndFile(t *testing.T) {
	cases := []struct {
		name   string
		flag   string
		file   *string // nil: no file
		want   string
		errors int // ERROR lines: one for every file that turns the ingress off
	}{
		{"flag wins over file", "127.0.0.1:15000", liStrPtr(`{"listen": "127.0.0.1:14324"}`), "127.0.0.1:15000", 0},
		{"flag without file", "localhost:15001", nil, "localhost:15001", 0},
		{"file when no flag", "", liStrPtr(`{"listen": "127.0.0.1:14324"}`), "127.0.0.1:14324", 0},
		{"absent file: off", "", nil, "", 0},
		{"empty file: off", "", liStrPtr(""), "", 0},
		{"blank file: off", "", liStrPtr(" \n\t\n"), "", 0},
		{"malformed file: off", "", liStrPtr(`{"listen": "127.0.0.1:14324"`), "", 1},
		{"not an object: off", "", liStrPtr(`["127.0.0.1:14324"]`), "", 1},
		{"null: off", "", liStrPtr(`null`), "", 1},
		{"wrong type: off", "", liStrPtr(`{"listen": 14324}`), "", 1},
		{"no listen address: off", "", liStrPtr(`{"port": 14324}`), "", 1},
		{"empty listen address: off", "", liStrPtr(`{"listen": ""}`), "", 1},
		{"listen spelt in another case: off", "", liStrPtr(`{"Listen": "127.0.0.1:14324"}`), "", 1},
		{"a member beside listen: off", "", liStrPtr(`{"listen": "127.0.0.1:14324", "port": 1}`), "", 1},
		{"non-loopback address: off", "", liStrPtr(`{"listen": "0.0.0.0:14324"}`), "", 1},
		{"not a port: off", "", liStrPtr(`{"listen": "127.0.0.1:http"}`), "", 1},
		{"no port: off", "", liStrPtr(`{"listen": "127.0.0.1"}`), "", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.file != nil {
				writeFile(t, filepath.Join(dir, ingressConfigFile), *tc.file)
			}
			logs := &testkit.LogBuffer{}
			log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			got, err := resolveIngressAddr(tc.flag, dir, log)
			if err != nil {
				t.Fatalf("resolveIngressAddr: %v", err)
			}
			if got != tc.want {
				t.Fatalf("address = %q, want %q", got, tc.want)
			}
			if e := strings.Count(logs.String(), "level=ERROR"); e != tc.errors {
				t.Fatalf("%d error line(s), want %d; logs:\n%s", e, tc.errors, logs)
			}
			if tc.errors > 0 && !logs.Contains("level=ERROR", ingressConfigFile, "127.0.0.1:14324") {
				t.Fatalf("the error line does not name the file and show a valid one; logs:\n%s", logs)
			}
		})
	}
	// The file's non-loopback address is refused where it is enabled.
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress("0.0.0.0:14324"); err == nil {
		t.Fatal("EnableLocalIngress accepted the file's non-loopback address")
	}
}

// main refuses a non-loopback ingress address, from the flag or the file,
// and a taken ingress port: one line on stderr naming the address and a
// non-zero exit.
func TestRunExitsOnUnusableIngressAddress(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		name, flag, file, addr string
	}{
		{"non-loopback flag", "0.0.0.0:14326", "", "0.0.0.0:14326"},
		{"taken port", taken.Addr().String(), "", taken.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := t.TempDir()
			args := []string{"--app-dir", app, "--port", "0"}
			if tc.flag != "" {
				args = append(args, "--local-ingress", tc.flag)
			}
			if tc.file != "" {
				writeFile(t, filepath.Join(app, ingressConfigFile), tc.file)
			}
			var stdout, stderr bytes.Buffer
			code := run(args, strings.NewReader(""), &stdout, &stderr)
			if code == 0 {
				t.Fatalf("exit 0, want non-zero; stderr:\n%s", stderr.String())
			}
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.addr) {
				t.Fatalf("stderr = %q, want one line naming %s", stderr.String(), tc.addr)
			}
			if stdout.Len() != 0 {
				t.Fatalf("a daemon that failed to start wrote to the broker: %q", stdout.String())
			}
		})
	}
}

// A bad workload-ingress.json is not fatal: the daemon starts and relays
// with the ingress off and says so in one ERROR line, so PAIR's supervisor,
// which restarts a worker that exits, does not loop the node with its relay
// down (spec 3.5).
func TestRunRelaysWithTheIngressOffWhenItsFileIsBad(t *testing.T) {
	for _, file := range []string{`{"listen": "192.168.1.10:14324"}`, `{"Listen": "127.0.0.1:14324"}`, `{"listen": `} {
		t.Run(file, func(t *testing.T) {
			app := t.TempDir()
			writeFile(t, filepath.Join(app, ingressConfigFile), file)
			var stdout, stderr bytes.Buffer
			if code := run([]string{"--app-dir", app, "--port", "0"}, strings.NewReader(""), &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d, want 0 (the broker closed stdin); stderr:\n%s", code, stderr.String())
			}
			if n := strings.Count(stderr.String(), "level=ERROR"); n != 1 || !strings.Contains(stderr.String(), "local ingress off") {
				t.Fatalf("%d ERROR line(s), want one saying the ingress is off; stderr:\n%s", n, stderr.String())
			}
			if !strings.Contains(stdout.String(), `"method":"ready"`) || strings.Contains(stderr.String(), "local ingress listening") {
				t.Fatalf("want the daemon ready with no ingress; stdout %q, stderr:\n%s", stdout.String(), stderr.String())
			}
		})
	}
}

// End to end over a real loopback listener and real mTLS to a pinned peer.
func TestLocalIngressEndToEnd(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	if err := a.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	mesh(t, a, b)
	addr := a.m.IngressAddr()

	// The seed's curl example, with fields of the producer's own in
	// workloadInfo and in params.
	var frame map[string]any
	if err := json.Unmarshal([]byte(liSeedFrame), &frame); err != nil {
		t.Fatal(err)
	}
	params := frame["params"].(map[string]any)
	params["workloadInfo"].(map[string]any)["producerNote"] = "wi-extra"
	params["batch"] = "params-extra"
	body, _ := json.Marshal(frame)
	if got, text := testkit.PostIngress(t, addr, string(body)); got != http.StatusOK {
		t.Fatalf("curl-shaped frame: status %d (%q), want 200", got, text)
	}

	atA := a.broker.WaitMethod(wireframe.MethodUpsert, 1)
	wiA := liUpsertInfo(t, atA[0])
	if wiA["id"] != "job-42" || wiA["originatedFrom"] != a.id || wiA["producerNote"] != "wi-extra" || wiA["requesterId"] != "my-scheduler" {
		t.Fatalf("upsert at A's broker = %v, want job-42 stamped with %s and the producer's field", wiA, a.id)
	}
	b.broker.WaitMethod(wireframe.MethodUpsert, 1)
	wiB := b.Upserts()[0]
	if wiB["id"] != "job-42" || wiB["originatedFrom"] != a.id || wiB["producerNote"] != "wi-extra" {
		t.Fatalf("upsert at B's broker = %v, want job-42 from %s with the producer's field", wiB, a.id)
	}
	ref := wireframe.WorkloadRef{Origin: a.id, ID: "job-42"}
	tracked, _ := a.m.table.Latest(ref)
	if len(tracked) != 1 || !strings.Contains(string(tracked[0].Params()), `"batch":"params-extra"`) ||
		!strings.Contains(string(tracked[0].Params()), `"producerNote":"wi-extra"`) {
		t.Fatalf("state table for job-42 = %+v, want one run keeping the producer's fields", tracked)
	}

	// Producer mistakes and other methods go nowhere.
	empty := `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{}}}`
	if got, text := testkit.PostIngress(t, addr, empty); got != http.StatusBadRequest {
		t.Fatalf("empty workloadInfo: status %d (%q), want 400", got, text)
	}
	foreign := strings.Replace(liFrame("foreign"), `"engine"`, `"originatedFrom":"`+b.id+`","engine"`, 1)
	if got, text := testkit.PostIngress(t, addr, foreign); got != http.StatusBadRequest {
		t.Fatalf("frame naming B as its origin: status %d (%q), want 400", got, text)
	}
	if got, text := testkit.MustDo(t, addr, testkit.Request{Method: http.MethodGet}); got != http.StatusMethodNotAllowed {
		t.Fatalf("GET: status %d (%q), want 405", got, text)
	}

	// A removal, without an origin: stamped, emitted up, relayed.
	remove := `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-42"}}`
	if got, text := testkit.PostIngress(t, addr, remove); got != http.StatusOK {
		t.Fatalf("removal: status %d (%q), want 200", got, text)
	}
	for _, n := range []*testNode{a, b} {
		rm := n.broker.WaitMethod(wireframe.MethodRemove, 1)
		var p map[string]any
		if err := json.Unmarshal(rm[0].Params, &p); err != nil {
			t.Fatal(err)
		}
		if p["workloadId"] != "job-42" || p["originatedFrom"] != a.id {
			t.Fatalf("remove at %s's broker = %v, want job-42 from %s", n.id, p, a.id)
		}
	}
	if lines, _ := a.m.table.Latest(ref); len(lines) != 0 {
		left := len(lines)
		t.Fatalf("job-42 still tracked after its removal (%d entries)", left)
	}
	// The removal came after the rejected frames: none of them reached
	// either broker. (B may hold job-42 twice: mesh returns before the
	// backfill of the new target, which re-asserts the re-sync set, is
	// necessarily done.)
	if len(a.Upserts()) != 1 {
		t.Fatalf("upserts at A's broker: %v, want only job-42's", a.Upserts())
	}
	for _, w := range b.Upserts() {
		if w["id"] != "job-42" {
			t.Fatalf("upserts at B's broker: %v, want only job-42's", b.Upserts())
		}
	}
}

// A real producer posts each frame on its own goroutine, so one job's frames
// reach the ingress out of order. Every frame is accepted, written up and
// relayed as it comes; the re-sync set keeps each job's latest state, and
// the heartbeat re-asserts it, so the peer's broker ends on that state
// whatever order the frames came in.
func TestLocalIngressOutOfOrderProducerFramesConvergeAtThePeer(t *testing.T) {
	a, b := newTestNode(t, withResyncInterval(50*time.Millisecond)), newTestNode(t)
	// Terminal entries age out after two intervals of a's clock: held still,
	// only the heartbeat's ticker runs.
	ifxUseClock(a)
	if err := a.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	mesh(t, a, b)
	addr := a.m.IngressAddr()

	// Frames shaped like the gpu-lease producer's: the id is the run id, no
	// originatedFrom (the ingress stamps it), scheduledOn null until placed.
	frame := func(id, state string, members ...string) string {
		info := []string{`"id":"` + id + `"`, `"runId":"` + id + `"`, `"model":"qwen3.5-9b"`, `"engine":"gpu-lease"`,
			`"state":"` + state + `"`, `"createdAt":1789661457000`, `"requesterId":"offload-harness/sess-1"`}
		return `{"jsonrpc":"2.0","method":"` + testframe.MethodFor(state) + `","params":{"workloadInfo":{` +
			strings.Join(append(info, members...), ",") + `}}}`
	}
	const jobA, jobB, jobC = "led-1789661457000-3", "led-1789661457000-4", "led-1789661457000-5"
	jobs := []struct {
		id     string
		frames []string // in the order they reach the ingress
		final  string
	}{
		{jobA, []string{ // with seq, terminal first
			frame(jobA, "completed", `"seq":3`, `"scheduledOn":null`, `"startedAt":1789661458000`, `"completedAt":1789661459000`, `"error":null`),
			frame(jobA, "running", `"seq":2`, `"scheduledOn":null`, `"startedAt":1789661458000`, `"completedAt":null`, `"error":null`),
			frame(jobA, "queued", `"seq":1`, `"scheduledOn":null`, `"startedAt":null`, `"completedAt":null`, `"error":null`),
		}, "completed"},
		{jobB, []string{ // without seq, placed on the peer, running first
			frame(jobB, "running", `"scheduledOn":"`+b.id+`"`, `"startedAt":1789661458000`, `"completedAt":null`, `"error":null`),
			frame(jobB, "queued", `"scheduledOn":"`+b.id+`"`, `"startedAt":null`, `"completedAt":null`, `"error":null`),
		}, "running"},
		{jobC, []string{ // failed before it started
			frame(jobC, "failed", `"seq":2`, `"scheduledOn":null`, `"startedAt":null`, `"completedAt":1789661459000`, `"error":"CUDA out of memory"`),
		}, "failed"},
	}

	// Each frame is posted on its own goroutine, all jobs at once; a job's
	// k-th frame waits only until its k-1 earlier ones have reached the
	// broker, so the arrival order is the one listed.
	reachedBroker := func(id string) int {
		n := 0
		for _, f := range a.broker.WithMethod(wireframe.MethodUpsert) {
			if bytes.Contains(f.Params, []byte(`"id":"`+id+`"`)) {
				n++
			}
		}
		return n
	}
	type result struct {
		what   string
		status int
		text   string
		err    error
	}
	results := make(chan result, 8)
	posts := 0
	for _, j := range jobs {
		for k, body := range j.frames {
			posts++
			what := fmt.Sprintf("%s frame %d", j.id, k)
			go func() {
				if !testkit.HoldsWithin(testkit.WaitTimeout, func() bool { return reachedBroker(j.id) >= k }) {
					results <- result{what: what, err: errors.New("the earlier frames never reached the broker")}
					return
				}
				status, text, err := testkit.Do(addr, testkit.Request{Header: http.Header{"Content-Type": {"application/json"}}, Body: body})
				results <- result{what, status, text, err}
			}()
		}
	}
	for range posts {
		r := <-results
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("%s: status %d (%q), err %v; want 200", r.what, r.status, r.text, r.err)
		}
	}

	for _, j := range jobs {
		if held := resyncHeld(t, a, a.id, j.id); held["state"] != j.final {
			t.Errorf("a's re-sync set holds %s as %v, want %s", j.id, held["state"], j.final)
		}
	}
	// b is sent each job's latest state a holds (a stale frame is sent to
	// no peer), then the heartbeat's re-assertions of it: b's broker ends on
	// the final state, and a re-assertion of it comes after every frame.
	for _, j := range jobs {
		testkit.Eventually(t, j.id+" re-asserted as "+j.final+" at b's broker", func() bool {
			var last map[string]any
			reasserted := false
			for _, w := range b.Upserts() {
				if w["id"] == j.id {
					last = w
				}
			}
			if last == nil || last["state"] != j.final {
				return false
			}
			for _, st := range a.m.bcast.StatsSnapshot() {
				reasserted = reasserted || st.Reasserted.Load() > 0
			}
			return reasserted
		})
	}
}

// Over HTTP, a frame may name this node as its origin or none (stamped),
// never another node: lifecycle and removal frames alike.
func TestLocalIngressOriginOverHTTP(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	other := "6a2f1c0e-0000-4000-8000-000000000000"
	life := func(id, origin string) string {
		return strings.Replace(liFrame(id), `"engine"`, `"originatedFrom":"`+origin+`","engine"`, 1)
	}
	remove := func(id, origin string) string {
		return `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"` + id + `","originatedFrom":"` + origin + `"}}`
	}
	for _, tc := range []struct {
		name, body string
		want       int
	}{
		{"lifecycle naming this node", life("own", n.id), http.StatusOK},
		{"lifecycle with an empty origin", life("empty", ""), http.StatusOK},
		{"lifecycle naming another node", life("foreign", other), http.StatusBadRequest},
		{"removal naming another node", remove("own", other), http.StatusBadRequest},
		{"removal with an empty origin", remove("empty", ""), http.StatusOK},
		{"removal naming this node", remove("own", n.id), http.StatusOK},
	} {
		if got, text := testkit.PostIngress(t, addr, tc.body); got != tc.want {
			t.Fatalf("%s: status %d (%q), want %d", tc.name, got, text, tc.want)
		}
	}
	// The last frame was accepted, so every earlier one has been decided:
	// the broker holds exactly the accepted ones, all stamped with this node.
	rms := n.broker.WaitMethod(wireframe.MethodRemove, 2)
	ups := n.Upserts()
	if len(ups) != 2 || len(rms) != 2 {
		t.Fatalf("broker got %d upserts and %d removals, want 2 and 2", len(ups), len(rms))
	}
	for _, w := range ups {
		if w["originatedFrom"] != n.id || w["id"] == "foreign" {
			t.Fatalf("upsert %v, want an accepted frame stamped with %s", w, n.id)
		}
	}
	for _, f := range rms {
		var p map[string]any
		if err := json.Unmarshal(f.Params, &p); err != nil {
			t.Fatal(err)
		}
		if p["originatedFrom"] != n.id {
			t.Fatalf("remove %v, want it stamped with %s", p, n.id)
		}
	}
}

// A broker that cannot be written is 500: nothing is tracked, and the
// daemon, its broker gone, shuts down cleanly.
func TestLocalIngressBrokerDownIs500(t *testing.T) {
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	run := liRunOwned(t, n)
	n.broker.WaitMethod("discovery:subscribe", 1)
	addr := n.m.IngressAddr()
	n.broker.fromD.Close()
	if got, text := testkit.PostIngress(t, addr, liFrame("broker-down")); got != http.StatusInternalServerError {
		t.Fatalf("status %d (%q), want 500", got, text)
	}
	if tracked := n.m.table.Sizes().Runs; tracked != 0 {
		t.Fatalf("%d testframe.Workload(s) tracked after a failed broker write", tracked)
	}
	if err := run.wait(t); err != nil {
		t.Fatalf("Run after the broker went away = %v, want nil", err)
	}
	if !n.logs.Contains("level=ERROR", "status=500") {
		t.Fatalf("no error logged for the 500; logs:\n%s", n.logs)
	}
}

// A frame whose line to the broker would be over the broker's line limit
// (256 KiB by default) is refused before anything is written or
// committed: 413, with the limit in the reason, logged once at
// warn and counted. The 1 MiB body cap is not that limit.
func TestLocalIngressRefusesAFrameOverTheBrokerLineLimitWith413(t *testing.T) {
	// The frame is within the workload bound at its most, so the line
	// limit is the bound it meets.
	n := newMetricsNode(t, true, func(c *Config) { c.WorkloadMaxBytes = wireframe.MaxWorkloadMaxBytes })
	n.start()
	addr := n.m.IngressAddr()
	ref := wireframe.WorkloadRef{Origin: n.id, ID: "over-limit"}
	before := scrape(t, n)

	// A removal remembered for the workload (a producer's: posted first):
	// an accepted lifecycle frame for it would clear the memory.
	if got, text := testkit.PostIngress(t, addr, liFrame("over-limit")); got != http.StatusOK {
		t.Fatalf("frame: status %d (%q), want 200", got, text)
	}
	if got, text := testkit.PostIngress(t, addr, `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"over-limit"}}`); got != http.StatusOK {
		t.Fatalf("removal: status %d (%q), want 200", got, text)
	}
	queued := n.m.table.Version()

	body := longNoteFrame(t, "over-limit", "")
	got, text := testkit.PostIngress(t, addr, string(body))
	if got != http.StatusRequestEntityTooLarge {
		t.Fatalf("a %d-byte frame with a %d-byte note: status %d (%q), want 413", len(body), longErrorBytes, got, text)
	}
	if want := "over its 262144-byte line limit (--broker-line-max)"; !strings.Contains(text, want) {
		t.Fatalf("reason %q does not give the limit (%q)", text, want)
	}

	// A frame accepted after it: every earlier frame has been decided.
	if got, text := testkit.PostIngress(t, addr, liFrame("after-over-limit")); got != http.StatusOK {
		t.Fatalf("next frame: status %d (%q), want 200", got, text)
	}
	n.broker.WaitUpserts("after-over-limit", 1)
	if c := n.broker.UpsertCount("over-limit"); c != 1 {
		t.Fatalf("the refused frame reached the broker: %d upserts, want the first frame's alone", c)
	}
	for _, line := range strings.Split(n.broker.Text(), "\n") {
		if len(line)+1 > wireframe.DefaultBrokerLineMax {
			t.Fatalf("the broker got a %d-byte line, over its %d-byte limit", len(line)+1, wireframe.DefaultBrokerLineMax)
		}
	}
	lines, remembered := n.m.table.Latest(ref)
	if len(lines) != 0 || !remembered {
		t.Fatalf("after the refused frame: %d runs held (want 0), removal held %v (want true)", len(lines), remembered)
	}
	if q := n.m.table.Version() - queued; q != 1 {
		t.Fatalf("%d changes to the state table since the removal, want 1 (the frame after)", q)
	}
	if c := strings.Count(n.logs.String(), "status=413"); c != 1 || !n.logs.Contains("level=WARN", `msg="ingress request rejected"`, "status=413", "262144-byte line limit") {
		t.Fatalf("want one warning for the 413 giving the limit, got %d; logs:\n%s", c, n.logs)
	}
	after := scrape(t, n)
	for series, want := range map[string]float64{
		`nvpair_wlm_broker_lines_refused_total`:          1,
		`nvpair_wlm_ingress_responses_total{code="413"}`: 1,
	} {
		if d := after[series] - before[series]; d != want {
			t.Errorf("%s moved by %v, want %v", series, d, want)
		}
	}
}

// The line limit is the broker's, set with --broker-line-max: raised to
// 1 MiB, the same frame is accepted and reaches the broker whole.
func TestLocalIngressAcceptsTheSameFrameUnderARaisedBrokerLineLimit(t *testing.T) {
	n := newTestNode(t, withBrokerLineMax(1<<20), withWorkloadMaxBytes(wireframe.MaxWorkloadMaxBytes))
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	if got, text := testkit.PostIngress(t, n.m.IngressAddr(), string(longNoteFrame(t, "long-error", ""))); got != http.StatusOK {
		t.Fatalf("status %d (%q), want 200", got, text)
	}
	n.broker.WaitUpserts("long-error", 1)
	if e, _ := n.Upserts()[0]["note"].(string); len(e) != longErrorBytes {
		t.Fatalf("the broker got a %d-byte note, want %d", len(e), longErrorBytes)
	}
	if tracked := ifxIsTracked(n, n.id, "long-error"); !tracked {
		t.Fatal("the accepted frame is not held")
	}
}

func TestLocalIngressLogsRejectionsWithoutTheBody(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	const marker = "BODY-MARKER-7f3e9c21"
	withMarker := strings.Replace(liFrame("log-rejected"), `"engine"`, `"requesterId":"`+marker+`","engine"`, 1)
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name string
		rq   testkit.Request
		want int
	}{
		{"Origin", testkit.Request{Header: http.Header{"Origin": {"null"}, "Content-Type": {"application/json"}}, Body: withMarker}, http.StatusForbidden},
		{"Host", testkit.Request{Host: "evil.example", Header: jsonCT, Body: withMarker}, http.StatusMisdirectedRequest},
		{"method", testkit.Request{Method: http.MethodPut, Header: jsonCT, Body: withMarker}, http.StatusMethodNotAllowed},
		{"content type", testkit.Request{Header: http.Header{"Content-Type": {"text/plain"}}, Body: withMarker}, http.StatusUnsupportedMediaType},
		{"wrong jsonrpc", testkit.Request{Header: jsonCT, Body: strings.Replace(withMarker, `"2.0"`, `"1.0"`, 1)}, http.StatusBadRequest},
		{"unknown state", testkit.Request{Header: jsonCT, Body: strings.Replace(withMarker, `"running"`, `"paused"`, 1)}, http.StatusBadRequest},
		{"not JSON", testkit.Request{Header: jsonCT, Body: withMarker[:len(withMarker)-3]}, http.StatusBadRequest},
	} {
		got, text := testkit.MustDo(t, addr, tc.rq)
		if got != tc.want {
			t.Fatalf("%s: status %d (%q), want %d", tc.name, got, text, tc.want)
		}
		if !n.logs.Contains("level=WARN", `msg="ingress request rejected"`, "status="+itoa(tc.want), "reason=") {
			t.Fatalf("%s: no warning with status %d and a reason; logs:\n%s", tc.name, tc.want, n.logs)
		}
	}
	if got, err := liRawPost(addr, addr, liPaddedFrame(t, withMarker, wireframe.MaxBytes+1), false); err != nil || got != http.StatusRequestEntityTooLarge {
		t.Fatalf("body cap: status %d, err %v; want 413", got, err)
	}
	if !n.logs.Contains("level=WARN", `msg="ingress request rejected"`, "status=413", "reason=") {
		t.Fatalf("body cap: no warning with status 413 and a reason; logs:\n%s", n.logs)
	}
	if strings.Contains(n.logs.String(), marker) {
		t.Fatalf("a rejection logged the request body; logs:\n%s", n.logs)
	}
	if got, text := testkit.PostIngress(t, addr, liFrame("log-accepted")); got != http.StatusOK {
		t.Fatalf("accepted frame: status %d (%q)", got, text)
	}
	if !n.logs.Contains("level=DEBUG", `msg="ingress frame accepted"`, "id=log-accepted") {
		t.Fatalf("no debug line for the accepted frame; logs:\n%s", n.logs)
	}
	if n.logs.Contains("level=WARN", "log-accepted") || n.logs.Contains("level=INFO", "log-accepted") {
		t.Fatalf("an accepted frame logged above debug; logs:\n%s", n.logs)
	}
}

// A rejection's reason may quote a value from the request (a state, an
// origin, a method, a field name, the Host). The log must never carry the
// body, so such a value is not logged in full however long it is.
func TestLocalIngressRejectionLogsDoNotCarryLongRequestValues(t *testing.T) {
	n := liStartNode(t)
	addr := n.m.IngressAddr()
	long := "LONG-VALUE-" + strings.Repeat("0123456789abcdef", 256) // 4 KiB
	frame := liFrame("long-values")
	for _, tc := range []struct {
		name string
		send func() int
		want int
	}{
		{"state", func() int {
			got, _ := testkit.PostIngress(t, addr, strings.Replace(frame, `"running"`, `"`+long+`"`, 1))
			return got
		}, http.StatusBadRequest},
		{"originatedFrom", func() int {
			got, _ := testkit.PostIngress(t, addr, strings.Replace(frame, `"engine"`, `"originatedFrom":"`+long+`","engine"`, 1))
			return got
		}, http.StatusBadRequest},
		{"method", func() int {
			got, _ := testkit.PostIngress(t, addr, strings.Replace(frame, `"workload:started"`, `"`+long+`"`, 1))
			return got
		}, http.StatusBadRequest},
		{"colliding names", func() int {
			got, _ := testkit.PostIngress(t, addr, strings.Replace(frame, `"engine"`, `"`+long+`":1,"`+long+`":2,"engine"`, 1))
			return got
		}, http.StatusBadRequest},
		{"Host", func() int {
			got, err := liRawPost(addr, long+".example:1", frame, false)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}, http.StatusMisdirectedRequest},
	} {
		if got := tc.send(); got != tc.want {
			t.Fatalf("long %s: status %d, want %d", tc.name, got, tc.want)
		}
		if strings.Contains(n.logs.String(), long) {
			t.Fatalf("a rejection for a long %s logged the value in full (%d log bytes)", tc.name, len(n.logs.String()))
		}
	}
	if c := strings.Count(n.logs.String(), `msg="ingress request rejected"`); c != 5 {
		t.Fatalf("%d rejection warnings, want 5; logs:\n%s", c, n.logs)
	}
}

// ---- helpers for this file ----

// liStartNode starts a node with the ingress on an ephemeral loopback
// port.
func liStartNode(t *testing.T) *testNode {
	t.Helper()
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	if n.m.IngressAddr() == "" {
		t.Fatal("the ingress is not bound after start")
	}
	return n
}

// liFrame returns a valid workload:started frame for id, with no
// originatedFrom, as a producer sends it.
func liFrame(id string) string {
	return `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"` + id +
		`","runId":"` + id + `","seq":1,"model":"qwen3.5-9b","engine":"llamacpp","state":"running","createdAt":1789661457000}}}`
}

// liPaddedFrame surrounds frame with whitespace to exactly size bytes.
func liPaddedFrame(t testing.TB, frame string, size int) string {
	t.Helper()
	pad := size - len(frame)
	if pad < 0 {
		t.Fatalf("frame is %d bytes, more than %d", len(frame), size)
	}
	return strings.Repeat(" ", pad/2) + frame + strings.Repeat("\n", pad-pad/2)
}

// liRaw is liRawAnswer for the test's own goroutine.
func liRaw(t testing.TB, addr, request string, closeWithin time.Duration) (*http.Response, time.Duration, bool) {
	t.Helper()
	resp, took, closed, err := liRawAnswer(addr, request, closeWithin)
	if err != nil {
		t.Fatal(err)
	}
	return resp, took, closed
}

// liRawAnswer writes a raw request on a new connection and reads the
// answer, which must come within liRejectionBudget; it returns the answer,
// how long it took, and whether the server then closed the connection
// within closeWithin.
func liRawAnswer(addr, request string, closeWithin time.Duration) (*http.Response, time.Duration, bool, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, 0, false, err
	}
	defer conn.Close()
	start := time.Now()
	conn.SetDeadline(start.Add(liRejectionBudget))
	if _, err := io.WriteString(conn, request); err != nil {
		return nil, 0, false, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, 0, false, fmt.Errorf("no answer within %s: %w", liRejectionBudget, err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return nil, 0, false, fmt.Errorf("answer body: %w", err)
	}
	resp.Body.Close()
	took := time.Since(start)
	conn.SetDeadline(time.Now().Add(closeWithin))
	_, err = br.ReadByte()
	return resp, took, errors.Is(err, io.EOF), nil
}

// liRawPost posts body to the ingress over a raw connection, with the Host
// header exactly as given and a Content-Length or chunked, and returns the
// status. The body is written
// while the answer is read, and a write error is ignored: the server may
// answer and stop reading before the body is through.
func liRawPost(addr, host, body string, chunked bool) (int, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	conn.SetDeadline(time.Now().Add(testkit.WaitTimeout))
	var req strings.Builder
	req.WriteString("POST " + wireframe.EventsPath + " HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nConnection: close\r\n")
	if chunked {
		req.WriteString("Transfer-Encoding: chunked\r\n\r\n")
		for rest := body; rest != ""; {
			c := rest[:min(len(rest), 64<<10)]
			rest = rest[len(c):]
			fmt.Fprintf(&req, "%x\r\n%s\r\n", len(c), c)
		}
		req.WriteString("0\r\n\r\n")
	} else {
		req.WriteString("Content-Length: " + itoa(len(body)) + "\r\n\r\n" + body)
	}
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		io.WriteString(conn, req.String())
	}()
	defer func() { conn.Close(); <-wrote }()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// liReadSpy records whether anything read the request body.
type liReadSpy struct {
	r    io.Reader
	read atomic.Bool
}

func (s *liReadSpy) Read(p []byte) (int, error) {
	s.read.Store(true)
	return s.r.Read(p)
}

// liStallingWriter holds the daemon's first write to the broker that contains
// match until unblock is called, as a broker slow to read would.
type liStallingWriter struct {
	w       io.Writer
	match   []byte
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	rel     sync.Once
}

func (s *liStallingWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, s.match) {
		s.once.Do(func() { close(s.entered) })
		<-s.release
	}
	return s.w.Write(p)
}

func (s *liStallingWriter) unblock() { s.rel.Do(func() { close(s.release) }) }

// liOwnedRun is a node's Run that the test itself waits for (testNode.start
// leaves that to its cleanup).
type liOwnedRun struct {
	cancel   context.CancelFunc
	finished chan struct{}
	err      error
}

func liRunOwned(t *testing.T, n *testNode) *liOwnedRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &liOwnedRun{cancel: cancel, finished: make(chan struct{})}
	go func() { r.err = n.m.Run(ctx); close(r.finished) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.finished:
		case <-time.After(testkit.WaitTimeout):
			t.Errorf("node %s did not stop", n.id)
		}
	})
	return r
}

// wait waits for Run to return and returns its error.
func (r *liOwnedRun) wait(t testing.TB) error {
	t.Helper()
	select {
	case <-r.finished:
		return r.err
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("Run did not return")
		return nil
	}
}

// liUpsertInfo decodes the workloadInfo of a workloads:upsert frame.
func liUpsertInfo(t testing.TB, f wireframe.RPC) map[string]any {
	t.Helper()
	var p struct {
		WorkloadInfo map[string]any `json:"workloadInfo"`
	}
	if err := json.Unmarshal(f.Params, &p); err != nil {
		t.Fatalf("upsert params: %v", err)
	}
	return p.WorkloadInfo
}

func liStrPtr(s string) *string { return &s }
