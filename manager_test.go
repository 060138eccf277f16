package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// upsertsOf counts the upserts of workload id at a node's broker.
func upsertsOf(n *testNode, id string) int {
	c := 0
	for _, w := range n.Upserts() {
		if w["id"] == id {
			c++
		}
	}
	return c
}

func TestTwoManagersRelayOverMTLS(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	mesh(t, a, b)

	w := testframe.Workload("job-1", "running", a.id, map[string]any{"customField": map[string]any{"nested": []any{1.5, "x"}}})
	a.sendLifecycle(w)
	got := b.broker.WaitMethod(wireframe.MethodUpsert, 1)
	var p struct {
		WorkloadInfo json.RawMessage `json:"workloadInfo"`
	}
	if err := json.Unmarshal(got[0].Params, &p); err != nil {
		t.Fatal(err)
	}
	sent, _ := json.Marshal(w)
	if !bytes.Equal(p.WorkloadInfo, sent) {
		t.Fatalf("B's upsert carries %s, want the object A's broker sent, byte for byte: %s", p.WorkloadInfo, sent)
	}

	a.sendRemove("job-1")
	rm := b.broker.WaitMethod(wireframe.MethodRemove, 1)
	var r struct{ WorkloadID, OriginatedFrom string }
	if err := json.Unmarshal(rm[0].Params, &r); err != nil {
		t.Fatal(err)
	}
	if r.WorkloadID != "job-1" || r.OriginatedFrom != a.id {
		t.Fatalf("B's removal = %+v, want job-1 from A", r)
	}
	if len(a.broker.WithMethod(wireframe.MethodUpsert)) != 0 {
		t.Fatal("A's own frames were sent back up to A's broker")
	}
}

func TestDuplicateFromPeerReachesBrokerOnce(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	mesh(t, a, b)

	w := testframe.Workload("job-dup", "running", a.id)
	a.sendLifecycle(w)
	a.sendLifecycle(w)
	// Barrier: a later frame on the same ordered path has arrived, so the
	// duplicate has been delivered and judged before it.
	a.sendLifecycle(testframe.Workload("job-after", "running", a.id))
	testkit.Eventually(t, "job-after at B", func() bool { return upsertsOf(b, "job-after") == 1 })
	if n := upsertsOf(b, "job-dup"); n != 1 {
		t.Fatalf("B's broker saw job-dup %d times, want 1", n)
	}
}

func TestResyncReassertionBypassesPeerDedup(t *testing.T) {
	a, b := newTestNode(t, withResyncInterval(100*time.Millisecond)), newTestNode(t)
	mesh(t, a, b)

	a.sendLifecycle(testframe.Workload("job-live", "running", a.id))
	testkit.Eventually(t, "job-live re-asserted to B's broker", func() bool { return upsertsOf(b, "job-live") >= 3 })
}

func TestUnpinnedClientIsRefused(t *testing.T) {
	b := newTestNode(t).start()
	stranger, err := devpki.Mint(devpki.NewUUID())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := stranger.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}}
	body := `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":` + mustJSON(t, testframe.Workload("x", "running", stranger.Principal)) + `}}`
	resp, err := client.Post("https://"+b.m.PeerAddr().String()+wireframe.EventsPath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("status %d, want 403", resp.StatusCode)
	}
	if len(b.broker.WithMethod(wireframe.MethodUpsert)) != 0 {
		t.Fatal("an unpinned client's frame reached the broker")
	}
}

func TestReadyThenSubscribeComeFirst(t *testing.T) {
	n := newTestNode(t).start()
	n.broker.WaitMethod("discovery:subscribe", 1)
	frames := n.broker.All()
	if frames[0].Method != "ready" || frames[1].Method != "discovery:subscribe" {
		t.Fatalf("first frames %q, %q; want ready, discovery:subscribe", frames[0].Method, frames[1].Method)
	}
	var ready struct{ Version, NodeID string }
	if err := json.Unmarshal(frames[0].Params, &ready); err != nil {
		t.Fatal(err)
	}
	if ready.Version != "test" || ready.NodeID != n.id {
		t.Fatalf("ready = %+v, want version test and node id %s", ready, n.id)
	}
	if got := string(frames[1].Params); got != `{"services":["wl"]}` {
		t.Fatalf("subscribe params %s", got)
	}
}

