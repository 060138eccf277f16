package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/pairshadow"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// The harness every test of this package shares: it builds the daemon's
// binary once per run, starts it with its stdin and stdout on pipes the test
// holds (the broker's end, or a Unix socket with --ipc), with cluster
// directories minted by devpki, and reads what it writes there and to its
// log. A test drives the daemon only from outside: its pipes, its ports and
// its files.

// TestMain runs the tests, then removes what they built: the daemon (and
// the stock daemon, built beside it) and PAIR's store program, when a Jobs
// list built it.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	pairshadow.RemoveProgram()
	os.Exit(code)
}

// skipUnderShort skips the test under -short. Every test here starts the
// binary, which takes seconds where the inner loop (go test -short ./...)
// has a minute for the whole module; daemonBinary calls it, so every test
// that builds or starts the daemon skips before doing anything slow.
func skipUnderShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: skipped under -short")
	}
}

// moduleRoot returns the directory of the module's go.mod: the daemon's
// package, whose binary the tests build, and the root of the paths the
// tests read (clients/python). The tests run in e2e/; they find it by
// walking up, so that they do not hang on where e2e/ is.
func moduleRoot(t testing.TB) string {
	t.Helper()
	root, err := findModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

var findModuleRoot = sync.OnceValues(func() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod in the test's directory or any directory above it")
		}
		dir = parent
	}
})

// exitDeadline bounds how long a daemon may take to exit once told to. The
// peer queues' default drain time is 1.5 s and the servers' grace 0.5 s, so
// a daemon that takes longer has not shut down promptly (the tight bound is
// TestProcessExitsWithinThePAIRStopGraceWhateverItsPeersAndBrokerDo's).
const exitDeadline = 5 * time.Second

var (
	binOnce sync.Once
	binDir  string // removed by TestMain
	binPath string
	binErr  error
)

// daemonBinary builds the daemon once per test run and returns its path.
// It skips the test under -short.
func daemonBinary(t testing.TB) string {
	t.Helper()
	skipUnderShort(t)
	root := moduleRoot(t)
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "nvpair-wm-bin-"); binErr != nil {
			return
		}
		out := filepath.Join(binDir, "nvpair-workload-manager")
		if runtime.GOOS == "windows" {
			out += ".exe"
		}
		build := exec.Command(goToolPath(), "build", "-o", out, ".")
		build.Dir = root
		if b, err := build.CombinedOutput(); err != nil {
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
	t                testing.TB
	cmd              *exec.Cmd
	port             int                // --port, when startNode chose it
	stdin            *os.File           // our end of the daemon's stdin
	stdout           *os.File           // our end of the daemon's stdout
	stderr           *testkit.LogBuffer // the daemon's log
	testkit.FrameLog                    // what it wrote to stdout

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
	d := &daemonProc{t: t, stdin: inW, stdout: outR, stderr: &testkit.LogBuffer{}, FrameLog: testkit.FrameLog{T: t},
		readDone: make(chan struct{}), exited: make(chan struct{})}
	d.LineMax.Store(int64(brokerLineMaxArg(args))) // 0 without the flag: PAIR's limit
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
	go func() { defer close(d.readDone); d.Record(out) }()
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

func (d *daemonProc) closeStdin() { d.stdin.Close() }

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
	if err := json.Unmarshal(d.WaitMethod("ready", 1)[0].Params, &p); err != nil {
		d.t.Fatal(err)
	}
	return p.NodeID
}

// waitLog waits for a log line holding every fragment.
func (d *daemonProc) waitLog(fragments ...string) {
	d.t.Helper()
	testkit.Eventually(d.t, fmt.Sprintf("a log line with %q", fragments), func() bool { return d.stderr.Contains(fragments...) })
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
	a.WaitMethod("discovery:subscribe", 1) // bound and listening
	b.WaitMethod("discovery:subscribe", 1)
	a.discover(nb, b.port)
	b.discover(na, a.port)
	a.waitLog("broadcast targets changed", "total=1")
	b.waitLog("broadcast targets changed", "total=1")
	return a, b
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
	testkit.Eventually(d.t, fmt.Sprintf("a %q log line with %s", msg, key), func() bool {
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

// brokerLineMaxArg is the --broker-line-max a daemon's arguments give, 0
// when they give none.
func brokerLineMaxArg(args []string) int {
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--broker-line-max=")
		if !ok && a == "--broker-line-max" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// runBinary runs the daemon with args and no stdin (EOF at once) and returns
// its exit code (-1 when it did not exit by itself within the deadline),
// stdout and stderr.
func runBinary(t testing.TB, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runBinaryEnv(t, nil, args...)
}

// runBinaryEnv is runBinary with env added to the daemon's environment.
func runBinaryEnv(t testing.TB, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	bin := daemonBinary(t) // before the clock starts: the first call builds
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("run %v: %v", args, err)
		}
	}
	st := cmd.ProcessState
	if !st.Exited() {
		return -1, out.String(), errb.String()
	}
	return st.ExitCode(), out.String(), errb.String()
}

// listenT holds a TCP listener on addr for the test and returns its address.
func listenT(t testing.TB, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

func portOf(t testing.TB, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return port
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
