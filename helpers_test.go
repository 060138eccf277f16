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
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/devpki"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/pairbroker"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/testframe"
	"nvpair-workload-manager/internal/wireframe"
)

// waitTimeout bounds every wait on a condition in the tests. Nothing in the
// tests sleeps and hopes: they wait for a condition until this deadline.
const waitTimeout = 10 * time.Second

// waitsOutRealTime skips, under -short, a test that must let a real
// interval pass (a deadline, a backoff, a Retry-After, a reload): the
// inner loop stays under a minute, and the full run takes every one.
func waitsOutRealTime(t *testing.T, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: waits out %s", what)
	}
}

// eventually waits until cond holds or fails the test after waitTimeout.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !holdsWithin(waitTimeout, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// holdsWithin waits until cond holds and reports whether it did before the
// timeout. Unlike eventually it does not fail the test, so a goroutine other
// than the test's may wait with it.
func holdsWithin(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// frameLog records every line a daemon writes to its broker, in order, and
// answers the questions the tests ask of them. The in-process testBroker
// embeds it (e2e's daemonProc embeds a copy of its own).
type frameLog struct {
	t      testing.TB
	mu     sync.Mutex // guards lines and frames
	lines  []string
	frames []wireframe.RPC
	// lineMax is the longest line the broker reads, newline included:
	// PAIR's (pairbroker.LineMax) when 0; a node given a longer
	// --broker-line-max sets it.
	lineMax atomic.Int64
}

// readFrom records lines from r until it ends. A line that is not a JSON
// frame fails the test: stdout carries only frames.
//
// A line longer than PAIR's broker reads (pairbroker.LineMax, unless the
// node was given a longer limit) fails the test, and nothing after it is
// recorded: PAIR's reader has stopped for good by then. The rest is
// drained, so that the daemon does not block on a test already failed.
func (l *frameLog) readFrom(r io.Reader) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if max := l.maxLine(); len(line) > max {
			l.t.Errorf("daemon wrote a line of %d bytes, over the %d its broker reads: PAIR's broker stops reading for good there", len(line), max)
			io.Copy(io.Discard, br)
			return
		}
		if errors.Is(err, os.ErrClosed) {
			// The test closed the pipe at its cleanup, after the daemon
			// was stopped, while this reader was still behind (a broker
			// that did not read leaves a backlog, read late on a loaded
			// machine): the line it was in was cut by that close, not
			// written short by the daemon.
			return
		}
		if len(line) > 0 {
			line = bytes.TrimSuffix(line, []byte("\n"))
			var f wireframe.RPC
			if jerr := json.Unmarshal(line, &f); jerr != nil {
				l.t.Errorf("daemon wrote a line that is not a JSON frame: %q", line)
			}
			l.mu.Lock()
			l.lines = append(l.lines, string(line))
			l.frames = append(l.frames, f)
			l.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// maxLine is the longest line the broker reads, newline included.
func (l *frameLog) maxLine() int {
	if n := l.lineMax.Load(); n > 0 {
		return int(n)
	}
	return pairbroker.LineMax
}

// all returns a copy of every frame received so far.
func (l *frameLog) all() []wireframe.RPC {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]wireframe.RPC(nil), l.frames...)
}

// text returns everything received, one frame per line.
func (l *frameLog) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// withMethod returns the frames received so far with the given method.
func (l *frameLog) withMethod(method string) []wireframe.RPC {
	var out []wireframe.RPC
	for _, f := range l.all() {
		if f.Method == method {
			out = append(out, f)
		}
	}
	return out
}

// waitMethod waits until n frames with method have arrived and returns them.
func (l *frameLog) waitMethod(method string, n int) []wireframe.RPC {
	l.t.Helper()
	eventually(l.t, fmt.Sprintf("%d %s frame(s) from the daemon", n, method), func() bool {
		return len(l.withMethod(method)) >= n
	})
	return l.withMethod(method)
}

