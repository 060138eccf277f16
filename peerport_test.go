package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/wireframe"
)

func TestPeerServerClosesTheConnectionOfAClientWithoutAPin(t *testing.T) {
	// A refused client must not keep its connection: it would hold a slot
	// of the peer port's cap for the idle timeout without authenticating.
	h := newNetPeerHarness(t)
	stranger := testkit.Mint(t, devpki.NewUUID())
	bad := testkit.PeerClient(t, &stranger, h.n.ident.DER)
	body := testframe.Lifecycle(testframe.Workload("job-stranger", "running", stranger.Principal), nil)
	for i := range 2 {
		st, reused := netPostTraced(t, bad, h.addr, body)
		if st != http.StatusForbidden {
			t.Fatalf("POST %d = %d, want 403", i, st)
		}
		if reused {
			t.Fatalf("POST %d went over the connection of the refused one before it: the server kept it open", i)
		}
	}
	// A pinned peer keeps its connection.
	good := testkit.PeerClient(t, &h.client, h.n.ident.DER)
	netPostTraced(t, good, h.addr, testframe.Lifecycle(testframe.Workload("job-a", "running", h.client.Principal), nil))
	if st, reused := netPostTraced(t, good, h.addr, testframe.Lifecycle(testframe.Workload("job-b", "running", h.client.Principal), nil)); st != http.StatusOK || !reused {
		t.Fatalf("a pinned peer's second POST = %d, reused %v; want 200 over the kept connection", st, reused)
	}
}

func TestPeerServerAnswers403ToClientsWithoutTheirPinnedCertificate(t *testing.T) {
	cases := []struct {
		name   string
		client func(h *netPeerHarness) *devpki.Identity // nil: no client certificate
	}{
		{"no client certificate", func(*netPeerHarness) *devpki.Identity { return nil }},
		{"unpinned certificate", func(*netPeerHarness) *devpki.Identity {
			id := testkit.Mint(t, devpki.NewUUID())
			return &id
		}},
		{"pinned UUID presenting a different certificate", func(h *netPeerHarness) *devpki.Identity {
			id := testkit.Mint(t, h.client.Principal)
			return &id
		}},
		{"pinned UUID as common name of a different certificate", func(h *netPeerHarness) *devpki.Identity {
			id := netMintCN(t, h.client.Principal)
			return &id
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newNetPeerHarness(t)
			bad := testkit.PeerClient(t, c.client(h), h.n.ident.DER)
			w := testframe.Workload("job-rejected", "running", h.client.Principal)
			if st := netPost(t, bad, h.addr, testframe.Lifecycle(w, nil)); st != http.StatusForbidden {
				t.Fatalf("POST = %d, want 403", st)
			}
			if st := netPost(t, bad, h.addr, testframe.Removal("job-rejected", h.client.Principal)); st != http.StatusForbidden {
				t.Fatalf("removal POST = %d, want 403", st)
			}
			h.barrier(t)
			if ids := netUpsertIDs(h.n); ids["job-rejected"] != 0 || len(h.n.broker.WithMethod(wireframe.MethodRemove)) != 0 {
				t.Fatalf("a rejected frame reached the broker: %v", h.n.broker.All())
			}
			if !h.n.logs.Contains("peer request rejected", "status=403") {
				t.Fatalf("the rejection was not logged; logs:\n%s", h.n.logs)
			}
		})
	}
}

