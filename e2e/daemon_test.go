package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// The daemon as a process on its broker's pipes: it announces itself,
// relays between nodes, answers the broker's requests, survives bad lines,
// keeps its heartbeat, and exits cleanly however it is told to stop.

func TestProcessAnnouncesReadyThenSubscribes(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0])
	frames := d.WaitFrames(2)
	if frames[0].Method != "ready" || frames[0].IsRequest() {
		t.Fatalf("first frame = %s, want the ready notification", d.Line(0))
	}
	var ready struct {
		Version string `json:"version"`
		NodeID  string `json:"nodeId"`
	}
	if err := json.Unmarshal(frames[0].Params, &ready); err != nil {
		t.Fatalf("ready params: %v", err)
	}
	_, versionOut, _ := runBinary(t, "--version")
	if want := strings.Fields(versionOut + " ?")[1]; ready.Version != want || ready.NodeID != nodes[0].ID {
		t.Fatalf("ready = %+v, want version %q (the second word --version prints) and nodeId %s", ready, want, nodes[0].ID)
	}
	if frames[1].Method != "discovery:subscribe" {
		t.Fatalf("second frame = %s, want discovery:subscribe", d.Line(1))
	}
	var sub struct {
		Services []string `json:"services"`
	}
	if err := json.Unmarshal(frames[1].Params, &sub); err != nil || !reflect.DeepEqual(sub.Services, []string{"wl"}) {
		t.Fatalf("discovery:subscribe params = %s, want services [wl]", frames[1].Params)
	}
}

