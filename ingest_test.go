package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// Tests of ingestLocal's ordering, commitLocal and the removal memory, at the
// Manager level. Most build a node without starting it and call
// n.m.ingestLocal / n.m.handleLine directly: the broker writer works as soon
// as the test broker collects, and every enqueue happens before those calls
// return, so the peer queue can be read right after them.

// --- ordering ----------------------------------------------------------------

func TestIngestFailedBrokerWriteLeavesNothingTrackedQueuedOrRemembered(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
	}{
		{"upsert", testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", ""))},
		{"removal", string(testframe.Removal("job-1", ""))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, q := ifxNode(t)
			n.broker.fromD.Close() // the broker stops reading: every write fails

			_, err := n.m.ingestLocal([]byte(tc.body))
			if !errors.Is(err, ingress.ErrBrokerWrite) {
				t.Fatalf("ingestLocal with the broker gone = %v, want ingress.ErrBrokerWrite", err)
			}
			if got := ifxTrackedCount(n); got != 0 {
				t.Errorf("re-sync set holds %d entries after a failed broker write, want 0", got)
			}
			if got := ifxRememberedCount(n); got != 0 {
				t.Errorf("removal memory holds %d entries after a failed broker write, want 0", got)
			}
			if got := ifxDrain(q); len(got) != 0 {
				t.Errorf("peer queue holds %d frame(s) after a failed broker write, want none: %s", len(got), ifxDescribe(got))
			}
		})
	}
}

func TestIngestFailedRemovalKeepsWorkloadTrackedAndQueuesNothing(t *testing.T) {
	n, q := ifxNode(t)
	if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", "")))); err != nil {
		t.Fatal(err)
	}
	if got := ifxDrain(q); len(got) != 1 {
		t.Fatalf("peer queue after the upsert: %s, want one frame", ifxDescribe(got))
	}
	n.broker.fromD.Close()

	_, err := n.m.ingestLocal(testframe.Removal("job-1", ""))
	if !errors.Is(err, ingress.ErrBrokerWrite) {
		t.Fatalf("removal with the broker gone = %v, want ingress.ErrBrokerWrite", err)
	}
	if !ifxIsTracked(n, n.id, "job-1") {
		t.Error("a removal the broker never received untracked the workload: peers would lose a workload the broker still holds")
	}
	if ifxRemembers(n, n.id, "job-1") {
		t.Error("a removal the broker never received was remembered")
	}
	if got := ifxDrain(q); len(got) != 0 {
		t.Errorf("a failed removal queued %s for peers, want nothing", ifxDescribe(got))
	}
}