func TestPeerServerAnswers405ToOtherMethodsAnd404ToOtherPaths(t *testing.T) {
	h := newNetPeerHarness(t)
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		req, err := http.NewRequest(method, "https://"+h.addr+wireframe.EventsPath, nil)
		testkit.Must(t, err)
		resp, err := h.c.Do(req)
		testkit.Must(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodPost {
			t.Fatalf("%s = %d (Allow %q), want 405 with Allow: POST", method, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	resp, err := h.c.Post("https://"+h.addr+"/v1/other", "application/json", strings.NewReader("{}"))
	testkit.Must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("POST to another path = %d, want 404", resp.StatusCode)
	}
}

func TestPeerServerRejectsMalformedFramesWith400(t *testing.T) {
	h := newNetPeerHarness(t)
	origin := h.client.Principal
	valid := func(overrides map[string]any) string {
		return string(testframe.Lifecycle(testframe.Workload("job-bad", "running", origin, overrides), nil))
	}
	cases := []struct{ name, body string }{
		{"not JSON", `{"jsonrpc":"2.0","method":"workload:started",`},
		{"empty body", ``},
		{"JSON array", `[` + valid(nil) + `]`},
		{`jsonrpc "1.0"`, strings.Replace(valid(nil), `"jsonrpc":"2.0"`, `"jsonrpc":"1.0"`, 1)},
		{"jsonrpc missing", strings.Replace(valid(nil), `"jsonrpc":"2.0",`, ``, 1)},
		{"unknown method", strings.Replace(valid(nil), wireframe.MethodStarted, "workload:paused", 1)},
		{"workloads:upsert is not a peer method", strings.Replace(valid(nil), wireframe.MethodStarted, wireframe.MethodUpsert, 1)},
		{"params missing", `{"jsonrpc":"2.0","method":"workload:started"}`},
		{"workloadInfo missing", `{"jsonrpc":"2.0","method":"workload:started","params":{}}`},
		{"workloadInfo not an object", `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":"job-bad"}}`},
		{"id missing", valid(map[string]any{"id": nil})},
		{"id empty", valid(map[string]any{"id": ""})},
		{"model missing", valid(map[string]any{"model": nil})},
		{"engine missing", valid(map[string]any{"engine": nil})},
		{"state missing", valid(map[string]any{"state": nil})},
		{"originatedFrom missing", valid(map[string]any{"originatedFrom": nil})},
		{"seq not a number", valid(map[string]any{"seq": "1"})},
		{"removal without workloadId", `{"jsonrpc":"2.0","method":"workloads:remove","params":{"originatedFrom":"` + origin + `"}}`},
		// A removal without originatedFrom is an older sender's, taken as the
		// stock peers take it (TestAPrincipalMayNameItselfAndARemovalMayNameNoOriginWhateverDiscoverySays);
		// one whose originatedFrom is not a string is not.
		{"removal whose originatedFrom is a number", `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-bad","originatedFrom":7}}`},
	}
	for _, c := range cases {
		if st := netPost(t, h.c, h.addr, []byte(c.body)); st != http.StatusBadRequest {
			t.Errorf("%s: POST = %d, want 400", c.name, st)
		}
	}
	h.barrier(t)
	for _, f := range h.n.broker.All() {
		if f.Method == wireframe.MethodRemove || (f.Method == wireframe.MethodUpsert && !bytes.Contains(f.Params, []byte(`"barrier-`))) {
			t.Fatalf("a malformed frame reached the broker: %s %s", f.Method, f.Params)
		}
	}
}

func TestPeerServerAnswers413ToBodiesOver1MiB(t *testing.T) {
	h := newNetPeerHarness(t)
	// A valid frame padded with whitespace to an exact size.
	padded := func(id string, size int) []byte {
		b := testframe.Lifecycle(testframe.Workload(id, "running", h.client.Principal), nil)
		return append(b, bytes.Repeat([]byte(" "), size-len(b))...)
	}
	if st := netPost(t, h.c, h.addr, padded("job-at-cap", wireframe.MaxBytes)); st != http.StatusOK {
		t.Fatalf("a body of exactly 1 MiB = %d, want 200", st)
	}
	if st := netPost(t, h.c, h.addr, padded("job-over-cap", wireframe.MaxBytes+1)); st != http.StatusRequestEntityTooLarge {
		t.Fatalf("a declared body of 1 MiB + 1 = %d, want 413", st)
	}
	// Without a declared length (chunked), the cap still holds.
	req, err := http.NewRequest(http.MethodPost, "https://"+h.addr+wireframe.EventsPath, bytes.NewReader(padded("job-chunked", wireframe.MaxBytes+1)))
	testkit.Must(t, err)
	req.ContentLength = -1 // unknown: sent chunked
	resp, err := h.c.Do(req)
	testkit.Must(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a chunked body over 1 MiB = %d, want 413", resp.StatusCode)
	}
	h.barrier(t)
	if ids := netUpsertIDs(h.n); ids["job-at-cap"] != 1 || ids["job-over-cap"] != 0 || ids["job-chunked"] != 0 {
		t.Fatalf("upserts at the broker = %v, want only job-at-cap", ids)
	}
}

// A peer frame whose line to the broker would be over the broker's line
// limit (256 KiB by default) is refused with 413, which the sender does not
// retry. Nothing reaches the broker, and the dedup records nothing: the
// same frame again is refused again, not taken as already seen.
func TestPeerServerAnswers413ToAFrameOverTheBrokerLineLimit(t *testing.T) {
	// Within the workload bound at its most: the line limit refuses them.
	h := newNetPeerHarness(t, withWorkloadMaxBytes(wireframe.MaxWorkloadMaxBytes))
	origin := h.client.Principal
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"lifecycle", longErrorFrame(t, "peer-over-limit", origin)},
		{"re-assertion (bypasses the dedup)", testframe.Lifecycle(longErrorWorkload("peer-over-limit", origin), map[string]any{"resync": true})},
		// A removal's line is built from its two bounded fields alone
		// (wireframe.MaxKeyFieldBytes), so no removal can be over the line limit.
	} {
		for attempt := 1; attempt <= 2; attempt++ {
			if st := netPost(t, h.c, h.addr, c.body); st != http.StatusRequestEntityTooLarge {
				t.Fatalf("%s, attempt %d: POST of %d bytes = %d, want 413", c.name, attempt, len(c.body), st)
			}
		}
		if n := h.n.m.peers.DedupLen(); n != 0 {
			t.Fatalf("%s: the dedup recorded %d key(s) for a refused frame", c.name, n)
		}
	}
	h.barrier(t)
	if ids := netUpsertIDs(h.n); ids["peer-over-limit"] != 0 || len(h.n.broker.WithMethod(wireframe.MethodRemove)) != 0 {
		t.Fatalf("a refused frame reached the broker: upserts %v, %d removal(s)", ids, len(h.n.broker.WithMethod(wireframe.MethodRemove)))
	}
	if n := h.n.m.out.Counts().Refused; n != 4 {
		t.Fatalf("%d lines refused, want 4", n)
	}
	logs := h.n.logs.String()
	if c := strings.Count(logs, "status=413"); c != 4 || strings.Contains(logs, "status=500") ||
		!h.n.logs.Contains("level=WARN", `msg="peer request rejected"`, "status=413", "over its 262144-byte line limit (--broker-line-max)") {
		t.Fatalf("want four warnings for the 413s giving the limit, got %d; logs:\n%s", c, logs)
	}
}