func TestBrokerRequests(t *testing.T) {
	n := newTestNode(t).start()
	cases := []struct {
		name, line, id string
		wantResult     string // compact JSON, when the answer is a result
		wantCode       int    // when the answer is an error
	}{
		{"set level", `{"jsonrpc":"2.0","id":1,"method":"log/set-level","params":{"level":"debug"}}`, "1", `{"level":"debug"}`, 0},
		{"set level any case", `{"jsonrpc":"2.0","id":2,"method":"log/set-level","params":{"level":"WARN"}}`, "2", `{"level":"warn"}`, 0},
		{"bad level", `{"jsonrpc":"2.0","id":3,"method":"log/set-level","params":{"level":"verbose"}}`, "3", "", wireframe.CodeInvalidParams},
		{"bad level params", `{"jsonrpc":"2.0","id":4,"method":"log/set-level","params":[1]}`, "4", "", wireframe.CodeInvalidParams},
		{"unknown request", `{"jsonrpc":"2.0","id":"x","method":"nope"}`, `"x"`, "", wireframe.CodeMethodNotFound},
		{"lifecycle as request", `{"jsonrpc":"2.0","id":5,"method":"workload:started","params":{"workloadInfo":` +
			mustJSON(t, testframe.Workload("r", "running", n.id)) + `}}`, "5", "null", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n.broker.send(c.line)
			resp := n.broker.WaitResponse(c.id)
			if c.wantCode != 0 {
				if resp.Error == nil || resp.Error.Code != c.wantCode {
					t.Fatalf("answer %+v, want error %d", resp, c.wantCode)
				}
				return
			}
			if resp.Error != nil || string(resp.Result) != c.wantResult {
				t.Fatalf("answer result %s error %+v, want %s", resp.Result, resp.Error, c.wantResult)
			}
		})
	}
}

func TestSetLevelChangesTheLogLevel(t *testing.T) {
	lv := new(slog.LevelVar)
	n := newTestNode(t, func(c *Config) { c.LogLevel = lv }).start()
	n.broker.send(`{"jsonrpc":"2.0","id":1,"method":"log/set-level","params":{"level":"error"}}`)
	n.broker.WaitResponse("1")
	if got := lv.Level(); got != slog.LevelError {
		t.Fatalf("level %s after set-level error", got)
	}
}

func TestBadLinesAreSkippedAndTheLoopGoesOn(t *testing.T) {
	n := newTestNode(t).start()
	n.broker.send(`{not json`)
	n.broker.send(strings.Repeat("x", 2<<20))
	n.broker.send(`{"jsonrpc":"1.0","id":7,"method":"nope"}`)
	n.broker.send(`{"jsonrpc":"2.0","id":99,"result":{}}`) // a response: ignored
	n.broker.send(`{"jsonrpc":"2.0","method":"some:notification"}`)
	n.broker.send(``)
	n.broker.send(`{"jsonrpc":"2.0","id":8,"method":"nope"}`)
	if resp := n.broker.WaitResponse("8"); resp.Error == nil || resp.Error.Code != wireframe.CodeMethodNotFound {
		t.Fatalf("answer to 8: %+v", resp)
	}
	for _, f := range n.broker.All() {
		if f.IsResponse() && string(f.ID) != "8" {
			t.Fatalf("unexpected answer %+v", f)
		}
	}
	for _, want := range []string{"not JSON", "line longer than the frame limit", `jsonrpc must be \"2.0\"`} {
		if !n.logs.Contains("local frame skipped", want) {
			t.Errorf("no log line skipping a frame for %q", want)
		}
	}
}