func TestProcessRelaysLifecycleAndRemovalBetweenNodesThenExitsOnStdinEOF(t *testing.T) {
	nodes := writeCluster(t, 2)
	a, b := startPair(t, nodes[0], nodes[1])

	// A hand-written object: unknown fields (one nested), explicit nulls, and
	// a number no float64 holds exactly, so any re-encoding shows.
	info := `{"id":"job-7","model":"qwen3.5-9b","engine":"some-engine/v2","state":"running",` +
		`"originatedFrom":"` + nodes[0].ID + `","scheduledOn":"` + nodes[0].ID + `","runId":"9f3c1a7b","seq":3,` +
		`"createdAt":1789661457000,"startedAt":1789661458000,"completedAt":null,"error":null,"requesterId":null,` +
		`"vendorExtra":{"gpus":[0,1],"note":"kept \u00e9"},"bigCounter":123456789012345678901234567890}`
	a.send(`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":` + info + `}}`)

	up := b.WaitMethod(wireframe.MethodUpsert, 1)[0]
	var p struct {
		WorkloadInfo json.RawMessage `json:"workloadInfo"`
	}
	if err := json.Unmarshal(up.Params, &p); err != nil {
		t.Fatalf("upsert params: %v", err)
	}
	if !sameJSON(t, p.WorkloadInfo, json.RawMessage(info)) {
		t.Fatalf("B's broker got workloadInfo\n %s\nwant it unchanged:\n %s", p.WorkloadInfo, info)
	}

	a.send(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-7","originatedFrom":"` + nodes[0].ID + `"}}`)
	rm := b.WaitMethod(wireframe.MethodRemove, 1)[0]
	var rp struct {
		WorkloadID     string `json:"workloadId"`
		OriginatedFrom string `json:"originatedFrom"`
	}
	if err := json.Unmarshal(rm.Params, &rp); err != nil {
		t.Fatalf("remove params: %v", err)
	}
	if rp.WorkloadID != "job-7" || rp.OriginatedFrom != nodes[0].ID {
		t.Fatalf("B's broker got workloads:remove %s, want job-7 from %s", rm.Params, nodes[0].ID)
	}
	// The removal reaching B proves A has handled both frames: the broker
	// already applied them, so nothing went back up to A's broker.
	if got := a.WithMethod(wireframe.MethodUpsert); len(got) != 0 {
		t.Fatalf("A echoed its broker's own frame back up: %v", got)
	}

	start := time.Now()
	a.closeStdin()
	a.wantCleanExit(a.waitExit(exitDeadline))
	t.Logf("A exited %v after its stdin closed", time.Since(start).Round(time.Millisecond))
}

func TestProcessDerivesEachDirectoryFromTheOther(t *testing.T) {
	// A gets only --app-dir (its identity must be found in <app-dir>/cluster),
	// B only --cluster-dir (its node id must be read from the parent). The
	// relay working and B announcing its stored id prove both derivations.
	nodes := writeCluster(t, 2)
	a := startDaemon(t, "--app-dir", nodes[0].AppDir, "--port", "0", "--log-level", "debug")
	b := startDaemon(t, "--cluster-dir", nodes[1].ClusterDir, "--port", "0", "--log-level", "debug")
	if got := a.readyNodeID(); got != nodes[0].ID {
		t.Fatalf("A announced node id %s, want %s from <app-dir>/node-id", got, nodes[0].ID)
	}
	if got := b.readyNodeID(); got != nodes[1].ID {
		t.Fatalf("B announced node id %s, want %s from <parent of cluster-dir>/node-id", got, nodes[1].ID)
	}
	a.discover(nodes[1], b.boundPeerPort())
	a.waitLog("broadcast targets changed", "total=1")
	a.send(testframe.LifecycleLine("derived-1", "running", nodes[0].ID))
	b.WaitUpserts("derived-1", 1)
}

func TestProcessExitsZeroOnSignal(t *testing.T) {
	skipUnderShort(t) // here, not in its subtests alone: they start the binary after its setup
	if runtime.GOOS == "windows" {
		t.Skip("signals are not delivered this way on Windows")
	}
	for _, sig := range []os.Signal{syscall.SIGTERM, os.Interrupt} {
		t.Run(sig.String(), func(t *testing.T) {
			nodes := writeCluster(t, 1)
			d := startNode(t, nodes[0])
			d.WaitMethod("discovery:subscribe", 1) // the handler is installed before ready
			if err := d.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			d.wantCleanExit(d.waitExit(exitDeadline))
		})
	}
}

func TestProcessExitsZeroNotBySIGPIPEWhenBrokerClosesStdout(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0])
	d.WaitMethod("discovery:subscribe", 1)
	d.closeStdout()
	// A request makes the daemon write its answer into the closed pipe.
	d.send(`{"jsonrpc":"2.0","id":1,"method":"nope"}`)
	st := d.waitExit(exitDeadline)
	if !st.Exited() || st.ExitCode() != 0 {
		t.Fatalf("daemon ended with %q, want a normal exit 0 (not death by SIGPIPE)", st.String())
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Fatalf("daemon was killed by signal %v", ws.Signal())
	}
}

func TestProcessAnswersShutdownWithNullResultThenExitsZero(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0])
	d.send(`{"jsonrpc":"2.0","id":"bye","method":"shutdown"}`)
	raw := d.WaitResponseLine(`"bye"`)
	var resp map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &resp); err != nil {
		t.Fatal(err)
	}
	res, ok := resp["result"]
	if !ok || string(res) != "null" || resp["error"] != nil {
		t.Fatalf("shutdown answered %s, want a null result and no error", raw)
	}
	d.wantCleanExit(d.waitExit(exitDeadline))
}