// Raised to 1 MiB with --broker-line-max, the same frame is written.
func TestPeerServerWritesTheSameFrameUnderARaisedBrokerLineLimit(t *testing.T) {
	h := newNetPeerHarness(t, withBrokerLineMax(1<<20), withWorkloadMaxBytes(wireframe.MaxWorkloadMaxBytes))
	if st := netPost(t, h.c, h.addr, longErrorFrame(t, "peer-long-error", h.client.Principal)); st != http.StatusOK {
		t.Fatalf("POST = %d, want 200", st)
	}
	h.n.broker.WaitUpserts("peer-long-error", 1)
	if e, _ := h.n.Upserts()[0]["error"].(string); len(e) != longErrorBytes {
		t.Fatalf("the broker got a %d-byte error text, want %d", len(e), longErrorBytes)
	}
}

func TestPeerServerRelaysWorkloadInfoUnchanged(t *testing.T) {
	h := newNetPeerHarness(t)
	raw := `{ "id" : "job-raw",  "model":"qwen3.5-9b","engine":"vendor/engine v2","state":"running",` +
		`"originatedFrom":"` + h.client.Principal + `","seq":3,"createdAt":1789661457000,"startedAt":null,` +
		`"error":"line1\nline2 \u00e9 \u2028 <tag>","custom":{"nested":[1,2.50,true,null,"x"],"Empty":{}},` +
		`"big":12345678901234567890123,"requesterId":null }`
	body := `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":` + raw + `,"note":"kept"}}`
	if st := netPost(t, h.c, h.addr, []byte(body)); st != http.StatusOK {
		t.Fatalf("POST = %d, want 200", st)
	}
	frames := h.n.broker.WaitMethod(wireframe.MethodUpsert, 1)
	var p struct {
		WorkloadInfo json.RawMessage `json:"workloadInfo"`
	}
	testkit.Must(t, json.Unmarshal(frames[0].Params, &p))
	// Byte for byte up to insignificant whitespace, which the relay may
	// compact to keep a frame on one line: member order, escapes, number
	// literals and unknown members must all survive.
	var want, got bytes.Buffer
	testkit.Must(t, json.Compact(&want, []byte(raw)))
	testkit.Must(t, json.Compact(&got, p.WorkloadInfo))
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("workloadInfo at the broker\n got %s\nwant %s", p.WorkloadInfo, raw)
	}
}