func TestMalformedLocalFrameIsNeverBroadcast(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	mesh(t, a, b)
	a.sendLifecycle(testframe.Workload("bad", "running", a.id, map[string]any{"model": nil}))
	// No workloadId. (One without originatedFrom is an older sender's,
	// relayed as upstream relays it: spec 3.3, "Removals without an origin".)
	a.broker.sendFrame(wireframe.MethodRemove, map[string]any{"originatedFrom": a.id})
	a.sendLifecycle(testframe.Workload("good", "running", a.id))
	testkit.Eventually(t, "good at B", func() bool { return upsertsOf(b, "good") == 1 })
	if upsertsOf(b, "bad") != 0 || len(b.broker.WithMethod(wireframe.MethodRemove)) != 0 {
		t.Fatal("a malformed local frame reached the peer")
	}
	if !a.logs.Contains("local frame dropped", "workloadInfo.model is missing") {
		t.Fatal("the dropped frame was not logged with its reason")
	}
}

func TestShutdownRequestIsAnsweredThenRunReturns(t *testing.T) {
	n := newTestNode(t).start()
	n.broker.send(`{"jsonrpc":"2.0","id":1,"method":"shutdown"}`)
	if resp := n.broker.WaitResponse("1"); resp.Error != nil || string(resp.Result) != "null" {
		t.Fatalf("shutdown answer %+v", resp)
	}
	select {
	case err := <-n.done:
		if err != nil {
			t.Fatalf("Run returned %v after shutdown", err)
		}
		n.done <- nil // for the cleanup's stop
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("Run did not return after shutdown")
	}
}

func TestBrokerClosingTheChannelEndsRun(t *testing.T) {
	n := newTestNode(t).start()
	n.broker.toD.Close()
	select {
	case err := <-n.done:
		if err != nil {
			t.Fatalf("Run returned %v on EOF", err)
		}
		n.done <- nil
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("Run did not return on EOF")
	}
}

func TestBrokerWriteFailureEndsRun(t *testing.T) {
	n := newTestNode(t).start()
	n.broker.fromD.Close()
	n.broker.send(`{"jsonrpc":"2.0","id":1,"method":"nope"}`) // its answer fails to write
	select {
	case err := <-n.done:
		if err != nil {
			t.Fatalf("Run returned %v on a broken broker pipe", err)
		}
		n.done <- nil
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("Run did not return after the broker write failed")
	}
}

