package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/stockwlm"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/wireframe"
)

// The stock upstream workload manager as a peer (issue 22). Its published
// source is kept beside this repository (../shared/upstream, or
// $NVPAIR_UPSTREAM_DIR) as a test peer only; the test builds it once per
// test binary and runs a mixed cluster: our daemon A, the stock daemon S
// pinned to it, and our daemon B as A's other peer, each with its broker
// played by the test. Every request between A and S goes through a
// recording TLS-terminating proxy (a wireTap), so what is checked on the
// wire is counted on the wire.

var (
	stockFindOnce  sync.Once
	stockSrc       string
	stockFindErr   error
	stockBuildOnce sync.Once
	stockPath      string
	stockErr       error
)

// stockBinary builds the stock daemon once per test binary, into the
// directory the daemon under test is built in (removed by TestMain). It
// skips the test, with one line saying where it looked, when the upstream
// source is not there, before anything is built.
func stockBinary(t *testing.T) string {
	t.Helper()
	stockFindOnce.Do(func() { stockSrc, stockFindErr = stockwlm.Find(".") })
	if errors.Is(stockFindErr, stockwlm.ErrNotFound) {
		t.Skip(stockFindErr.Error())
	}
	if stockFindErr != nil {
		t.Fatal(stockFindErr)
	}
	dir := filepath.Dir(daemonBinary(t))
	stockBuildOnce.Do(func() { stockPath, stockErr = stockwlm.Build(goToolPath(), stockSrc, dir) })
	if stockErr != nil {
		t.Fatal(stockErr)
	}
	return stockPath
}

// stockPortAttempts bounds how many ports startStock tries.
const stockPortAttempts = 20