// waitResponseLine waits for the answer to request id (its JSON text) and
// returns it as written.
func (l *frameLog) waitResponseLine(id string) string {
	l.t.Helper()
	var raw string
	eventually(l.t, "the answer to request "+id, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, f := range l.frames {
			if f.IsResponse() && string(f.ID) == id {
				raw = l.lines[i]
				return true
			}
		}
		return false
	})
	return raw
}

// waitResponse waits for the answer to request id (its JSON text).
func (l *frameLog) waitResponse(id string) wireframe.RPC {
	l.t.Helper()
	var f wireframe.RPC
	if err := json.Unmarshal([]byte(l.waitResponseLine(id)), &f); err != nil {
		l.t.Fatal(err)
	}
	return f
}

// upserts returns the workload objects of the workloads:upsert frames.
func (l *frameLog) upserts() []map[string]any {
	var out []map[string]any
	for _, f := range l.withMethod(wireframe.MethodUpsert) {
		var p struct {
			WorkloadInfo map[string]any `json:"workloadInfo"`
		}
		if err := json.Unmarshal(f.Params, &p); err != nil {
			l.t.Fatalf("upsert params: %v", err)
		}
		out = append(out, p.WorkloadInfo)
	}
	return out
}

// upsertCount counts the workloads:upsert frames for workload id so far.
func (l *frameLog) upsertCount(id string) int {
	n := 0
	for _, w := range l.upserts() {
		if w["id"] == id {
			n++
		}
	}
	return n
}

// waitUpserts waits until n workloads:upsert frames for id have arrived.
func (l *frameLog) waitUpserts(id string, n int) {
	l.t.Helper()
	eventually(l.t, fmt.Sprintf("%d workloads:upsert of %s", n, id), func() bool { return l.upsertCount(id) >= n })
}

// testBroker plays the broker's side of an in-process daemon's local
// channel: it writes frames to the daemon and records every frame the
// daemon writes back.
type testBroker struct {
	frameLog
	toD   *io.PipeWriter // broker -> daemon
	fromD *io.PipeReader // daemon -> broker
	dIn   *io.PipeReader // the daemon's In
	dOut  *io.PipeWriter // the daemon's Out
	done  chan struct{}  // the recorder has stopped
}

func newTestBroker(t testing.TB) *testBroker {
	b := &testBroker{frameLog: frameLog{t: t}, done: make(chan struct{})}
	b.dIn, b.toD = io.Pipe()
	b.fromD, b.dOut = io.Pipe()
	go func() { defer close(b.done); b.readFrom(b.fromD) }()
	t.Cleanup(func() { b.toD.Close(); b.fromD.Close() })
	return b
}

// send writes one line to the daemon.
func (b *testBroker) send(line string) {
	b.t.Helper()
	if _, err := io.WriteString(b.toD, line+"\n"); err != nil {
		b.t.Fatalf("write to daemon: %v", err)
	}
}

// sendFrame encodes and sends a notification.
func (b *testBroker) sendFrame(method string, params any) {
	b.t.Helper()
	p, err := json.Marshal(params)
	if err != nil {
		b.t.Fatal(err)
	}
	b.send(string(wireframe.EncodeNotification(method, p)))
}

// testNode is one in-process daemon with its own cluster directory.
type testNode struct {
	t          testing.TB
	id         string
	ident      devpki.Identity
	appDir     string
	clusterDir string
	broker     *testBroker
	m          *Manager
	logs       *logBuffer
	cancel     context.CancelFunc
	done       chan error
}

type nodeOption func(*Config)

func withResyncInterval(d time.Duration) nodeOption {
	return func(c *Config) { c.ResyncInterval = d }
}

// withConnLimits sets the listeners' connection caps: a test whose many
// connections all come from 127.0.0.1 raises the per-source cap.
func withConnLimits(c httpguard.ConnLimits) nodeOption {
	return func(cfg *Config) { cfg.Conns = c }
}

func withBrokerLineMax(n int) nodeOption {
	return func(c *Config) { c.BrokerLineMax = n }
}