// Concurrent posts for one workload reach the broker in one order, and the
// peers are sent the latest of them: ingestMu gives each post its place in
// the broker order, the posts' commits run in that order after their
// writes (ingressorder.go), and the table keeps the highest seq whatever
// the order (statetable.supersedes). Every other post carries an 8 KiB
// member, so its commit has a larger frame to take after its broker write.
func TestIngestConcurrentPostsForOneWorkloadKeepOneOrderAtBrokerAndPeers(t *testing.T) {
	const posts = 64
	const rounds = 6 // each catches a missing ingestMu most of the time; six, all but always
	big := strings.Repeat("x", 8<<10)
	for round := 0; round < rounds; round++ {
		n, q := ifxNode(t)
		broker := ifxRawBroker(n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, posts)
		for seq := 1; seq <= posts; seq++ {
			extra := []string{fmt.Sprintf(`"seq":%d`, seq)}
			if seq%2 == 1 {
				// An unknown member: a producer's error text is bounded
				// (wireframe.MaxIngressErrorBytes), what it adds beside it is not.
				extra = append(extra, `"note":"`+big+`"`)
			}
			body := testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", "", extra...))
			wg.Go(func() {
				<-start
				if _, err := n.m.ingestLocal([]byte(body)); err != nil {
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("ingestLocal: %v", err)
		}

		var atBroker []string
		for _, f := range broker.frames(t) {
			if f.Method == wireframe.MethodUpsert {
				atBroker = append(atBroker, ifxInfoField(t, f.Params, "seq"))
			}
		}
		var queued []string
		for _, f := range ifxDrain(q) {
			queued = append(queued, ifxInfoField(t, ifxParams(t, f), "seq"))
		}
		if len(atBroker) != posts || fmt.Sprint(queued) != fmt.Sprint([]string{strconv.Itoa(posts)}) {
			t.Fatalf("round %d: %d upserts at the broker (want %d) and the peers sent seq %v (want the latest, %d)", round, len(atBroker), posts, queued, posts)
		}
	}
}

// A stalled ingress broker write holds up ingress frames only: the stdio
// read loop and a heartbeat pass, which take the table's lock
// (statetable.Table.mu), go on.
func TestIngestStalledBrokerWriteDoesNotBlockStdioFramesOrResync(t *testing.T) {
	n, q := ifxNode(t)
	gate := ifxGateBroker(n)
	done := make(chan error, 1)
	go func() {
		_, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("ingress-1", "running", ""))))
		done <- err
	}()
	<-gate.entered

	stdioDone := make(chan struct{})
	var reasserted [][]byte
	go func() {
		n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("stdio-1", "running", n.id))))
		reasserted = passLines(n.m)
		close(stdioDone)
	}()
	select {
	case <-stdioDone:
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("a stdio frame and a re-sync waited for an ingress post's stalled broker write")
	}
	got := ifxDrain(q)
	if len(got) != 1 || len(reasserted) != 1 || !bytes.Contains(reasserted[0], []byte(`"stdio-1"`)) {
		t.Fatalf("while the ingress write stalls: queued %s and a heartbeat pass of %d, want stdio-1 in each", ifxDescribe(got), len(reasserted))
	}
	for _, f := range got {
		if id, _ := ifxFrameWorkload(t, f); id != "stdio-1" {
			t.Fatalf("queued %s while its broker write stalls", id)
		}
	}
	close(gate.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// --- commitLocal ---------------------------------------------------------------

func TestCommitLocalReportsWhetherTheFrameWasQueued(t *testing.T) {
	n, q := ifxNode(t)
	life := ifxParseLocal(t, testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id)))
	if !committed(n, life, fromIngress) {
		t.Fatal("commitLocal of a new ingress frame reported not queued")
	}
	rm := ifxParseLocal(t, string(testframe.Removal("job-1", n.id)))
	if !committed(n, rm, fromIngress) {
		t.Fatal("commitLocal of an ingress removal reported not queued")
	}
	// The peers are sent the workload's latest state: its removal.
	if got := ifxDrain(q); len(got) != 1 || got[0].method != wireframe.MethodRemove {
		t.Fatalf("sent %s, want the removal", ifxDescribe(got))
	}
	if committed(n, life, fromBroker) {
		t.Error("commitLocal of a broker replay of a removed ingress workload reported queued")
	}
	if got := ifxDrain(q); len(got) != 0 {
		t.Errorf("a suppressed replay queued %s", ifxDescribe(got))
	}
}

func TestIngestRemovalUntracksEveryRunOfTheWorkload(t *testing.T) {
	n, q := ifxNode(t)
	for _, run := range []string{"run-a", "run-b"} {
		if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", "", `"runId":"`+run+`"`)))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-2", "running", "")))); err != nil {
		t.Fatal(err)
	}
	if got := ifxTrackedCount(n); got != 3 {
		t.Fatalf("re-sync set holds %d entries, want 3", got)
	}
	if _, err := n.m.ingestLocal(testframe.Removal("job-1", "")); err != nil {
		t.Fatal(err)
	}
	if ifxIsTracked(n, n.id, "job-1") || !ifxIsTracked(n, n.id, "job-2") || ifxTrackedCount(n) != 1 {
		t.Fatalf("after removing job-1: %d entries, job-1 tracked %v, job-2 tracked %v; want only job-2",
			ifxTrackedCount(n), ifxIsTracked(n, n.id, "job-1"), ifxIsTracked(n, n.id, "job-2"))
	}
	ifxDrain(q)
	if got := len(passLines(n.m)); got != 1 {
		t.Errorf("a heartbeat pass after the removal re-asserts %d frames, want job-2's only", got)
	}
}