func TestProcessLogSetLevelAnswersResolvedLevelAndTakesEffect(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startDaemon(t, nodeArgs(nodes[0], 0, "--log-level", "error")...)
	d.WaitMethod("discovery:subscribe", 1)
	// A response from the broker is ignored with a debug log: silent at error.
	d.send(`{"jsonrpc":"2.0","id":"early","result":null}`)
	d.send(`{"jsonrpc":"2.0","id":2,"method":"log/set-level","params":{"level":"debug"}}`)
	if got := d.WaitResponse("2"); got.Error != nil || !sameJSON(t, got.Result, json.RawMessage(`{"level":"debug"}`)) {
		t.Fatalf("log/set-level debug answered result %s error %+v, want {\"level\":\"debug\"}", got.Result, got.Error)
	}
	d.send(`{"jsonrpc":"2.0","id":"late","result":null}`)
	d.waitLog("response from broker ignored", `id="\"late\""`)
	if strings.Contains(d.stderr.String(), "early") {
		t.Fatalf("a debug line was logged at level error:\n%s", d.stderr.String())
	}

	d.send(`{"jsonrpc":"2.0","id":3,"method":"log/set-level","params":{"level":"verbose"}}`)
	if got := d.WaitResponse("3"); got.Error == nil || got.Error.Code != wireframe.CodeInvalidParams {
		t.Fatalf("log/set-level verbose answered %+v, want error %d", got, wireframe.CodeInvalidParams)
	}
}

func TestProcessAnswersUnknownRequestWithMethodNotFound(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0])
	d.send(`{"jsonrpc":"2.0","method":"nope-notification"}`)
	d.send(`{"jsonrpc":"2.0","id":1,"method":"nope"}`)
	got := d.WaitResponse("1")
	if got.Error == nil || got.Error.Code != wireframe.CodeMethodNotFound {
		t.Fatalf("unknown request answered %+v, want error %d", got, wireframe.CodeMethodNotFound)
	}
	// The request was handled after the notification, which is not answered.
	if n := len(d.All()); n != 3 {
		t.Fatalf("daemon wrote %d frames, want ready, discovery:subscribe and one answer:\n%s", n, d.Text())
	}
}

func TestProcessSkipsMalformedAndOverlongLinesAndKeepsWorking(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0])
	d.WaitMethod("discovery:subscribe", 1)
	d.send(`{"jsonrpc":"2.0","id":1,"method":`) // not JSON
	// 2 MiB: a request whose padding puts it over the 1 MiB frame limit.
	d.send(`{"jsonrpc":"2.0","method":"log/set-level","params":{"level":"debug","pad":"` + strings.Repeat("x", 2<<20) + `"}}`)
	d.send(`{"jsonrpc":"2.0","id":2,"method":"nope"}`)
	if got := d.WaitResponse("2"); got.Error == nil || got.Error.Code != wireframe.CodeMethodNotFound {
		t.Fatalf("request after the bad lines answered %+v, want error %d", got, wireframe.CodeMethodNotFound)
	}
	if n := strings.Count(d.stderr.String(), "local frame skipped"); n != 2 {
		t.Fatalf("%d skipped frames logged, want 2:\n%s", n, d.stderr.String())
	}
	if d.exitedYet() {
		t.Fatal("daemon exited after bad input")
	}
}

func TestProcessAcceptsOneMiBLine(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0])
	head := `{"jsonrpc":"2.0","id":5,"method":"log/set-level","params":{"level":"info","pad":"`
	tail := `"}}`
	d.send(head + strings.Repeat("y", wireframe.MaxBytes-len(head)-len(tail)) + tail)
	if got := d.WaitResponse("5"); got.Error != nil || !sameJSON(t, got.Result, json.RawMessage(`{"level":"info"}`)) {
		t.Fatalf("a 1 MiB request answered %+v, want {\"level\":\"info\"}", got)
	}
}