// startStock starts the stock daemon for node and returns it with the
// port it holds.
//
// The stock daemon cannot be given port 0 and say what it bound, so the
// test chooses the port. Choosing one that is free now (open and close a
// listener) and hoping it stays free races every other process on the
// machine. Instead a taken port is detected and another one tried: the
// stock daemon binds its port after announcing itself, logs "inter-node
// server listening" once it holds it, and exits naming the port
// ("listen on :<port>") when the bind fails; the test waits for one or the
// other, so a port is used only once the daemon holds it. Candidates are
// drawn at random below 32768: under the ephemeral ranges (Linux
// 32768-60999, macOS and Windows 49152-65535) from which the kernel gives
// out the ports of every port-0 listener and outgoing connection, the
// other daemons of the test run among them, so a collision is rare and
// costs one more start.
func startStock(t *testing.T, node devpki.Node) (*daemonProc, int) {
	t.Helper()
	bin := stockBinary(t)
	for range stockPortAttempts {
		port := 20000 + rand.IntN(12768)
		s := startDaemonBinary(t, bin, nil, "--cluster-dir", node.ClusterDir, "--port", itoa(port), "--log-level", "debug")
		bound := false
		testkit.Eventually(t, "the stock daemon to bind its port or exit", func() bool {
			bound = s.stderr.Contains("inter-node server listening")
			return bound || s.exitedYet()
		})
		if bound {
			return s, port
		}
		if !s.stderr.Contains("listen on :" + itoa(port)) {
			t.Fatalf("the stock daemon exited, not for its port:\n%s", s.stderr.String())
		}
		t.Logf("port %d taken, trying another: %s", port, lastLine(s.stderr.String()))
	}
	t.Fatalf("the stock daemon found no free port in %d attempts", stockPortAttempts)
	return nil, 0
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// ---- the wire tap ----------------------------------------------------------

// tapMode is what a wireTap does with the requests it takes.
type tapMode int

const (
	tapForward tapMode = iota // pass each request on and its answer back
	tapFail                   // answer 500 at once, passing nothing on: a peer whose broker writes fail
	tapHang                   // hold each request, unanswered, until the mode changes
)

// tapFrame is what a request's body says: one JSON-RPC notification, as
// a peer reads it.
type tapFrame struct {
	single  bool // the body is exactly one JSON object with jsonrpc 2.0 and no id
	method  string
	id      string // the workload's id, or the removal's workloadId
	state   string
	seq     string // as its JSON text
	resync  bool
	removal bool
}

// key names one event: the workload, its state and its seq.
func (f tapFrame) key() string { return f.id + "/" + f.state + "/" + f.seq }

// tapRequest is one request a wireTap took, as it arrived, and what became
// of it.
type tapRequest struct {
	method, path, proto, contentType string
	body                             []byte
	frame                            tapFrame
	held                             bool // taken while the tap was hanging
	abandoned                        bool // its sender gave up before it was answered
	forwarded                        bool // passed on to the peer behind the tap
	upstream                         int  // the status the peer behind the tap answered
	answered                         int  // the status the sender was given
}

// wireTap is a recording TLS-terminating proxy in front of a peer. It
// presents the peer's certificate to the sender (which pins it), passes
// each request on presenting the sender's certificate (which the peer
// pins), and records every request on the way: the count of what a
// sender sent to the peer is taken from the wire, not from either
// daemon's logs.
type wireTap struct {
	t        *testing.T
	addr     string
	upstream string
	client   *http.Client

	mu      sync.Mutex // guards reqs, mode, release, check, reported and failNext
	reqs    []*tapRequest
	mode    tapMode
	release chan struct{} // closed when a hang ends
	// check, when set, says what is wrong with a request as it arrives
	// ("" for nothing); the first such request fails the test at once,
	// rather than leaving it to time out on what the peer never got.
	check    func(tapRequest) string
	reported bool
	// failNext holds workload ids whose next fresh frame is passed on and
	// then answered 500, as if the answer were lost: the sender retries,
	// and the peer behind the tap gets the frame twice.
	failNext map[string]bool
}

// newWireTap serves in front of upstream, presenting front's certificate
// and offering protos by ALPN, and passes requests on presenting sender's.
func newWireTap(t *testing.T, front, sender devpki.Identity, upstream string, protos []string) *wireTap {
	t.Helper()
	frontCert, err := front.TLSCertificate()
	testkit.Must(t, err)
	senderCert, err := sender.TLSCertificate()
	testkit.Must(t, err)
	upstreamDER := front.DER
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{
			Certificates:       []tls.Certificate{senderCert},
			InsecureSkipVerify: true, // replaced by the pin comparison below
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, upstreamDER) {
					return errors.New("the peer behind the tap is not the expected one")
				}
				return nil
			},
		},
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1 to the peer
		MaxIdleConnsPerHost: 4,
	}
	p := &wireTap{t: t, upstream: upstream, client: &http.Client{Transport: tr}, failNext: map[string]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	testkit.Must(t, err)
	srv := &http.Server{
		Handler:   http.HandlerFunc(p.serve),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{frontCert}, ClientAuth: tls.RequestClientCert, NextProtos: protos},
		ErrorLog:  testkit.DiscardLog(),
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() {
		p.setMode(tapForward) // no request stays held
		srv.Close()
		tr.CloseIdleConnections()
	})
	p.addr = ln.Addr().String()
	return p
}

// setMode changes what the tap does with the requests it takes next;
// leaving tapHang lets the held requests go on.
func (p *wireTap) setMode(m tapMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == tapHang && m != tapHang {
		close(p.release)
	}
	if m == tapHang && p.mode != tapHang {
		p.release = make(chan struct{})
	}
	p.mode = m
}

// loseAnswerOnce makes the tap pass the next fresh frame of id on and
// answer it 500.
func (p *wireTap) loseAnswerOnce(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failNext[id] = true
}

