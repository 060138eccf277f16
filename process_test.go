package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"nvpair-workload-manager/internal/devpki"
	"nvpair-workload-manager/internal/pairshadow"
	"nvpair-workload-manager/internal/wireframe"
)

// The tests in this file run the real binary, built once per test run, and
// drive it the way its broker does: through its stdin and stdout pipes (or a
// Unix socket with --ipc), with cluster directories minted by devpki.

// exitDeadline bounds how long a daemon may take to exit once told to. The
// peer queues' default drain time is 1.5 s and the servers' grace 0.5 s, so
// a daemon that takes longer has not shut down promptly (the tight bound is
// TestProcessExitsWithinThePAIRStopGraceWhateverItsPeersAndBrokerDo's).
const exitDeadline = 5 * time.Second

func TestProcessAnnouncesReadyThenSubscribes(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0])
	frames := d.waitFrames(2)
	if frames[0].Method != "ready" || frames[0].IsRequest() {
		t.Fatalf("first frame = %s, want the ready notification", d.line(0))
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
		t.Fatalf("second frame = %s, want discovery:subscribe", d.line(1))
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

	up := b.waitMethod(wireframe.MethodUpsert, 1)[0]
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
	rm := b.waitMethod(wireframe.MethodRemove, 1)[0]
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
	if got := a.withMethod(wireframe.MethodUpsert); len(got) != 0 {
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
	a.send(lifecycleLine("derived-1", "running", nodes[0].ID))
	b.waitUpserts("derived-1", 1)
}

func TestProcessExitsZeroOnSignal(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("signals are not delivered this way on Windows")
	}
	for _, sig := range []os.Signal{syscall.SIGTERM, os.Interrupt} {
		t.Run(sig.String(), func(t *testing.T) {
			nodes := writeCluster(t, 1)
			d := startNode(t, nodes[0])
			d.waitMethod("discovery:subscribe", 1) // the handler is installed before ready
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
	d.waitMethod("discovery:subscribe", 1)
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
	raw := d.waitResponseLine(`"bye"`)
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
	d.waitMethod("discovery:subscribe", 1)
	// A response from the broker is ignored with a debug log: silent at error.
	d.send(`{"jsonrpc":"2.0","id":"early","result":null}`)
	d.send(`{"jsonrpc":"2.0","id":2,"method":"log/set-level","params":{"level":"debug"}}`)
	if got := d.waitResponse("2"); got.Error != nil || !sameJSON(t, got.Result, json.RawMessage(`{"level":"debug"}`)) {
		t.Fatalf("log/set-level debug answered result %s error %+v, want {\"level\":\"debug\"}", got.Result, got.Error)
	}
	d.send(`{"jsonrpc":"2.0","id":"late","result":null}`)
	d.waitLog("response from broker ignored", `id="\"late\""`)
	if strings.Contains(d.stderr.String(), "early") {
		t.Fatalf("a debug line was logged at level error:\n%s", d.stderr.String())
	}

	d.send(`{"jsonrpc":"2.0","id":3,"method":"log/set-level","params":{"level":"verbose"}}`)
	if got := d.waitResponse("3"); got.Error == nil || got.Error.Code != wireframe.CodeInvalidParams {
		t.Fatalf("log/set-level verbose answered %+v, want error %d", got, wireframe.CodeInvalidParams)
	}
}

func TestProcessAnswersUnknownRequestWithMethodNotFound(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0])
	d.send(`{"jsonrpc":"2.0","method":"nope-notification"}`)
	d.send(`{"jsonrpc":"2.0","id":1,"method":"nope"}`)
	got := d.waitResponse("1")
	if got.Error == nil || got.Error.Code != wireframe.CodeMethodNotFound {
		t.Fatalf("unknown request answered %+v, want error %d", got, wireframe.CodeMethodNotFound)
	}
	// The request was handled after the notification, which is not answered.
	if n := len(d.all()); n != 3 {
		t.Fatalf("daemon wrote %d frames, want ready, discovery:subscribe and one answer:\n%s", n, d.text())
	}
}

func TestProcessSkipsMalformedAndOverlongLinesAndKeepsWorking(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0])
	d.waitMethod("discovery:subscribe", 1)
	d.send(`{"jsonrpc":"2.0","id":1,"method":`) // not JSON
	// 2 MiB: a request whose padding puts it over the 1 MiB frame limit.
	d.send(`{"jsonrpc":"2.0","method":"log/set-level","params":{"level":"debug","pad":"` + strings.Repeat("x", 2<<20) + `"}}`)
	d.send(`{"jsonrpc":"2.0","id":2,"method":"nope"}`)
	if got := d.waitResponse("2"); got.Error == nil || got.Error.Code != wireframe.CodeMethodNotFound {
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
	if got := d.waitResponse("5"); got.Error != nil || !sameJSON(t, got.Result, json.RawMessage(`{"level":"info"}`)) {
		t.Fatalf("a 1 MiB request answered %+v, want {\"level\":\"info\"}", got)
	}
}