// newTestNode mints an identity and builds a Manager; start runs it.
func newTestNode(t testing.TB, opts ...nodeOption) *testNode {
	t.Helper()
	id := devpki.NewUUID()
	ident, err := devpki.Mint(id)
	if err != nil {
		t.Fatal(err)
	}
	app := t.TempDir()
	n := &testNode{t: t, id: id, ident: ident, appDir: app, clusterDir: filepath.Join(app, "cluster"),
		broker: newTestBroker(t), logs: &logBuffer{}, done: make(chan error, 1)}
	if err := devpki.WriteIdentity(n.clusterDir, ident); err != nil {
		t.Fatal(err)
	}
	// Admitted, as a real member is: membership does not hang on its pins.
	if err := devpki.WriteAdmission(n.clusterDir, "test-cluster", 1); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		NodeID: id, Version: "test", PeerAddr: "127.0.0.1:0", ClusterDir: n.clusterDir,
		In: n.broker.dIn, Out: n.broker.dOut,
		Logger: slog.New(slog.NewTextHandler(n.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.BrokerLineMax > pairbroker.LineMax {
		n.broker.lineMax.Store(int64(cfg.BrokerLineMax)) // the test reads longer lines than PAIR's broker
	}
	if n.m, err = NewManager(cfg); err != nil {
		t.Fatal(err)
	}
	// A TLS handshake under the race detector on a loaded machine can take
	// seconds, and the listeners close a connection that has not started
	// its first request 10 s after its accept (spec 3.7): when that was
	// 3 s, a test client's fresh connection was closed just after its
	// handshake ("http: server closed idle connection") in CI's loaded
	// pass. An in-process node's server runs under the race detector as
	// well, so it gets the tests' wait timeout. That deadline's own tests
	// set theirs (internal/httpguard/connlimit_test.go).
	for _, l := range []*httpguard.ConnLimiter{n.m.conns.Peer, n.m.conns.Ingress, n.m.conns.Metrics} {
		l.FirstRequest = waitTimeout
	}
	return n
}

// start runs the node and waits for its ready frame.
func (n *testNode) start() *testNode {
	n.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() { n.done <- n.m.Run(ctx) }()
	n.t.Cleanup(n.stop)
	n.broker.waitMethod("ready", 1)
	return n
}

// stop ends the node and waits for Run to return.
func (n *testNode) stop() {
	n.cancel()
	select {
	case <-n.done:
	case <-time.After(waitTimeout):
		n.t.Errorf("node %s did not stop", n.id)
	}
}

// peerPort returns the bound inter-node port.
func (n *testNode) peerPort() int {
	return n.m.PeerAddr().(*net.TCPAddr).Port
}

// trust pins the other nodes' certificates in this node's cluster dir.
func (n *testNode) trust(others ...*testNode) {
	n.t.Helper()
	for _, o := range others {
		if err := devpki.PinIdentity(n.clusterDir, o.ident); err != nil {
			n.t.Fatal(err)
		}
	}
}

// discover sends this node a discovery snapshot listing the given nodes.
func (n *testNode) discover(nodes ...*testNode) {
	n.broker.sendFrame("discovery:nodes", map[string]any{"nodes": discoveryEntries(nodes...)})
}

func discoveryEntries(nodes ...*testNode) []map[string]any {
	var out []map[string]any
	for _, o := range nodes {
		out = append(out, map[string]any{
			"hostUuid": o.id, "name": "node-" + o.id[:8], "ip": "127.0.0.1",
			"clusterUuid": o.id, "trusted": true,
			"services": map[string]any{"wl": map[string]any{"port": o.peerPort()}},
		})
	}
	return out
}

// waitTargets waits until the node broadcasts to n targets.
func (n *testNode) waitTargets(count int) {
	n.t.Helper()
	eventually(n.t, fmt.Sprintf("%d broadcast target(s)", count), func() bool { return n.m.bcast.TargetCount() == count })
}

// mesh starts nodes that pin and discover each other, fully connected.
func mesh(t testing.TB, nodes ...*testNode) {
	t.Helper()
	for _, n := range nodes {
		var others []*testNode
		for _, o := range nodes {
			if o != n {
				others = append(others, o)
			}
		}
		n.trust(others...)
	}
	for _, n := range nodes {
		n.start()
	}
	for _, n := range nodes {
		n.m.trust.Reload()
		n.discover(nodes...)
	}
	for _, n := range nodes {
		n.waitTargets(len(nodes) - 1)
	}
}

// longErrorBytes is the length of longErrorFrame's error text: 300 KiB,
// over the broker's default 256 KiB line limit and under the 1 MiB cap on a
// request body.
const longErrorBytes = 300 << 10

// longErrorWorkload is a failed workload whose error text is longErrorBytes
// long, so its line to the broker is over the default line limit. An empty
// origin leaves originatedFrom out, as a producer on the ingress may.
func longErrorWorkload(id, origin string) map[string]any {
	w := testframe.Workload(id, "failed", origin, map[string]any{"error": strings.Repeat("e", longErrorBytes)})
	if origin == "" {
		delete(w, "originatedFrom")
	}
	return w
}

// longErrorFrame is the workload:errored notification of longErrorWorkload.
func longErrorFrame(t testing.TB, id, origin string) []byte {
	t.Helper()
	p, err := json.Marshal(map[string]any{"workloadInfo": longErrorWorkload(id, origin)})
	if err != nil {
		t.Fatal(err)
	}
	return wireframe.EncodeNotification(wireframe.MethodErrored, p)
}

// sendLifecycle sends a local-origin lifecycle frame from the broker.
func (n *testNode) sendLifecycle(w map[string]any) {
	n.broker.sendFrame(testframe.MethodFor(w["state"].(string)), map[string]any{"workloadInfo": w})
}

// sendRemove sends a local-origin removal from the broker.
func (n *testNode) sendRemove(id string) {
	n.broker.sendFrame(wireframe.MethodRemove, map[string]any{"workloadId": id, "originatedFrom": n.id})
}

// upserts returns the workload objects the node's broker received.
func (n *testNode) upserts() []map[string]any { return n.broker.upserts() }

// logBuffer collects a daemon's log output for assertions.
type logBuffer struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// contains reports whether some log line holds every fragment.
func (l *logBuffer) contains(fragments ...string) bool {
	for _, line := range strings.Split(l.String(), "\n") {
		all := true
		for _, f := range fragments {
			if !strings.Contains(line, f) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

func itoa(i int) string { return strconv.Itoa(i) }

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// typeViolations are workload object members the broker cannot decode, each
// with the reason the daemon gives. The ingress, the peer port and the
// broker's own channel must all refuse them; the last cases are a raw
// invalid byte, refused for the whole frame before any field is read.
var typeViolations = []struct{ name, member, reason string }{
	{"createdAt an RFC 3339 string", `"createdAt":"2026-01-01T00:00:00Z"`, "workloadInfo.createdAt must be an integer (epoch milliseconds)"},
	{"createdAt a fraction", `"createdAt":1789661457000.5`, "workloadInfo.createdAt must be an integer (epoch milliseconds)"},
	{"startedAt a word", `"startedAt":"yesterday"`, "workloadInfo.startedAt must be an integer (epoch milliseconds) or null"},
	{"completedAt a boolean", `"completedAt":true`, "workloadInfo.completedAt must be an integer (epoch milliseconds) or null"},
	{"error a number", `"error":12`, "workloadInfo.error must be a string or null"},
	{"requesterId an object", `"requesterId":{"a":1}`, "workloadInfo.requesterId must be a string or null"},
	{"runId a number", `"runId":5`, "workloadInfo.runId must be a string or null"},
	{"scheduledOn an array", `"scheduledOn":[]`, "workloadInfo.scheduledOn must be a string or null"},
	{"seq negative", `"seq":-1`, "workloadInfo.seq must be an integer from 0 to 9223372036854775807"},
	{"seq a fraction", `"seq":1.5`, "workloadInfo.seq must be an integer from 0 to 9223372036854775807"},
	{"seq a string", `"seq":"3"`, "workloadInfo.seq must be an integer from 0 to 9223372036854775807"},
	{"id a lone high surrogate", `"id":"job-\ud800"`, "workloadInfo.id must be valid UTF-8 with no lone surrogates"},
	{"id a lone low surrogate", `"id":"job-\udc00"`, "workloadInfo.id must be valid UTF-8 with no lone surrogates"},
	{"id a raw invalid byte", "\"id\":\"job-\xff\"", "frame is not valid UTF-8"},
	{"an unknown member with a raw invalid byte", "\"note\":\"\xff\"", "frame is not valid UTF-8"},
}

// resyncHeld returns the workload object the state table holds for the one
// run of (origin, id), or nil when it holds none.
func resyncHeld(t testing.TB, n *testNode, origin, id string) map[string]any {
	t.Helper()
	lines, _ := n.m.table.Latest(wireframe.WorkloadRef{Origin: origin, ID: id})
	if len(lines) > 1 {
		t.Fatalf("the state table holds %d runs of %s, want at most one", len(lines), id)
	}
	if len(lines) == 0 {
		return nil
	}
	params := lines[0].Params()
	var p struct {
		WorkloadInfo map[string]any `json:"workloadInfo"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		t.Fatalf("state table params %s: %v", params, err)
	}
	return p.WorkloadInfo
}

// passLines runs one whole heartbeat pass over m's table, as a peer
// sender does, and returns the re-assertion lines in pass order.
func passLines(m *Manager) [][]byte {
	var p statetable.Pass
	defer m.table.ClosePass(&p)
	m.table.BeginPass(&p)
	var out [][]byte
	for {
		lines, done := m.table.TakePass(&p, 64, wireframe.MaxBytes)
		out = append(out, lines...)
		if done {
			return out
		}
	}
}

// scrapeAddr reads the metrics endpoint at addr (host:port) into series ->
// value, checking that it answers 200 in the Prometheus text format.
func scrapeAddr(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("scrape: status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return parseMetricsText(t, resp.Body)
}

// parseMetricsText reads a Prometheus text exposition into series -> value.
func parseMetricsText(t testing.TB, r io.Reader) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// ids is count workload ids with a prefix, in order.
func ids(prefix string, count int) []string {
	out := make([]string, count)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

// commitDirect commits a lifecycle event to n's table as if it came from
// src, without the broker write: for tests that fill a table fast.
func commitDirect(t testing.TB, n *testNode, ev *wireframe.Lifecycle, src statetable.Source) {
	t.Helper()
	if o, _ := n.m.table.Commit(&statetable.Frame{Source: src, Life: ev}); o != statetable.Applied {
		t.Fatalf("commit of %s: %s", ev.Info.ID, o)
	}
}

// newLocalIngress turns m's ingress on at addr and returns its server, not
// yet bound.
func newLocalIngress(m *Manager, addr string) (*ingress.Server, error) {
	if err := m.EnableLocalIngress(addr); err != nil {
		return nil, err
	}
	return m.ingress, nil
}

// curlFrame is the seed document's producer example, as a producer sends it:
// no originatedFrom, a field of the producer's own in workloadInfo.
const curlFrame = `{
  "jsonrpc": "2.0", "method": "workload:started",
  "params": {"workloadInfo": {"id": "job-42", "runId": "job-42", "seq": 1, "model": "qwen3.5-9b", "engine": "llamacpp",
             "state": "running", "createdAt": 1789661457000, "startedAt": 1789661457000,
             "completedAt": null, "error": null, "requesterId": "my-scheduler", "harnessSlot": 3}}}`

// getNodeInfo asks the ingress at addr for GET /v1/node with the given
// headers (name/value pairs) and returns the status, the headers and the
// body.
func getNodeInfo(t testing.TB, addr, query string, headers ...string) (int, http.Header, []byte) {
	t.Helper()
	u := "http://" + addr + ingress.NodeInfoPath
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequest(http.MethodGet, u, nil)
	netMust(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := liClient.Do(req)
	netMust(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	netMust(t, err)
	return resp.StatusCode, resp.Header, body
}