func (p *wireTap) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 2<<20))
	rec := &tapRequest{method: r.Method, path: r.URL.Path, proto: r.Proto, contentType: r.Header.Get("Content-Type"),
		body: body, frame: parseTapFrame(body)}
	p.mu.Lock()
	p.reqs = append(p.reqs, rec)
	mode, release := p.mode, p.release
	rec.held = mode == tapHang
	var bad string
	if p.check != nil && !p.reported {
		if bad = p.check(*rec); bad != "" {
			p.reported = true
		}
	}
	p.mu.Unlock()
	if bad != "" {
		p.t.Errorf("on the wire: %s", bad)
	}

	switch mode {
	case tapFail:
		p.settle(func() { rec.answered = http.StatusInternalServerError })
		http.Error(w, "broker unavailable", http.StatusInternalServerError)
		return
	case tapHang:
		select {
		case <-release:
		case <-r.Context().Done():
			p.settle(func() { rec.abandoned = true })
			return
		}
	}
	// Passed on with a context of its own: a sender that gives up while
	// the peer answers must not leave the record unsure of what the peer
	// did with the frame.
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+p.upstream+r.URL.Path, bytes.NewReader(body))
	testkit.Must(p.t, err)
	if ct := r.Header.Get("Content-Type"); ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		p.settle(func() { rec.answered = http.StatusBadGateway })
		http.Error(w, "tap: "+err.Error(), http.StatusBadGateway)
		return
	}
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	p.mu.Lock()
	lose := resp.StatusCode == http.StatusOK && !rec.frame.resync && p.failNext[rec.frame.id]
	if lose {
		delete(p.failNext, rec.frame.id)
	}
	p.mu.Unlock()
	status := resp.StatusCode
	if lose {
		status = http.StatusInternalServerError
	}
	p.settle(func() { rec.forwarded, rec.upstream, rec.answered = true, resp.StatusCode, status })
	if lose {
		http.Error(w, "answer lost", status)
		return
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(status)
	w.Write(answer)
}

// settle records what became of a request, under the lock.
func (p *wireTap) settle(fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn()
}

// requests returns a copy of every request taken so far.
func (p *wireTap) requests() []tapRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]tapRequest, len(p.reqs))
	for i, r := range p.reqs {
		out[i] = *r
	}
	return out
}

// count counts the requests for which keep holds.
func (p *wireTap) count(keep func(tapRequest) bool) int {
	n := 0
	for _, r := range p.requests() {
		if keep(r) {
			n++
		}
	}
	return n
}