// PAIR's broker reads the daemon's stdout with a 256 KiB line buffer. By
// default a producer's frame that would be a longer line is refused with
// 413 and the daemon keeps working; --broker-line-max raises the limit.
func TestProcessBrokerLineMaxSetsTheLimitOfLinesToTheBroker(t *testing.T) {
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
			got, text := postIngress(t, ingress, string(longNoteFrame(t, "proc-long-error", "")))
			if got != tc.want {
				t.Fatalf("a frame with a %d-byte note: status %d (%q), want %d", longErrorBytes, got, text, tc.want)
			}
			if got == http.StatusRequestEntityTooLarge && !strings.Contains(text, itoa(tc.limit)+"-byte line limit (--broker-line-max)") {
				t.Fatalf("reason %q does not give the %d-byte limit", text, tc.limit)
			}
			// A frame accepted after it: the daemon still works, and every
			// earlier line has been read.
			if got, text := postIngress(t, ingress, liFrame("proc-after")); got != http.StatusOK {
				t.Fatalf("next frame: status %d (%q), want 200", got, text)
			}
			d.waitUpserts("proc-after", 1)
			want := 0
			if tc.want == http.StatusOK {
				want = 1
			}
			if n := d.upsertCount("proc-long-error"); n != want {
				t.Fatalf("the broker got the long frame %d time(s), want %d", n, want)
			}
			for _, line := range strings.Split(d.text(), "\n") {
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
	ln.(*net.UnixListener).SetDeadline(time.Now().Add(waitTimeout))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("the daemon did not dial the broker socket: %v\n%s", err, d.stderr.String())
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(waitTimeout))
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
	if out := d.text(); out != "" {
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
	a.send(lifecycleLine("hb-live", "running", nodes[0].ID))
	// One event, delivered once by the broadcast, then again on every
	// heartbeat: dedup would stop the repeats were they not re-assertions.
	b.waitUpserts("hb-live", 4)
}

func TestProcessHeartbeatStopsTerminalWorkloadAfterTwoIntervals(t *testing.T) {
	nodes := writeCluster(t, 2)
	a, b := startPair(t, nodes[0], nodes[1], "--resync-interval", testResyncInterval.String())
	a.send(lifecycleLine("hb-live", "running", nodes[0].ID))
	b.waitUpserts("hb-live", 1)
	a.send(lifecycleLine("hb-done", "completed", nodes[0].ID))
	b.waitUpserts("hb-done", 1)

	// Every heartbeat counted from here fires after hb-done was tracked; the
	// fourth one is at least 3 intervals later, past the 2-interval retention.
	clock := b.upsertCount("hb-live")
	b.waitUpserts("hb-live", clock+4)
	settled := b.upsertCount("hb-done")
	if settled < 2 {
		t.Fatalf("hb-done reached B %d time(s), want it re-asserted at least once during its retention", settled)
	}
	clock = b.upsertCount("hb-live")
	b.waitUpserts("hb-live", clock+3)
	if got := b.upsertCount("hb-done"); got != settled {
		t.Fatalf("hb-done reached B %d times, %d before: re-asserted after its retention", got, settled)
	}
}

func TestProcessHeartbeatNeverReassertsRemovedWorkload(t *testing.T) {
	nodes := writeCluster(t, 2)
	a, b := startPair(t, nodes[0], nodes[1], "--resync-interval", testResyncInterval.String())
	a.send(lifecycleLine("hb-live", "running", nodes[0].ID))
	a.send(lifecycleLine("hb-gone", "running", nodes[0].ID))
	b.waitUpserts("hb-gone", 2) // tracked: re-asserted at least once
	a.send(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"hb-gone","originatedFrom":"` + nodes[0].ID + `"}}`)
	eventually(t, "hb-gone's removal at B", func() bool {
		for _, f := range b.withMethod(wireframe.MethodRemove) {
			if strings.Contains(string(f.Params), `"hb-gone"`) {
				return true
			}
		}
		return false
	})
	// Any heartbeat queued before the removal was delivered before it.
	removedAt := b.upsertCount("hb-gone")
	clock := b.upsertCount("hb-live")
	b.waitUpserts("hb-live", clock+3)
	if got := b.upsertCount("hb-gone"); got != removedAt {
		t.Fatalf("hb-gone reached B %d times after its removal (%d before)", got-removedAt, removedAt)
	}
}

// ---- process helpers -------------------------------------------------------

var (
	binOnce sync.Once
	binDir  string // removed by TestMain
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	pairshadow.RemoveProgram() // PAIR's store program, when a Jobs list built it
	os.Exit(code)
}

// daemonBinary builds the daemon once per test run and returns its path.
func daemonBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "nvpair-wm-bin-"); binErr != nil {
			return
		}
		out := filepath.Join(binDir, "nvpair-workload-manager")
		if runtime.GOOS == "windows" {
			out += ".exe"
		}
		if b, err := exec.Command(goToolPath(), "build", "-o", out, ".").CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, b)
			return
		}
		binPath = out
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// goToolPath is the go command that builds the daemon under test.
func goToolPath() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// writeCluster mints n nodes, pinned to each other, under a temp dir.
func writeCluster(t testing.TB, n int) []devpki.Node {
	t.Helper()
	nodes, err := devpki.WriteCluster(t.TempDir(), n)
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

// nodeArgs are the flags that run node on port, then extra.
func nodeArgs(node devpki.Node, port int, extra ...string) []string {
	return append([]string{"--app-dir", node.AppDir, "--cluster-dir", node.ClusterDir, "--port", itoa(port), "--log-level", "debug"}, extra...)
}

// daemonProc is one running daemon and the broker's end of its pipes.
type daemonProc struct {
	t        testing.TB
	cmd      *exec.Cmd
	port     int        // --port, when startNode chose it
	stdin    *os.File   // our end of the daemon's stdin
	stdout   *os.File   // our end of the daemon's stdout
	stderr   *logBuffer // the daemon's log
	frameLog            // what it wrote to stdout

	readDone chan struct{} // the stdout reader has stopped
	exited   chan struct{} // the process has been waited for
}

// startNode starts node with its app and cluster dirs on --port 0 and
// returns once the daemon has logged the port the kernel gave it: a test
// never picks a port itself, so no other process can take it first.
func startNode(t testing.TB, node devpki.Node, extra ...string) *daemonProc {
	t.Helper()
	d := startDaemon(t, nodeArgs(node, 0, extra...)...)
	d.port = d.boundPeerPort()
	return d
}

// startDaemon starts the binary with args, its stdin and stdout on pipes
// whose other ends the test holds. The process is killed at cleanup if it
// is still running, and its log is shown when the test failed.
func startDaemon(t testing.TB, args ...string) *daemonProc {
	t.Helper()
	return startDaemonBinary(t, daemonBinary(t), nil, args...)
}

// startDaemonBinary is startDaemon for a given binary, with env added to
// the environment it inherits.
func startDaemonBinary(t testing.TB, bin string, env []string, args ...string) *daemonProc {
	t.Helper()
	return startDaemonReading(t, bin, env, nil, args...)
}

// startDaemonReading is startDaemonBinary with the daemon's stdout read
// through wrap (nil: as it is), for a test that controls the broker's
// reading.
func startDaemonReading(t testing.TB, bin string, env []string, wrap func(io.Reader) io.Reader, args ...string) *daemonProc {
	t.Helper()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{t: t, stdin: inW, stdout: outR, stderr: &logBuffer{}, frameLog: frameLog{t: t},
		readDone: make(chan struct{}), exited: make(chan struct{})}
	d.lineMax.Store(int64(brokerLineMaxArg(args))) // 0 without the flag: PAIR's limit
	d.cmd = exec.Command(bin, args...)
	d.cmd.Env = append(os.Environ(), env...)
	d.cmd.Stdin, d.cmd.Stdout, d.cmd.Stderr = inR, outW, d.stderr
	err = d.cmd.Start()
	inR.Close() // the child holds its own copies
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	var out io.Reader = d.stdout
	if wrap != nil {
		out = wrap(d.stdout)
	}
	go func() { defer close(d.readDone); d.readFrom(out) }()
	t.Cleanup(func() {
		if !d.exitedYet() {
			d.cmd.Process.Kill()
			<-d.exited
		}
		d.stdin.Close()
		d.stdout.Close()
		<-d.readDone
		if t.Failed() {
			t.Logf("daemon %v log:\n%s", args, d.stderr.String())
		}
	})
	return d
}

// send writes one line to the daemon's stdin.
func (d *daemonProc) send(line string) {
	d.t.Helper()
	if _, err := io.WriteString(d.stdin, line+"\n"); err != nil {
		d.t.Fatalf("write to daemon stdin: %v", err)
	}
}

func (d *daemonProc) closeStdin()  { d.stdin.Close() }
func (d *daemonProc) closeStdout() { d.stdout.Close() }

func (d *daemonProc) exitedYet() bool {
	select {
	case <-d.exited:
		return true
	default:
		return false
	}
}

// waitExit waits for the process to end, at most within, and returns how.
func (d *daemonProc) waitExit(within time.Duration) *os.ProcessState {
	d.t.Helper()
	select {
	case <-d.exited:
		return d.cmd.ProcessState
	case <-time.After(within):
		d.t.Fatalf("daemon still running %v after it was told to stop", within)
		return nil
	}
}

// wantCleanExit fails unless the process exited by itself with code 0.
func (d *daemonProc) wantCleanExit(st *os.ProcessState) {
	d.t.Helper()
	if !st.Exited() || st.ExitCode() != 0 {
		d.t.Fatalf("daemon ended with %q, want exit status 0", st.String())
	}
}

// readyNodeID waits for the ready frame and returns its nodeId.
func (d *daemonProc) readyNodeID() string {
	d.t.Helper()
	var p struct {
		NodeID string `json:"nodeId"`
	}
	if err := json.Unmarshal(d.waitMethod("ready", 1)[0].Params, &p); err != nil {
		d.t.Fatal(err)
	}
	return p.NodeID
}

// waitLog waits for a log line holding every fragment.
func (d *daemonProc) waitLog(fragments ...string) {
	d.t.Helper()
	eventually(d.t, fmt.Sprintf("a log line with %q", fragments), func() bool { return d.stderr.contains(fragments...) })
}

// discover sends the daemon a discovery snapshot listing node at port.
func (d *daemonProc) discover(node devpki.Node, port int) {
	d.t.Helper()
	p, err := json.Marshal(map[string]any{"nodes": []map[string]any{{
		"hostUuid": node.ID, "name": "node-" + node.ID[:8], "ip": "127.0.0.1",
		"clusterUuid": node.ID, "trusted": true,
		"services": map[string]any{"wl": map[string]any{"port": port}},
	}}})
	if err != nil {
		d.t.Fatal(err)
	}
	d.send(string(wireframe.EncodeNotification("discovery:nodes", p)))
}

// startPair starts two nodes, each with the other as its only broadcast
// target, and returns once both have taken the target.
func startPair(t testing.TB, na, nb devpki.Node, extra ...string) (a, b *daemonProc) {
	t.Helper()
	a, b = startNode(t, na, extra...), startNode(t, nb, extra...)
	a.waitMethod("discovery:subscribe", 1) // bound and listening
	b.waitMethod("discovery:subscribe", 1)
	a.discover(nb, b.port)
	b.discover(na, a.port)
	a.waitLog("broadcast targets changed", "total=1")
	b.waitLog("broadcast targets changed", "total=1")
	return a, b
}

// lifecycleLine is a broker's lifecycle frame for a valid workload.
func lifecycleLine(id, state, origin string) string {
	p, err := json.Marshal(map[string]any{"workloadInfo": workload(id, state, origin)})
	if err != nil {
		panic(err)
	}
	return string(wireframe.EncodeNotification(methodFor(state), p))
}

// sameJSON reports whether two JSON texts are the same value, numbers
// compared by their text so that precision loss shows.
func sameJSON(t testing.TB, a, b json.RawMessage) bool {
	t.Helper()
	decode := func(raw json.RawMessage) any {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("not JSON: %q: %v", raw, err)
		}
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			t.Fatalf("trailing data after JSON value: %q", raw)
		}
		return v
	}
	return reflect.DeepEqual(decode(a), decode(b))
}

// loggedValue waits for a log line holding msg and returns the value of
// key in it (slog's text format: key=value, the value quoted when it holds
// a space). The daemon reports what it bound this way ("started" peerAddr,
// "local ingress listening" addr), so a test never has to guess a port.
func (d *daemonProc) loggedValue(msg, key string) string {
	d.t.Helper()
	var v string
	eventually(d.t, fmt.Sprintf("a %q log line with %s", msg, key), func() bool {
		for _, line := range strings.Split(d.stderr.String(), "\n") {
			if !strings.Contains(line, "msg="+strconv.Quote(msg)) && !strings.Contains(line, "msg="+msg+" ") {
				continue
			}
			_, rest, ok := strings.Cut(line, " "+key+"=")
			if !ok {
				continue
			}
			if strings.HasPrefix(rest, `"`) {
				if q, err := strconv.QuotedPrefix(rest); err == nil {
					v, _ = strconv.Unquote(q)
					return true
				}
				continue
			}
			v, _, _ = strings.Cut(rest, " ")
			return true
		}
		return false
	})
	return v
}

// boundPeerPort is the inter-node port the daemon bound, from its log.
func (d *daemonProc) boundPeerPort() int {
	d.t.Helper()
	_, port, err := net.SplitHostPort(d.loggedValue("started", "peerAddr"))
	if err != nil {
		d.t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		d.t.Fatal(err)
	}
	return p
}