func TestHeartbeat(t *testing.T) {
	const interval = 100 * time.Millisecond
	a, b := newTestNode(t, withResyncInterval(interval)), newTestNode(t)
	mesh(t, a, b)

	a.sendLifecycle(testframe.Workload("live", "running", a.id))
	a.sendLifecycle(testframe.Workload("done", "completed", a.id))
	a.sendLifecycle(testframe.Workload("gone", "running", a.id))
	testkit.Eventually(t, "gone at B", func() bool { return upsertsOf(b, "gone") >= 1 })
	a.sendRemove("gone")
	b.broker.WaitMethod(wireframe.MethodRemove, 1)
	goneAtRemoval := upsertsOf(b, "gone")

	// The first tick comes less than one interval after "done" was tracked,
	// well inside its 2-interval retention: it is re-asserted at least once.
	testkit.Eventually(t, "done re-asserted", func() bool { return upsertsOf(b, "done") >= 2 })
	// Five more ticks of the live workload put "done" past its retention...
	liveMark := upsertsOf(b, "live")
	testkit.Eventually(t, "five heartbeats of live", func() bool { return upsertsOf(b, "live") >= liveMark+5 })
	doneMark := upsertsOf(b, "done")
	// ...so three more ticks must not re-assert it again.
	liveMark = upsertsOf(b, "live")
	testkit.Eventually(t, "three more heartbeats of live", func() bool { return upsertsOf(b, "live") >= liveMark+3 })
	if got := upsertsOf(b, "done"); got != doneMark {
		t.Fatalf("a terminal workload was re-asserted after its retention: %d upserts, %d before", got, doneMark)
	}
	// The peer receives A's frames in queue order, one at a time, so once
	// the removal has arrived no re-assertion queued before it is in flight.
	if got := upsertsOf(b, "gone"); got != goneAtRemoval {
		t.Fatalf("a removed workload was re-asserted: %d upserts after removal, %d before", got, goneAtRemoval)
	}
	for _, f := range b.broker.WithMethod(wireframe.MethodUpsert) {
		if strings.Contains(string(f.Params), "resync") {
			t.Fatalf("the resync marker reached the broker: %s", f.Params)
		}
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitRun waits for a node's Run to return and fails if it returned an
// error; it leaves a value for the node's cleanup.
func waitRun(t *testing.T, n *testNode, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case err := <-n.done:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
		n.done <- nil
	case <-time.After(within):
		t.Fatalf("Run did not return within %v", within)
	}
	return time.Since(start)
}

func TestShutdownDrainsPeerQueuesBeforeExit(t *testing.T) {
	gated, gate := withGatedBroker(t)
	a, b := newTestNode(t), newTestNode(t, gated)
	mesh(t, a, b)
	// B's broker stops reading, so A's frames wait above B's mark.
	const frames = 20
	for i := range frames {
		a.sendLifecycle(testframe.Workload("drain-"+itoa(i), "running", a.id))
	}
	testkit.Eventually(t, "A to commit every frame", func() bool { return a.m.table.Version() == frames })
	a.broker.toD.Close() // the broker quits: EOF starts A's shutdown
	time.AfterFunc(300*time.Millisecond, gate.open)
	waitRun(t, a, testkit.WaitTimeout)
	if got := a.m.bcast.StatsSnapshot()[0].Succeeded.Load(); got != frames {
		t.Fatalf("A delivered %d of %d committed frames before exiting", got, frames)
	}
	testkit.Eventually(t, "every frame at B's broker", func() bool { return len(b.broker.WithMethod(wireframe.MethodUpsert)) == frames })
}

func TestShutdownDrainIsBoundedByTheDrainTimeout(t *testing.T) {
	a := newTestNode(t, func(c *Config) { c.DrainTimeout = 300 * time.Millisecond })
	gated, _ := withGatedBroker(t) // B never answers while A shuts down
	b := newTestNode(t, gated)
	mesh(t, a, b)
	a.sendLifecycle(testframe.Workload("stuck", "running", a.id))
	testkit.Eventually(t, "A to commit the frame", func() bool { return a.m.table.Version() == 1 })
	a.broker.toD.Close()
	if took := waitRun(t, a, testkit.WaitTimeout); took > 3*time.Second {
		t.Fatalf("shutdown took %v with a 300ms drain timeout", took)
	}
	if !a.logs.Contains("shutdown: peers not caught up in time") {
		t.Fatal("the peer left behind was not logged")
	}
}

func TestNewManagerDefaultsTheBrokerLineLimitAndRefusesAnUnusableOne(t *testing.T) {
	for _, tc := range []struct {
		lineMax, want int // want 0: refused
	}{
		{0, wireframe.DefaultBrokerLineMax},
		{wireframe.MinBrokerLineMax, wireframe.MinBrokerLineMax},
		{wireframe.MaxBrokerLineMax, wireframe.MaxBrokerLineMax},
		{wireframe.MinBrokerLineMax - 1, 0},
		{wireframe.MaxBrokerLineMax + 1, 0},
		{-1, 0},
	} {
		m, err := NewManager(Config{NodeID: devpki.NewUUID(), In: strings.NewReader(""), Out: &bytes.Buffer{},
			ClusterDir: t.TempDir(), BrokerLineMax: tc.lineMax})
		if tc.want == 0 {
			if err == nil || !strings.Contains(err.Error(), "broker line limit "+itoa(tc.lineMax)) {
				t.Errorf("BrokerLineMax %d: NewManager = %v, want an error naming the limit", tc.lineMax, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("BrokerLineMax %d: %v", tc.lineMax, err)
		}
		m.bcast.Close(time.Second)
		if m.cfg.BrokerLineMax != tc.want || m.out.LineMax() != tc.want {
			t.Errorf("BrokerLineMax %d: config %d, writer %d; want %d", tc.lineMax, m.cfg.BrokerLineMax, m.out.LineMax(), tc.want)
		}
	}
}