// --- removal memory --------------------------------------------------------------

func TestIngestRemovalMemoryBlocksStaleStdioReplayOfTrackedWorkload(t *testing.T) {
	n, q := ifxNode(t)
	if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", "")))); err != nil {
		t.Fatal(err)
	}
	if _, err := n.m.ingestLocal(testframe.Removal("job-1", "")); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)

	// The broker's replay of its store, which it sent before it applied the
	// removal.
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id))))
	if ifxIsTracked(n, n.id, "job-1") {
		t.Error("a stale stdio replay tracked a workload removed through the ingress: it would be re-asserted on every heartbeat")
	}
	if got := ifxDrain(q); len(got) != 0 {
		t.Errorf("a stale stdio replay was queued for peers: %s", ifxDescribe(got))
	}
}

func TestIngestRemovalStopsDroppingReplaysOnceTheProducerReportsTheWorkloadAnew(t *testing.T) {
	n, q := ifxNode(t)
	ifxOwn(t, n, q, "job-1")
	if _, err := n.m.ingestLocal(testframe.Removal("job-1", "")); err != nil {
		t.Fatal(err)
	}
	if !ifxRemembers(n, n.id, "job-1") {
		t.Fatal("an ingress removal was not remembered")
	}
	// The producer reports the workload anew.
	if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("queued"), testframe.WorkloadJSON("job-1", "queued", "", `"seq":2`)))); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id))))
	if got := ifxDrain(q); len(got) != 1 {
		t.Errorf("the broker's frame for a re-reported workload: queued %s, want it", ifxDescribe(got))
	}
	if !ifxIsTracked(n, n.id, "job-1") {
		t.Error("the re-reported workload is not tracked")
	}
}

func TestIngestRemovalMemoryExpiresAfterRetentionWindow(t *testing.T) {
	n, q := ifxNode(t)
	clock := ifxUseClock(n)
	ifxOwn(t, n, q, "job-1")
	retention := 2 * n.m.cfg.ResyncInterval
	if retention != time.Minute {
		t.Fatalf("terminal-retention window = %v, want one minute by default", retention)
	}
	if _, err := n.m.ingestLocal(testframe.Removal("job-1", "")); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)

	clock.advance(retention - time.Millisecond)
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id))))
	if got := ifxDrain(q); len(got) != 0 || ifxIsTracked(n, n.id, "job-1") {
		t.Fatalf("just inside the window a replay was queued (%s) or tracked", ifxDescribe(got))
	}

	clock.advance(time.Millisecond)
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id))))
	if got := ifxDrain(q); len(got) != 1 {
		t.Errorf("once the window has passed the broker's frame was not queued: %s", ifxDescribe(got))
	}
	if !ifxIsTracked(n, n.id, "job-1") {
		t.Error("once the window has passed the broker's frame was not tracked")
	}
	if got := ifxRememberedCount(n); got != 0 {
		t.Errorf("removal memory holds %d expired entries, want them pruned", got)
	}
}

func TestIngestRemovalMemoryCoversOnlyItsOwnOriginAndID(t *testing.T) {
	n, q := ifxNode(t)
	ifxOwn(t, n, q, "job-1")
	other := "0b7c2f4e-7a51-4d3e-9c1f-2e8a5b6d4c3a"
	if _, err := n.m.ingestLocal(testframe.Removal("job-1", "")); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)
	for _, tc := range []struct{ id, origin string }{
		{"job-2", n.id},  // another id, this node
		{"job-1", other}, // the same id from another origin
	} {
		n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON(tc.id, "running", tc.origin))))
		if got := ifxDrain(q); len(got) != 1 {
			t.Errorf("(%s, %s) was not queued: %s", tc.origin, tc.id, ifxDescribe(got))
		}
		if !ifxIsTracked(n, tc.origin, tc.id) {
			t.Errorf("(%s, %s) was not tracked", tc.origin, tc.id)
		}
	}
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id))))
	if got := ifxDrain(q); len(got) != 0 {
		t.Errorf("the removed (origin, id) itself was queued: %s", ifxDescribe(got))
	}
}