// parseTapFrame reads a body the way a single-frame peer does: one JSON
// value. A batch (several lines) or anything else is not single.
func parseTapFrame(body []byte) tapFrame {
	var f struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  string          `json:"method"`
		Params  struct {
			Resync       bool `json:"resync"`
			WorkloadInfo struct {
				ID    string          `json:"id"`
				State string          `json:"state"`
				Seq   json.RawMessage `json:"seq"`
			} `json:"workloadInfo"`
			WorkloadID string `json:"workloadId"`
		} `json:"params"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&f); err != nil {
		return tapFrame{}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return tapFrame{} // a second value: a batch
	}
	out := tapFrame{single: f.JSONRPC == "2.0" && f.ID == nil && bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")),
		method: f.Method, resync: f.Params.Resync}
	if f.Method == wireframe.MethodRemove {
		out.removal, out.id = true, f.Params.WorkloadID
		return out
	}
	out.id, out.state, out.seq = f.Params.WorkloadInfo.ID, f.Params.WorkloadInfo.State, string(f.Params.WorkloadInfo.Seq)
	return out
}

// ---- what a broker was given -----------------------------------------------

// brokerEvents counts what a daemon wrote to its broker, by event key
// (id/state/seq) for upserts and by id for removals.
func brokerEvents(t *testing.T, d *daemonProc) (upserts, removals map[string]int) {
	upserts, removals = map[string]int{}, map[string]int{}
	for _, f := range d.All() {
		switch f.Method {
		case wireframe.MethodUpsert:
			var p struct {
				WorkloadInfo struct {
					ID    string          `json:"id"`
					State string          `json:"state"`
					Seq   json.RawMessage `json:"seq"`
				} `json:"workloadInfo"`
			}
			if err := json.Unmarshal(f.Params, &p); err != nil {
				t.Fatalf("upsert params: %v", err)
			}
			upserts[p.WorkloadInfo.ID+"/"+p.WorkloadInfo.State+"/"+string(p.WorkloadInfo.Seq)]++
		case wireframe.MethodRemove:
			var p struct {
				WorkloadID string `json:"workloadId"`
			}
			if err := json.Unmarshal(f.Params, &p); err != nil {
				t.Fatalf("remove params: %v", err)
			}
			removals[p.WorkloadID]++
		}
	}
	return upserts, removals
}

// deliveredOnce reports, for every event a tap passed on from origin's
// sender, whether the broker behind the tap got it exactly once plus once
// per re-assertion of it the peer accepted: a fresh frame is written once
// however often it arrived (a retry, a repeat), a re-assertion each time,
// and a removal once. It returns the first event that is off, or "".
func deliveredOnce(t *testing.T, tap *wireTap, receiver *daemonProc, prefix string) string {
	fresh, resync, removed := map[string]int{}, map[string]int{}, map[string]int{}
	for _, r := range tap.requests() {
		if !r.forwarded || r.upstream != http.StatusOK || !strings.HasPrefix(r.frame.id, prefix) {
			continue
		}
		switch {
		case r.frame.removal:
			removed[r.frame.id]++
		case r.frame.resync:
			resync[r.frame.key()]++
		default:
			fresh[r.frame.key()]++
		}
	}
	upserts, removals := brokerEvents(t, receiver)
	keys := map[string]bool{}
	for k := range fresh {
		keys[k] = true
	}
	for k := range resync {
		keys[k] = true
	}
	for k := range upserts {
		if strings.HasPrefix(k, prefix) {
			keys[k] = true
		}
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		want := min(fresh[k], 1) + resync[k]
		if upserts[k] != want {
			return fmt.Sprintf("%s: the broker got %d upsert(s); the wire shows %d fresh and %d re-assertion(s) accepted, so want %d",
				k, upserts[k], fresh[k], resync[k], want)
		}
	}
	for id, n := range removed {
		if removals[id] != 1 {
			return fmt.Sprintf("removal of %s: the broker got %d, want 1 (%d on the wire)", id, removals[id], n)
		}
	}
	for id, n := range removals {
		if strings.HasPrefix(id, prefix) && removed[id] == 0 {
			return fmt.Sprintf("removal of %s: the broker got %d, none accepted on the wire", id, n)
		}
	}
	return ""
}

// ---- the test --------------------------------------------------------------

// stockHeartbeatWait bounds the wait for the stock daemon's first
// heartbeat: it re-asserts every 30 s (a fixed interval) from its start,
// and the wait begins some seconds after that.
const stockHeartbeatWait = 45 * time.Second

func TestProcessMixedClusterWithTheStockWorkloadManager(t *testing.T) {
	stockBinary(t) // skips before anything starts when the source is absent
	// Most of its wall time is waiting for the stock daemon's 30 s
	// heartbeat: it runs beside the other parallel tests.
	t.Parallel()
	began := time.Now()
	nodes := writeCluster(t, 3)
	na, nb, ns := nodes[0], nodes[1], nodes[2]

	// S first: its heartbeat clock starts with it.
	s, sPort := startStock(t, ns)
	a := startNode(t, na, "--resync-interval", "1s")
	b := startNode(t, nb)
	a.WaitMethod("discovery:subscribe", 1)
	b.WaitMethod("discovery:subscribe", 1)
	s.WaitMethod("discovery:subscribe", 1)
	// A reaches S through tapS, which offers what the stock server offers
	// (h2 and http/1.1); S reaches A through tapA, which offers what ours
	// does.
	tapS := newWireTap(t, ns.Identity, na.Identity, "127.0.0.1:"+itoa(sPort), []string{"h2", "http/1.1"})
	tapA := newWireTap(t, na.Identity, ns.Identity, "127.0.0.1:"+itoa(a.port), []string{"http/1.1"})
	tapS.mu.Lock()
	tapS.check = singleFrameViolation
	tapS.mu.Unlock()

	// Each broker's first workload is sent before its daemon knows a peer:
	// it can reach the other side only as the backfill of a new target.
	a.send(testframe.LifecycleLine("a-backfill", "running", na.ID))
	s.send(testframe.LifecycleLine("s-backfill", "running", ns.ID))
	discover := func(d *daemonProc, entries ...map[string]any) {
		p, err := json.Marshal(map[string]any{"nodes": entries})
		testkit.Must(t, err)
		d.send(string(wireframe.EncodeNotification("discovery:nodes", p)))
	}
	discover(a, testkit.AddrEntry(ns.ID, ns.ID, tapS.addr), testkit.AddrEntry(nb.ID, nb.ID, "127.0.0.1:"+itoa(b.port)))
	discover(b, testkit.AddrEntry(na.ID, na.ID, "127.0.0.1:"+itoa(a.port)))
	discover(s, testkit.AddrEntry(na.ID, na.ID, tapA.addr))
	a.waitLog("broadcast targets changed", "total=2")

	accepted := func(tap *wireTap, id string, resync bool) func() bool {
		return func() bool {
			return tap.count(func(r tapRequest) bool {
				return r.frame.id == id && r.frame.resync == resync && r.forwarded && r.upstream == http.StatusOK
			}) > 0
		}
	}
	// Backfill both ways: the workload arrives as a re-assertion, accepted,
	// and reaches the other broker. The stock daemon applies discovery on
	// a 5 s tick.
	testkit.Eventually(t, "A's backfill accepted by the stock daemon", accepted(tapS, "a-backfill", true))
	s.WaitUpserts("a-backfill", 1)
	testkit.Eventually(t, "the stock daemon's backfill accepted by A", accepted(tapA, "s-backfill", true))
	a.WaitUpserts("s-backfill", 1)
	t.Logf("backfills crossed both ways %v after the start", time.Since(began).Round(time.Millisecond))

	// Lifecycle frames and removals both ways.
	for _, st := range []string{"queued", "running", "completed"} {
		a.send(testframe.LifecycleLine("a-life", st, na.ID))
		s.send(testframe.LifecycleLine("s-life", st, ns.ID))
	}
	a.send(string(testframe.Removal("a-life", na.ID)))
	s.send(string(testframe.Removal("s-life", ns.ID)))
	// A removal without originatedFrom, as older senders write it
	// (upstream's removeParams: the origin is optional), both ways: each
	// side relays it as it came and writes {"workloadId": ...} to its
	// broker (spec 3.3, "Removals without an origin").
	a.send(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"a-noorigin"}}`)
	s.send(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"s-noorigin"}}`)

	// Duplicates both ways: a delivery whose answer is lost is retried by
	// the sender, and a broker's repeated frame is relayed twice; either
	// way the receiver writes it to its broker once.
	tapS.loseAnswerOnce("a-dup-retried")
	tapA.loseAnswerOnce("s-dup-retried")
	a.send(testframe.LifecycleLine("a-dup-retried", "running", na.ID))
	s.send(testframe.LifecycleLine("s-dup-retried", "running", ns.ID))
	for range 2 {
		s.send(testframe.LifecycleLine("s-dup-repeated", "running", ns.ID))
	}
	// This daemon sends a peer each entry's latest state: a repeat committed
	// before the first was taken is folded into it. Once the first is on
	// the wire, the repeat is a change of its own and goes again.
	a.send(testframe.LifecycleLine("a-dup-repeated", "running", na.ID))
	testkit.Eventually(t, "a-dup-repeated on the wire once", func() bool {
		return tapS.count(func(r tapRequest) bool { return r.frame.id == "a-dup-repeated" && !r.frame.resync && r.forwarded }) == 1
	})
	a.send(testframe.LifecycleLine("a-dup-repeated", "running", na.ID))

	// The shapes the stock daemon relays as its broker wrote them.
	shapes := map[string]string{
		"s-shape-nulls":   `"state":"running","runId":null,"scheduledOn":null`,
		"s-shape-members": `"state":"running","runId":"r1","scheduledOn":"` + ns.ID + `","gpuSlots":[0,1],"vendor":{"queue":"batch","weight":0.5}`,
		"s-shape-state":   `"state":"preempted","runId":"r1","scheduledOn":null`,
		// 12 KiB: three times the ingress's bound on a producer's error
		// text, within the default --workload-max-bytes.
		"s-shape-error": `"state":"failed","runId":"r1","scheduledOn":null,"error":"` + strings.Repeat("stack frame\\n", 1024) + `"`,
		// null createdAt and seq: int64 fields in the stock daemon's
		// decode, which a null leaves at 0, so it relays them (spec 3.2).
		"s-shape-null-numbers": `"state":"running","runId":"r1","scheduledOn":null`,
	}
	shapeInfo := func(id string) string {
		numbers := `,"seq":1,"createdAt":1789661457000`
		if id == "s-shape-null-numbers" {
			numbers = `,"seq":null,"createdAt":null`
		}
		return `{"id":"` + id + `","model":"qwen3.5-9b","engine":"llamacpp","originatedFrom":"` + ns.ID + `",` + shapes[id] +
			numbers + `,"startedAt":null,"completedAt":null,"requesterId":null}`
	}
	for _, id := range sortedKeys(shapes) {
		method := wireframe.MethodStarted
		if strings.Contains(shapes[id], `"failed"`) || strings.Contains(shapes[id], `"preempted"`) {
			method = wireframe.MethodErrored
		}
		s.send(`{"jsonrpc":"2.0","method":"` + method + `","params":{"workloadInfo":` + shapeInfo(id) + `}}`)
	}

	// Heartbeats: a workload tracked after the backfills can only be
	// re-asserted by a heartbeat pass.
	a.send(testframe.LifecycleLine("a-hb", "running", na.ID))
	s.send(testframe.LifecycleLine("s-hb", "running", ns.ID))

	// Everything so far has crossed.
	s.WaitMethod(wireframe.MethodRemove, 2)
	a.WaitMethod(wireframe.MethodRemove, 2)
	for _, d := range []struct {
		broker *daemonProc
		id     string
	}{{s, "a-noorigin"}, {a, "s-noorigin"}} {
		want := `{"workloadId":"` + d.id + `"}`
		found := false
		for _, f := range d.broker.WithMethod(wireframe.MethodRemove) {
			found = found || string(f.Params) == want
		}
		if !found {
			t.Fatalf("the removal without an origin reached the broker as %v, want params %s", d.broker.WithMethod(wireframe.MethodRemove), want)
		}
	}
	for _, id := range []string{"a-dup-retried", "a-dup-repeated"} {
		s.WaitUpserts(id, 1)
	}
	for _, id := range append([]string{"s-dup-retried", "s-dup-repeated"}, sortedKeys(shapes)...) {
		a.WaitUpserts(id, 1)
	}
	testkit.Eventually(t, "A's heartbeat accepted by the stock daemon", accepted(tapS, "a-hb", true))
	s.WaitUpserts("a-hb", 2)

	// The shapes reached A's broker as the stock daemon's broker wrote them.
	for _, id := range sortedKeys(shapes) {
		if n := tapA.count(func(r tapRequest) bool { return r.frame.id == id && !r.frame.resync && r.answered == http.StatusOK }); n != 1 {
			t.Fatalf("%s: A answered %d fresh delivery of it 200, want 1", id, n)
		}
		var got json.RawMessage
		for _, f := range a.WithMethod(wireframe.MethodUpsert) {
			var p struct {
				WorkloadInfo json.RawMessage `json:"workloadInfo"`
			}
			testkit.Must(t, json.Unmarshal(f.Params, &p))
			if bytes.Contains(p.WorkloadInfo, []byte(`"id":"`+id+`"`)) {
				got = p.WorkloadInfo
			}
		}
		if !sameJSON(t, got, json.RawMessage(shapeInfo(id))) {
			t.Fatalf("%s reached A's broker as\n %.300s\nwant it as the stock daemon's broker wrote it:\n %.300s", id, got, shapeInfo(id))
		}
	}
	// Each duplicate was on the wire twice, and deduplicated.
	for _, c := range []struct {
		tap *wireTap
		id  string
	}{{tapS, "a-dup-retried"}, {tapS, "a-dup-repeated"}, {tapA, "s-dup-retried"}, {tapA, "s-dup-repeated"}} {
		testkit.Eventually(t, c.id+" on the wire twice", func() bool {
			return c.tap.count(func(r tapRequest) bool { return r.frame.id == c.id && !r.frame.resync && r.forwarded }) == 2
		})
	}

	// A stock peer that fails, then one that hangs, costs A's other peer
	// nothing: B takes every frame of a burst while the stock peer's tap
	// answers 500 to everything, and every frame of the next while the tap
	// holds A's requests unanswered (A's attempt timeout is 5 s, three
	// attempts a frame: a sender that made B wait behind the stock peer
	// would not deliver 20 frames to B within the wait). The hang is what
	// shows the lanes are independent; the failures, that nothing is lost
	// for B and the stock peer recovers.
	tapS.setMode(tapFail)
	const burst = 10
	for i := range burst {
		a.send(testframe.LifecycleLine(fmt.Sprintf("a-5xx-%d", i), "running", na.ID))
	}
	for i := range burst {
		b.WaitUpserts(fmt.Sprintf("a-5xx-%d", i), 1)
	}
	testkit.Eventually(t, "A's sender to meet the failing stock peer", func() bool {
		return tapS.count(func(r tapRequest) bool {
			return strings.HasPrefix(r.frame.id, "a-5xx-") && r.answered == http.StatusInternalServerError
		}) > 0
	})
	tapS.setMode(tapHang)
	heldBefore := tapS.count(func(r tapRequest) bool { return r.held })
	for i := range 2 * burst {
		a.send(testframe.LifecycleLine(fmt.Sprintf("a-hang-%d", i), "running", na.ID))
	}
	for i := range 2 * burst {
		b.WaitUpserts(fmt.Sprintf("a-hang-%d", i), 1)
	}
	testkit.Eventually(t, "A's sender to meet the hanging stock peer", func() bool {
		return tapS.count(func(r tapRequest) bool { return r.held }) > heldBefore
	})
	if n := tapS.count(func(r tapRequest) bool { return r.held && r.forwarded }); n != 0 {
		t.Fatalf("%d held request(s) went through while the tap hung", n)
	}
	// The backlog behind the hang goes to the stock peer once it answers,
	// one frame per request like everything else, and the heartbeat
	// brings it the workloads its failures cost it.
	tapS.setMode(tapForward)
	for i := range 2 * burst {
		s.WaitUpserts(fmt.Sprintf("a-hang-%d", i), 1)
	}
	for i := range burst {
		s.WaitUpserts(fmt.Sprintf("a-5xx-%d", i), 1)
	}

	// The stock daemon's heartbeat, 30 s after its start.
	if !testkit.HoldsWithin(stockHeartbeatWait, accepted(tapA, "s-hb", true)) {
		t.Fatalf("no heartbeat from the stock daemon reached A within %v", stockHeartbeatWait)
	}
	a.WaitUpserts("s-hb", 2)

	// Each delivered once, on both sides, as the wire accounts for it.
	var off string
	if !testkit.HoldsWithin(testkit.WaitTimeout, func() bool { off = deliveredOnce(t, tapS, s, "a-"); return off == "" }) {
		t.Fatalf("A to the stock daemon: %s", off)
	}
	if !testkit.HoldsWithin(testkit.WaitTimeout, func() bool { off = deliveredOnce(t, tapA, a, "s-"); return off == "" }) {
		t.Fatalf("the stock daemon to A: %s", off)
	}

	// Not one batch, and nothing but single application/json
	// notifications, ever sent to the stock daemon, which refused none.
	reqs := tapS.requests()
	kinds := map[string]int{}
	for _, r := range reqs {
		if bad := singleFrameViolation(r); bad != "" {
			t.Fatal(bad)
		}
		if r.forwarded && r.upstream != http.StatusOK {
			t.Fatalf("the stock daemon answered %d to %.300s", r.upstream, r.body)
		}
		switch {
		case r.frame.removal:
			kinds["removal"]++
		case r.frame.resync:
			kinds["re-assertion"]++
		default:
			kinds["fresh"]++
		}
	}
	t.Logf("A sent the stock daemon %d requests, each one application/json notification over HTTP/1.1 (%v); S sent A %d; %v in all",
		len(reqs), kinds, len(tapA.requests()), time.Since(began).Round(time.Millisecond))
}

// singleFrameViolation says how a request sent to the stock daemon is not
// what it has always understood (a POST of one JSON-RPC notification,
// Content-Type application/json, over HTTP/1.1), or "".
func singleFrameViolation(r tapRequest) string {
	switch {
	case r.method != http.MethodPost || r.path != wireframe.EventsPath:
		return fmt.Sprintf("A sent the stock daemon %s %s", r.method, r.path)
	case r.contentType != "application/json":
		return fmt.Sprintf("A sent the stock daemon a request with Content-Type %q (a batch is %s): %.200q", r.contentType, peerwire.BatchContentType, r.body)
	case !r.frame.single:
		return fmt.Sprintf("A sent the stock daemon a body that is not one JSON-RPC notification: %.300q", r.body)
	case r.proto != "HTTP/1.1":
		return fmt.Sprintf("A spoke %s to the stock daemon, want HTTP/1.1", r.proto)
	}
	return ""
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