// PAIR's broker reads the daemon's stdout with a 256 KiB line buffer. By
// default a producer's frame that would be a longer line is refused with
// 413 and the daemon keeps working; --broker-line-max raises the limit.
func TestProcessBrokerLineMaxSetsTheLimitOfLinesToTheBroker(t *testing.T) {
	skipUnderShort(t) // here, not in its subtests alone: they start the binary after its setup
	for _, tc := range []struct {
		name  string
		extra []string
		limit int
		want  int
	}{
		{"default", nil, 262144, http.StatusRequestEntityTooLarge},
		{"--broker-line-max 1048576", []string{"--broker-line-max", "1048576"}, 1048576, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := writeCluster(t, 1)
			// The workload bound at its most, so the line limit is the
			// bound the long frame meets.
			args := append([]string{"--local-ingress", "127.0.0.1:0", "--workload-max-bytes", itoa(wireframe.MaxWorkloadMaxBytes)}, tc.extra...)
			d := startNode(t, nodes[0], args...)
			ingress := d.loggedValue("local ingress listening", "addr")
			got, text := testkit.PostIngress(t, ingress, string(longNoteFrame("proc-long-error", "")))
			if got != tc.want {
				t.Fatalf("a frame with a %d-byte note: status %d (%q), want %d", longErrorBytes, got, text, tc.want)
			}
			if got == http.StatusRequestEntityTooLarge && !strings.Contains(text, itoa(tc.limit)+"-byte line limit (--broker-line-max)") {
				t.Fatalf("reason %q does not give the %d-byte limit", text, tc.limit)
			}
			// A frame accepted after it: the daemon still works, and every
			// earlier line has been read.
			if got, text := testkit.PostIngress(t, ingress, liFrame("proc-after")); got != http.StatusOK {
				t.Fatalf("next frame: status %d (%q), want 200", got, text)
			}
			d.WaitUpserts("proc-after", 1)
			want := 0
			if tc.want == http.StatusOK {
				want = 1
			}
			if n := d.UpsertCount("proc-long-error"); n != want {
				t.Fatalf("the broker got the long frame %d time(s), want %d", n, want)
			}
			for _, line := range strings.Split(d.Text(), "\n") {
				if len(line)+1 > tc.limit {
					t.Fatalf("the daemon wrote a %d-byte line, over the %d-byte limit", len(line)+1, tc.limit)
				}
			}
			if d.exitedYet() {
				t.Fatal("the daemon exited")
			}
		})
	}
}