func TestIngestABrokersRemovalDropsNoReplayOfItsOwn(t *testing.T) {
	n, q := ifxNode(t)
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id))))
	n.m.handleLine([]byte(wireframe.EncodeNotification(wireframe.MethodRemove, json.RawMessage(`{"workloadId":"job-1","originatedFrom":"`+n.id+`"}`))))
	if got := ifxDrain(q); len(got) != 1 || got[0].method != wireframe.MethodRemove {
		t.Fatalf("sent %s, want the removal (the workload's latest state)", ifxDescribe(got))
	}
	// The broker reports the workload again: it is its own store's word.
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id))))
	if got := ifxDrain(q); len(got) != 1 || !ifxIsTracked(n, n.id, "job-1") {
		t.Errorf("after a stdio removal the broker's next frame was not queued (%s) and tracked", ifxDescribe(got))
	}
}

func TestIngestRemovalMemoryDoesNotBlockResyncTaggedStdioFrame(t *testing.T) {
	n, q := ifxNode(t)
	ifxOwn(t, n, q, "job-1")
	if _, err := n.m.ingestLocal(testframe.Removal("job-1", "")); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id), `"resync":true`)))
	if got := ifxDrain(q); len(got) != 1 {
		t.Errorf("a resync-tagged frame from the broker was not queued: %s", ifxDescribe(got))
	}
	if !ifxIsTracked(n, n.id, "job-1") {
		t.Error("a resync-tagged frame from the broker was not tracked")
	}
}

// A repeated removal of a remembered workload no one owns any more keeps
// its one entry and does not extend it: the memory lives a window from the
// removal the producer owned (spec 3.5.3), so repeats cannot keep an id
// silenced for the broker.
func TestIngestRemovalMemoryRepeatedRemovalKeepsOneEntryAndDoesNotExtendIt(t *testing.T) {
	n, q := ifxNode(t)
	clock := ifxUseClock(n)
	ifxOwn(t, n, q, "job-1")
	if _, err := n.m.ingestLocal(testframe.Removal("job-1", "")); err != nil {
		t.Fatal(err)
	}
	clock.advance(40 * time.Second)
	if _, err := n.m.ingestLocal(testframe.Removal("job-1", "")); err != nil {
		t.Fatal(err)
	}
	if got := ifxRememberedCount(n); got != 1 {
		t.Fatalf("a repeated removal occupies %d entries, want 1", got)
	}
	ifxDrain(q)
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id))))
	if got := ifxDrain(q); len(got) != 0 || ifxIsTracked(n, n.id, "job-1") {
		t.Errorf("a replay inside the first removal's window was queued (%s) or tracked", ifxDescribe(got))
	}
	clock.advance(30 * time.Second) // past the first removal's window, inside the repeat's
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id))))
	if got := ifxDrain(q); len(got) != 1 || !ifxIsTracked(n, n.id, "job-1") {
		t.Errorf("a broker frame after the owned removal's window was dropped (queued %s): the repeat extended it", ifxDescribe(got))
	}
}

// --- helpers (this file and ingressrules_test.go) ----------------------------------

// ifxOwn posts a running frame of id through the ingress, so a producer
// owns it, and drains what the stand-in peer is sent.
func ifxOwn(t *testing.T, n *testNode, q *peerCapture, id string) {
	t.Helper()
	if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON(id, "running", "")))); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)
}

// outboundFrame is what a peer is sent for one entry of the state table:
// its method and its fresh line.
type outboundFrame struct {
	method string
	line   []byte
}

// peerCapture is a stand-in peer: a member of the node's table that the
// test drains by hand, as a peer's sender would.
type peerCapture struct {
	table  *statetable.Table
	member *statetable.Member
}