func TestPeerServerDeduplicatesLifecycleEventsByTheirKey(t *testing.T) {
	h := newNetPeerHarness(t)
	origin := h.client.Principal
	base := testframe.Workload("job-d", "running", origin, map[string]any{"scheduledOn": origin})
	variant := func(overrides map[string]any) map[string]any {
		return testframe.Workload("job-d", "running", origin, map[string]any{"scheduledOn": origin}, overrides)
	}
	other := devpki.NewUUID()
	cases := []struct {
		name      string
		method    string // "" for the state's method
		w         map[string]any
		delivered bool
	}{
		{"first delivery", "", base, true},
		{"the same event again", "", base, false},
		{"the same event from another method", wireframe.MethodSubmitted, base, false},
		{"another model", "", variant(map[string]any{"model": "other-model"}), false},
		{"another createdAt and an extra field", "", variant(map[string]any{"createdAt": 1, "extra": "x"}), false},
		{"another state", "", variant(map[string]any{"state": "completed"}), true},
		{"another seq", "", variant(map[string]any{"seq": 2}), true},
		{"another scheduledOn", "", variant(map[string]any{"scheduledOn": other}), true},
		{"another runId", "", variant(map[string]any{"runId": "run-2"}), true},
		{"another engine", "", variant(map[string]any{"engine": "vllm"}), true},
		{"another originatedFrom", "", variant(map[string]any{"originatedFrom": other}), true},
		{"another id", "", testframe.Workload("job-d2", "running", origin, map[string]any{"scheduledOn": origin}), true},
	}
	want := 0
	for _, c := range cases {
		body := testframe.Lifecycle(c.w, nil)
		if c.method != "" {
			body = bytes.Replace(body, []byte(wireframe.MethodStarted), []byte(c.method), 1)
		}
		if st := netPost(t, h.c, h.addr, body); st != http.StatusOK {
			t.Fatalf("%s: POST = %d, want 200 (a duplicate is 200 too)", c.name, st)
		}
		if c.delivered {
			want++
		}
		h.barrier(t)
		if got := len(h.n.Upserts()) - h.barriers; got != want {
			t.Fatalf("%s: %d upserts at the broker, want %d", c.name, got, want)
		}
	}
}

func TestPeerServerResyncFrameBypassesDedup(t *testing.T) {
	h := newNetPeerHarness(t)
	w := testframe.Workload("job-r", "running", h.client.Principal)
	steps := []struct {
		name   string
		extra  map[string]any
		reach  bool
		status int
	}{
		{"first delivery", nil, true, 200},
		{"re-assertion", map[string]any{"resync": true}, true, 200},
		{"second re-assertion", map[string]any{"resync": true}, true, 200},
		{"plain duplicate", nil, false, 200},
		{"resync false is a plain duplicate", map[string]any{"resync": false}, false, 200},
		{"third re-assertion", map[string]any{"resync": true}, true, 200},
	}
	want := 0
	for _, s := range steps {
		if st := netPost(t, h.c, h.addr, testframe.Lifecycle(w, s.extra)); st != s.status {
			t.Fatalf("%s: POST = %d, want %d", s.name, st, s.status)
		}
		if s.reach {
			want++
		}
		h.barrier(t)
		if got := netUpsertIDs(h.n)["job-r"]; got != want {
			t.Fatalf("%s: job-r reached the broker %d times, want %d", s.name, got, want)
		}
	}
}

func TestPeerServerRelaysRemovalOnce(t *testing.T) {
	h := newNetPeerHarness(t)
	origin, other := h.client.Principal, devpki.NewUUID()
	steps := []struct {
		id, origin string
		reach      bool
	}{
		{"job-x", origin, true},
		{"job-x", origin, false}, // duplicate
		{"job-x", other, true},   // same id from another origin
		{"job-y", origin, true},
		{"job-x", origin, false},
	}
	var want []string
	for i, s := range steps {
		if st := netPost(t, h.c, h.addr, testframe.Removal(s.id, s.origin)); st != http.StatusOK {
			t.Fatalf("step %d: POST = %d, want 200", i, st)
		}
		if s.reach {
			want = append(want, s.id+"@"+s.origin)
		}
	}
	h.barrier(t)
	var got []string
	for _, f := range h.n.broker.WithMethod(wireframe.MethodRemove) {
		var p struct{ WorkloadID, OriginatedFrom string }
		testkit.Must(t, json.Unmarshal(f.Params, &p))
		got = append(got, p.WorkloadID+"@"+p.OriginatedFrom)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("workloads:remove at the broker = %v, want %v", got, want)
	}
	if ids := netUpsertIDs(h.n); len(ids) != 1 {
		t.Fatalf("a removal produced an upsert: %v", ids)
	}
}