func TestProcessWithIPCAnnouncesOnTheSocket(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("--ipc is a named pipe on Windows")
	}
	dir, err := os.MkdirTemp("", "nvipc") // short: socket paths are limited to ~100 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "b.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	nodes := writeCluster(t, 1)
	d := startDaemon(t, nodeArgs(nodes[0], 0, "--ipc", sock)...)
	ln.(*net.UnixListener).SetDeadline(time.Now().Add(testkit.WaitTimeout))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("the daemon did not dial the broker socket: %v\n%s", err, d.stderr.String())
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(testkit.WaitTimeout))
	r := bufio.NewReader(conn)
	var got []wireframe.RPC
	for range 2 {
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("read from socket: %v", err)
		}
		var f wireframe.RPC
		if err := json.Unmarshal(line, &f); err != nil {
			t.Fatalf("socket line %q: %v", line, err)
		}
		got = append(got, f)
	}
	if got[0].Method != "ready" || !strings.Contains(string(got[0].Params), nodes[0].ID) || got[1].Method != "discovery:subscribe" {
		t.Fatalf("socket frames = %s / %s, want ready (with our node id) then discovery:subscribe", got[0].Method, got[1].Method)
	}
	if _, err := io.WriteString(conn, `{"jsonrpc":"2.0","id":1,"method":"nope"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadBytes('\n')
	var resp wireframe.RPC
	if err != nil || json.Unmarshal(line, &resp) != nil || string(resp.ID) != "1" || resp.Error == nil {
		t.Fatalf("answer on the socket = %q (%v), want the error answer to id 1", line, err)
	}
	if out := d.Text(); out != "" {
		t.Fatalf("with --ipc the daemon wrote to stdout: %q", out)
	}
	conn.Close() // the broker going away ends the daemon cleanly
	d.wantCleanExit(d.waitExit(exitDeadline))
}

// The heartbeat tests run two processes with a 300 ms re-sync interval.
// B's broker sees each re-assertion as a workloads:upsert (the resync marker
// stays on the peer hop), so re-assertions are counted as upserts of one id
// at B. A running workload on A is the clock: each heartbeat delivers it to
// B once more, and peers receive frames in queue order, so once its count
// has grown by k, k more heartbeats have been fully delivered.
const testResyncInterval = 300 * time.Millisecond

func TestProcessHeartbeatReassertsRunningWorkload(t *testing.T) {
	nodes := writeCluster(t, 2)
	a, b := startPair(t, nodes[0], nodes[1], "--resync-interval", testResyncInterval.String())
	a.send(testframe.LifecycleLine("hb-live", "running", nodes[0].ID))
	// One event, delivered once by the broadcast, then again on every
	// heartbeat: dedup would stop the repeats were they not re-assertions.
	b.WaitUpserts("hb-live", 4)
}

func TestProcessHeartbeatStopsTerminalWorkloadAfterTwoIntervals(t *testing.T) {
	nodes := writeCluster(t, 2)
	a, b := startPair(t, nodes[0], nodes[1], "--resync-interval", testResyncInterval.String())
	a.send(testframe.LifecycleLine("hb-live", "running", nodes[0].ID))
	b.WaitUpserts("hb-live", 1)
	a.send(testframe.LifecycleLine("hb-done", "completed", nodes[0].ID))
	b.WaitUpserts("hb-done", 1)

	// Every heartbeat counted from here fires after hb-done was tracked; the
	// fourth one is at least 3 intervals later, past the 2-interval retention.
	clock := b.UpsertCount("hb-live")
	b.WaitUpserts("hb-live", clock+4)
	settled := b.UpsertCount("hb-done")
	if settled < 2 {
		t.Fatalf("hb-done reached B %d time(s), want it re-asserted at least once during its retention", settled)
	}
	clock = b.UpsertCount("hb-live")
	b.WaitUpserts("hb-live", clock+3)
	if got := b.UpsertCount("hb-done"); got != settled {
		t.Fatalf("hb-done reached B %d times, %d before: re-asserted after its retention", got, settled)
	}
}

func TestProcessHeartbeatNeverReassertsRemovedWorkload(t *testing.T) {
	nodes := writeCluster(t, 2)
	a, b := startPair(t, nodes[0], nodes[1], "--resync-interval", testResyncInterval.String())
	a.send(testframe.LifecycleLine("hb-live", "running", nodes[0].ID))
	a.send(testframe.LifecycleLine("hb-gone", "running", nodes[0].ID))
	b.WaitUpserts("hb-gone", 2) // tracked: re-asserted at least once
	a.send(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"hb-gone","originatedFrom":"` + nodes[0].ID + `"}}`)
	testkit.Eventually(t, "hb-gone's removal at B", func() bool {
		for _, f := range b.WithMethod(wireframe.MethodRemove) {
			if strings.Contains(string(f.Params), `"hb-gone"`) {
				return true
			}
		}
		return false
	})
	// Any heartbeat queued before the removal was delivered before it.
	removedAt := b.UpsertCount("hb-gone")
	clock := b.UpsertCount("hb-live")
	b.WaitUpserts("hb-live", clock+3)
	if got := b.UpsertCount("hb-gone"); got != removedAt {
		t.Fatalf("hb-gone reached B %d times after its removal (%d before)", got-removedAt, removedAt)
	}
}

// longErrorBytes is the length of longNoteWorkload's long text: 300 KiB,
// over the broker's default 256 KiB line limit and under the 1 MiB cap on a
// request body.
const longErrorBytes = 300 << 10

// longNoteWorkload is a failed workload with longErrorBytes of text in a
// member the daemon does not know. The ingress bounds a producer's error
// text (wireframe.MaxIngressErrorBytes) but passes unknown members through,
// so this is how a producer's frame can still be over the broker's line
// limit.
func longNoteWorkload(id, origin string) map[string]any {
	w := testframe.Workload(id, "failed", origin, map[string]any{"note": strings.Repeat("n", longErrorBytes)})
	if origin == "" {
		delete(w, "originatedFrom")
	}
	return w
}

// longNoteFrame is the workload:errored notification of longNoteWorkload.
func longNoteFrame(id, origin string) []byte {
	return testframe.Lifecycle(longNoteWorkload(id, origin), nil)
}