// ifxNode builds a node that is not started, with a stand-in peer joined
// to its table.
func ifxNode(t *testing.T, opts ...nodeOption) (*testNode, *peerCapture) {
	t.Helper()
	n := newTestNode(t, opts...)
	return n, &peerCapture{table: n.m.table, member: n.m.table.Join("capture-peer")}
}

// ifxDrain returns what the stand-in peer is sent now, the entries above
// its mark in version order, and acknowledges them.
func ifxDrain(q *peerCapture) []outboundFrame {
	var out []outboundFrame
	for {
		taken := q.table.TakeAbove(q.member, 256, 1<<30)
		if len(taken.Lines) == 0 {
			return out
		}
		for _, l := range taken.Lines {
			line := l.FreshBytes()
			var env struct {
				Method string `json:"method"`
			}
			_ = json.Unmarshal(line, &env)
			out = append(out, outboundFrame{method: env.Method, line: line})
		}
		q.table.Ack(q.member, taken.Versions[len(taken.Versions)-1])
	}
}

// ifxWaitQueued drains until an entry for workload id is sent and returns
// every frame read.
func ifxWaitQueued(t *testing.T, q *peerCapture, id string) []outboundFrame {
	t.Helper()
	var out []outboundFrame
	deadline := time.Now().Add(testkit.WaitTimeout)
	for time.Now().Before(deadline) {
		for _, f := range ifxDrain(q) {
			out = append(out, f)
			if got, _ := ifxFrameWorkload(t, f); got == id {
				return out
			}
		}
		select {
		case <-q.member.Wake():
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("timed out waiting for %s at the stand-in peer; read %s", id, ifxDescribe(out))
	return nil
}

// committed commits a frame as commitLocal does and reports whether the
// table took it.
func committed(n *testNode, f localFrame, src frameSource) bool {
	ok, _ := n.m.commitLocal(f, src)
	return ok
}

// ifxParams returns a queued frame's params, checking its envelope.
func ifxParams(t *testing.T, f outboundFrame) json.RawMessage {
	t.Helper()
	var env wireframe.RPC
	if err := json.Unmarshal(f.line, &env); err != nil {
		t.Fatalf("queued frame is not JSON: %q", f.line)
	}
	if env.JSONRPC != "2.0" || env.Method != f.method || env.ID != nil {
		t.Fatalf("queued frame %q is not a %s notification", f.line, f.method)
	}
	return env.Params
}

// ifxFrameWorkload returns the workload id a queued frame is about and
// whether it is a removal.
func ifxFrameWorkload(t *testing.T, f outboundFrame) (string, bool) {
	t.Helper()
	p := ifxParams(t, f)
	if f.method == wireframe.MethodRemove {
		var r struct {
			WorkloadID string `json:"workloadId"`
		}
		if err := json.Unmarshal(p, &r); err != nil {
			t.Fatal(err)
		}
		return r.WorkloadID, true
	}
	return ifxInfoString(t, p, "id"), false
}

// ifxInfoField returns one field of params.workloadInfo as raw JSON text.
func ifxInfoField(t *testing.T, params json.RawMessage, name string) string {
	t.Helper()
	var p struct {
		WorkloadInfo map[string]json.RawMessage `json:"workloadInfo"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		t.Fatalf("params %s: %v", params, err)
	}
	return string(p.WorkloadInfo[name])
}

func ifxInfoString(t *testing.T, params json.RawMessage, name string) string {
	t.Helper()
	var s string
	if raw := ifxInfoField(t, params, name); raw != "" {
		if err := json.Unmarshal([]byte(raw), &s); err != nil {
			t.Fatalf("workloadInfo.%s = %s, not a string", name, raw)
		}
	}
	return s
}

func ifxDescribe(fs []outboundFrame) string {
	if len(fs) == 0 {
		return "nothing"
	}
	var b bytes.Buffer
	for i, f := range fs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.Write(f.line)
	}
	return fmt.Sprintf("%d frame(s): %s", len(fs), b.String())
}

// ifxParseLocal parses a body's params with the shared local-frame
// validation only.
func ifxParseLocal(t *testing.T, body string) localFrame {
	t.Helper()
	var env wireframe.RPC
	if err := json.Unmarshal([]byte(body), &env); err != nil {
		t.Fatal(err)
	}
	f, err := parseLocalFrame(env.Method, env.Params)
	if err != nil {
		t.Fatalf("parseLocalFrame(%s): %v", body, err)
	}
	return f
}

func ifxTrackedCount(n *testNode) int { return n.m.table.Sizes().Runs }

func ifxIsTracked(n *testNode, origin, id string) bool {
	lines, _ := n.m.table.Latest(wireframe.WorkloadRef{Origin: origin, ID: id})
	return len(lines) > 0
}

func ifxRememberedCount(n *testNode) int { return n.m.table.Sizes().Removals }

// ifxRemembers reports whether the table holds a removal of (origin, id).
func ifxRemembers(n *testNode, origin, id string) bool {
	_, removed := n.m.table.Latest(wireframe.WorkloadRef{Origin: origin, ID: id})
	return removed
}

// ifxClock is a controllable clock for Manager.now.
type ifxClock struct {
	mu sync.Mutex // guards now
	t  time.Time
}

func (c *ifxClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *ifxClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// ifxUseClock gives the manager a clock that moves only when told. Call it
// before the node is used.
func ifxUseClock(n *testNode) *ifxClock {
	c := &ifxClock{t: time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)}
	n.m.now = c.now
	return c
}

// ifxGate is a broker channel whose writes are held until released: entered
// receives each write's bytes as it starts.
type ifxGate struct {
	w       io.Writer
	entered chan []byte
	release chan struct{}
}

func (g *ifxGate) Write(p []byte) (int, error) {
	g.entered <- bytes.Clone(p)
	<-g.release
	return g.w.Write(p)
}

// ifxGateBroker routes the manager's broker writes through a gate in front of
// the test broker.
func ifxGateBroker(n *testNode) *ifxGate {
	g := &ifxGate{w: n.broker.dOut, entered: make(chan []byte, 16), release: make(chan struct{})}
	n.m.out.SwapWriter(g)
	return g
}

// ifxRaw is the broker's end of a fresh io.Pipe, read raw by a reader that
// is always waiting: unlike the test broker, it never parses between reads.
type ifxRaw struct {
	w    *io.PipeWriter
	mu   sync.Mutex // guards buf
	buf  bytes.Buffer
	done chan struct{}
}

// ifxRawBroker gives the manager a new broker channel read by an ifxRaw.
func ifxRawBroker(n *testNode) *ifxRaw {
	pr, pw := io.Pipe()
	r := &ifxRaw{w: pw, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		chunk := make([]byte, 1<<20)
		for {
			k, err := pr.Read(chunk)
			r.mu.Lock()
			r.buf.Write(chunk[:k])
			r.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	n.m.out.SwapWriter(pw)
	n.t.Cleanup(func() { pw.Close() })
	return r
}

// frames closes the channel and returns every frame written to it.
func (r *ifxRaw) frames(t *testing.T) []wireframe.RPC {
	t.Helper()
	r.w.Close()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []wireframe.RPC
	for _, line := range bytes.Split(bytes.TrimSuffix(r.buf.Bytes(), []byte("\n")), []byte("\n")) {
		var f wireframe.RPC
		if err := json.Unmarshal(line, &f); err != nil {
			t.Fatalf("broker line is not JSON: %.200q", line)
		}
		out = append(out, f)
	}
	return out
}

// ifxBrokerBarrier writes a marker frame to the broker and waits for it, so
// every frame written before it has been collected.
func ifxBrokerBarrier(t *testing.T, n *testNode) {
	t.Helper()
	before := len(n.broker.WithMethod("test:barrier"))
	if err := n.m.out.Notify("test:barrier", nil); err != nil {
		t.Fatalf("barrier write: %v", err)
	}
	n.broker.WaitMethod("test:barrier", before+1)
}