func TestPeerServerAnswers500AndRecordsNothingWhenTheBrokerWriteFails(t *testing.T) {
	var fw *netFailingWriter
	h := newNetPeerHarness(t, func(c *Config) { fw = &netFailingWriter{w: c.Out}; c.Out = fw })
	fw.fail.Store(true)
	if st := netPost(t, h.c, h.addr, testframe.Lifecycle(testframe.Workload("job-f", "running", h.client.Principal), nil)); st != http.StatusInternalServerError {
		t.Fatalf("POST with a failing broker = %d, want 500", st)
	}
	if n := h.n.m.peers.DedupLen(); n != 0 {
		t.Fatalf("dedup recorded %d key(s) for a frame the broker never got", n)
	}
	if !h.n.logs.Contains("broker write failed", "status=500") {
		t.Fatalf("the failed write was not logged; logs:\n%s", h.n.logs)
	}
}

func TestPeerServerDeliversConcurrentDuplicatesOnce(t *testing.T) {
	// A slow broker write widens the window in which racing duplicates
	// could both pass the dedup check.
	h := newNetPeerHarness(t, func(c *Config) { c.Out = &netSlowWriter{w: c.Out, delay: 30 * time.Millisecond} })
	body := testframe.Lifecycle(testframe.Workload("job-race", "running", h.client.Principal), nil)
	const n = 20
	clients := make([]*http.Client, n)
	for i := range clients {
		clients[i] = testkit.PeerClient(t, &h.client, h.n.ident.DER)
		// Warm the connection so that the posts below start together.
		resp, err := clients[i].Get("https://" + h.addr + wireframe.EventsPath)
		testkit.Must(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	start := make(chan struct{})
	statuses := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			<-start
			resp, err := clients[i].Post("https://"+h.addr+wireframe.EventsPath, "application/json", bytes.NewReader(body))
			if err != nil {
				errs[i] = err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	close(start)
	wg.Wait()
	for i := range statuses {
		if errs[i] != nil || statuses[i] != http.StatusOK {
			t.Fatalf("post %d: status %d err %v, want 200", i, statuses[i], errs[i])
		}
	}
	h.barrier(t)
	if got := netUpsertIDs(h.n)["job-race"]; got != 1 {
		t.Fatalf("%d concurrent duplicates reached the broker %d times, want once", n, got)
	}
}

func TestPeerServerHasReadTimeoutsAndNoWriteTimeout(t *testing.T) {
	m, err := NewManager(Config{NodeID: devpki.NewUUID(), In: strings.NewReader(""), Out: io.Discard, ClusterDir: t.TempDir()})
	testkit.Must(t, err)
	t.Cleanup(func() { m.bcast.Close(time.Second) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	testkit.Must(t, err)
	var wg sync.WaitGroup
	srv := m.servePeers(&wg, ln)
	t.Cleanup(func() { srv.Close(); wg.Wait() })

	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Fatalf("timeouts: header %v, read %v, idle %v; all must be set", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.IdleTimeout)
	}
	if srv.WriteTimeout != 0 {
		t.Fatalf("WriteTimeout = %v, want none: it would cut the answer after a slow broker write had landed", srv.WriteTimeout)
	}
	if peerwire.ClientIdleTimeout <= 0 || peerwire.ClientIdleTimeout >= srv.IdleTimeout {
		t.Fatalf("client idle timeout %v must be shorter than the server's %v", peerwire.ClientIdleTimeout, srv.IdleTimeout)
	}
}

func TestPeerServerAcceptsTLS12AndRefusesOlder(t *testing.T) {
	h := newNetPeerHarness(t)
	cert, err := h.client.TLSCertificate()
	testkit.Must(t, err)
	dial := func(minV, maxV uint16) error {
		c, err := tls.Dial("tcp", h.addr, &tls.Config{
			Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: minV, MaxVersion: maxV,
		})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(tls.VersionTLS12, tls.VersionTLS12); err != nil {
		t.Fatalf("TLS 1.2 handshake failed: %v", err)
	}
	if err := dial(tls.VersionTLS10, tls.VersionTLS11); err == nil {
		t.Fatal("a TLS 1.1 handshake succeeded")
	}
}

// ---- helpers (net helper) ----

// netPeerHarness is a started node whose peer port is driven by a test
// client holding a pinned certificate.
type netPeerHarness struct {
	n        *testNode
	client   devpki.Identity
	c        *http.Client
	addr     string
	barriers int // barrier upserts so far
}

func newNetPeerHarness(t *testing.T, opts ...nodeOption) *netPeerHarness {
	t.Helper()
	n := newTestNode(t, opts...)
	client := testkit.Mint(t, devpki.NewUUID())
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, client))
	n.start()
	return &netPeerHarness{n: n, client: client, c: testkit.PeerClient(t, &client, n.ident.DER), addr: n.m.PeerAddr().String()}
}

// barrier posts a fresh workload and waits until the broker has it: every
// frame answered before it has then been collected.
func (h *netPeerHarness) barrier(t testing.TB) {
	t.Helper()
	h.barriers++
	id := "barrier-" + itoa(h.barriers)
	if st := netPost(t, h.c, h.addr, testframe.Lifecycle(testframe.Workload(id, "running", h.client.Principal), nil)); st != http.StatusOK {
		t.Fatalf("barrier POST = %d", st)
	}
	testkit.Eventually(t, id+" at the broker", func() bool { return netUpsertIDs(h.n)[id] == 1 })
}

// netPost posts body to the peer endpoint at addr and returns the status.
func netPost(t testing.TB, c *http.Client, addr string, body []byte) int {
	t.Helper()
	st, _ := netPostTraced(t, c, addr, body)
	return st
}

// netPostAnswer posts body to the peer endpoint at addr and returns the
// status and the answer's text.
func netPostAnswer(t testing.TB, c *http.Client, addr string, body []byte) (int, string) {
	t.Helper()
	resp, err := c.Post("https://"+addr+wireframe.EventsPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST to %s: %v", addr, err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	testkit.Must(t, err)
	return resp.StatusCode, strings.TrimSpace(string(text))
}

// netPostTraced is netPost that also reports whether the request went on a
// reused connection.
func netPostTraced(t testing.TB, c *http.Client, addr string, body []byte) (status int, reused bool) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "https://"+addr+wireframe.EventsPath, bytes.NewReader(body))
	testkit.Must(t, err)
	req.Header.Set("Content-Type", "application/json")
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
	}))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST to %s: %v", addr, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, reused
}

// netUpsertIDs counts the workloads:upsert frames at n's broker by workload id.
func netUpsertIDs(n *testNode) map[string]int {
	ids := map[string]int{}
	for _, w := range n.Upserts() {
		id, _ := w["id"].(string)
		ids[id]++
	}
	return ids
}

var netBarrierSeq atomic.Int64

// netBarrier sends n a log/set-level request and waits for the answer: the
// read loop handles frames in order, so every frame sent before it has been
// handled. It returns how long the answer took.
func netBarrier(t testing.TB, n *testNode) time.Duration {
	t.Helper()
	id := `"net-barrier-` + itoa(int(netBarrierSeq.Add(1))) + `"`
	start := time.Now()
	n.broker.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"log/set-level","params":{"level":"debug"}}`)
	n.broker.WaitResponse(id)
	return time.Since(start)
}

// netFailingWriter fails every workloads:upsert and workloads:remove write
// while fail is set.
type netFailingWriter struct {
	w    io.Writer
	fail atomic.Bool
}

func (f *netFailingWriter) Write(p []byte) (int, error) {
	relay := bytes.Contains(p, []byte(`"method":"`+wireframe.MethodUpsert+`"`)) || bytes.Contains(p, []byte(`"method":"`+wireframe.MethodRemove+`"`))
	if relay && f.fail.Load() {
		return 0, errors.New("broker pipe closed")
	}
	return f.w.Write(p)
}

// netSlowWriter delays each workloads:upsert write.
type netSlowWriter struct {
	w     io.Writer
	delay time.Duration
}

func (s *netSlowWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"method":"`+wireframe.MethodUpsert+`"`)) {
		time.Sleep(s.delay)
	}
	return s.w.Write(p)
}

// netLineRecorder records the lines written to it.
type netLineRecorder struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (r *netLineRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.Write(p)
}

func (r *netLineRecorder) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Split(strings.TrimSuffix(r.buf.String(), "\n"), "\n")
}
