//go:build unix

package installtest

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitTimeout bounds every wait on a condition: long enough for a loaded
// CI machine, short enough that a broken install fails the run, not hangs it.
const waitTimeout = 60 * time.Second

// built holds the programs TestMain builds once for every test.
var built struct {
	stock, next, bad, supervisor string
}

const (
	stockVersion = "stock-for-install-test"
	nextVersion  = "next-for-install-test"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "installtest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		flag.Parse() // for testing.Short
		// Under -short every test that needs the builds skips (newNode), so
		// none is made: the quick lane builds no daemon.
		if testing.Short() {
			return m.Run()
		}
		if err := buildAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// buildAll builds the daemon as a stock and as a next version, a new
// executable that runs --version but exits at once when started as a
// worker (a build for the wrong node, a missing library), and the
// stand-in supervisor.
func buildAll(dir string) error {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		return err
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	build := func(out string, args ...string) error {
		cmd := exec.Command(goTool, append([]string{"build", "-o", out}, args...)...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", out, err, b)
		}
		return nil
	}
	built.stock = filepath.Join(dir, "stock")
	built.next = filepath.Join(dir, "next")
	built.supervisor = filepath.Join(dir, "pairsupervisor")
	built.bad = filepath.Join(dir, "bad")
	if err := build(built.stock, "-ldflags", "-X main.Version="+stockVersion, "."); err != nil {
		return err
	}
	if err := build(built.next, "-ldflags", "-X main.Version="+nextVersion, "."); err != nil {
		return err
	}
	if err := build(built.supervisor, "./internal/dev/pairsupervisor"); err != nil {
		return err
	}
	bad := "#!/bin/sh\ncase $1 in --version) echo bad-build; exit 0;; esac\necho 'bad build: exits at start' >&2\nexit 1\n"
	return os.WriteFile(built.bad, []byte(bad), 0o755)
}

// node is a PAIR-shaped installation under a temporary home: the app dir
// in ~/.config, the worker's executable in a folder of its own (PAIR's
// install dir), and the stand-in supervisor running it.
type node struct {
	t       *testing.T
	home    string
	appDir  string
	exe     string // the worker's executable, as the supervisor runs it
	lines   string // the broker lines the worker wrote
	log     string // the worker's stderr and the supervisor's starts and exits
	ingress string // the loopback address workload-ingress.json names
	sup     *exec.Cmd
	supIn   io.WriteCloser // the supervisor's stdin: it stops when this closes
}

func newNode(t *testing.T) *node {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: runs install.sh against the real daemon under a supervisor, seconds a test, after TestMain built it twice")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("curl is not installed (.ci/run installs it)")
		}
		t.Skip("curl is not installed")
	}
	dir := t.TempDir()
	n := &node{t: t, home: filepath.Join(dir, "home")}
	n.appDir = filepath.Join(n.home, ".config", "Nvidia Corporation", "NVIDIA PAIR")
	installDir := filepath.Join(dir, "opt", "NVIDIA PAIR", "bin")
	for _, d := range []string{n.appDir, installDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	n.exe = filepath.Join(installDir, "nvpair-workload-manager")
	copyFile(t, built.stock, n.exe)
	n.lines = filepath.Join(dir, "broker-lines")
	n.log = filepath.Join(dir, "worker.log")
	n.ingress = freeLoopbackAddr(t)
	// The broker's two arguments, and --port 0 so that tests running at
	// once do not share the peer port.
	args := filepath.Join(dir, "worker-args")
	writeFile(t, args, strings.Join([]string{"--port", "0", "--log-level", "info", "--cluster-dir", filepath.Join(n.appDir, "cluster")}, "\n")+"\n")
	n.sup = exec.Command(built.supervisor, "--exe", n.exe, "--args", args, "--lines", n.lines, "--log", n.log, "--restart-delay", "100ms", "--max-duration", "10m", "--watch-stdin")
	n.sup.Env = n.env()
	var err error
	if n.supIn, err = n.sup.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := n.sup.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.sup.Process.Signal(syscall.SIGTERM)
		n.sup.Wait()
		n.supIn.Close()
		if t.Failed() {
			t.Logf("worker log:\n%s", readFile(t, n.log))
			t.Logf("broker lines:\n%s", readFile(t, n.lines))
		}
	})
	n.waitReady(stockVersion, 1)
	return n
}

// env is the environment of everything run on the node: its home, and no
// XDG_CONFIG_HOME, so the app dir is ~/.config's.
func (n *node) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			env = append(env, kv)
		}
	}
	return append(env, "HOME="+n.home)
}

// waitReady waits until at least count workers of version have told the
// broker they are ready.
func (n *node) waitReady(version string, count int) {
	n.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for countReady(readFile(n.t, n.lines), version) < count {
		if time.Now().After(deadline) {
			n.t.Fatalf("no %d workers of version %s were ready within %s", count, version, waitTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// countReady counts the ready lines of version among the broker lines.
func countReady(lines, version string) int {
	c := 0
	for _, l := range strings.Split(lines, "\n") {
		if strings.Contains(l, `"method":"ready"`) && strings.Contains(l, `"version":"`+version+`"`) {
			c++
		}
	}
	return c
}

// script runs scripts/install.sh with args and returns what it printed and
// its exit status.
func (n *node) script(args ...string) (string, int) {
	n.t.Helper()
	cmd := exec.Command("sh", append([]string{filepath.Join("..", "..", "..", "scripts", "install.sh")}, args...)...)
	cmd.Env = n.env()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(3 * waitTimeout):
		cmd.Process.Kill()
		<-done
		n.t.Fatalf("install.sh %q did not finish within %s:\n%s", args, 3*waitTimeout, out.String())
	}
	n.t.Logf("install.sh %s:\n%s", strings.Join(args, " "), out.String())
	return out.String(), cmd.ProcessState.ExitCode()
}

// is says which build the worker's executable file now is.
func (n *node) is(want string) bool {
	return bytes.Equal(readFileBytes(n.t, n.exe), readFileBytes(n.t, want))
}

func TestInstallChecksTheNewExecutableAndKeepsTheStockOne(t *testing.T) {
	n := newNode(t)
	// The cluster manager's identity.json names another id than
	// node-id.json: the daemon announces identity.json's, so the check
	// must post that one, or the ingress refuses the frame.
	clusterID := "0a1b2c3d-0000-4000-8000-00000000c1d0"
	writeFile(t, filepath.Join(n.appDir, "cluster", "identity.json"), `{"node_uuid":"`+clusterID+`","created_at":1700000000000}`+"\n")
	out, code := n.script("install", built.next, "--listen", n.ingress, "--timeout", "60")
	if code != 0 {
		t.Fatalf("install exited %d, want 0:\n%s", code, out)
	}
	if !n.is(built.next) {
		t.Fatal("the worker's executable is not the new one after install")
	}
	if !bytes.Equal(readFileBytes(t, n.exe+".stock"), readFileBytes(t, built.stock)) {
		t.Fatal("the stock executable was not kept beside the worker's as .stock")
	}
	if countReady(readFile(t, n.lines), nextVersion) < 1 {
		t.Fatal("the new version never told the broker it is ready, yet install passed")
	}
	// The check job was opened and closed, naming identity.json's id: the
	// broker saw both frames.
	lines := readFile(t, n.lines)
	var opened, closed bool
	for _, l := range strings.Split(lines, "\n") {
		if !strings.Contains(l, `"requesterId":"install-check"`) {
			continue
		}
		if !strings.Contains(l, `"originatedFrom":"`+clusterID+`"`) {
			t.Errorf("a check frame does not name the node's id %s from identity.json: %s", clusterID, l)
		}
		opened = opened || strings.Contains(l, `"state":"running"`)
		closed = closed || strings.Contains(l, `"state":"completed"`)
	}
	if !opened || !closed {
		t.Fatalf("the broker saw the check job opened=%v closed=%v, want both:\n%s", opened, closed, lines)
	}
	if got := readFile(t, filepath.Join(n.appDir, "workload-ingress.json")); !strings.Contains(got, n.ingress) {
		t.Fatalf("workload-ingress.json = %q, want the --listen address %s", got, n.ingress)
	}

	// A second install (the next release) keeps the stock backup: it is
	// never overwritten with a build of ours.
	out, code = n.script("install", built.next, "--timeout", "60")
	if code != 0 {
		t.Fatalf("the second install exited %d, want 0:\n%s", code, out)
	}
	if !bytes.Equal(readFileBytes(t, n.exe+".stock"), readFileBytes(t, built.stock)) {
		t.Fatal("the second install overwrote the stock backup")
	}
	// check alone passes too.
	if out, code := n.script("check"); code != 0 {
		t.Fatalf("check exited %d, want 0:\n%s", code, out)
	}
}

func TestInstallRollsBackWhenTheNewExecutableFailsItsCheck(t *testing.T) {
	n := newNode(t)
	out, code := n.script("install", built.bad, "--listen", n.ingress, "--timeout", "5")
	if code != 1 {
		t.Fatalf("install of a build that exits at start exited %d, want 1:\n%s", code, out)
	}
	if !strings.Contains(out, "rolling back") || !strings.Contains(out, "rolled back") {
		t.Fatalf("install did not say it rolled back:\n%s", out)
	}
	if !n.is(built.stock) {
		t.Fatal("the worker's executable is not the stock one after a failed install")
	}
	// The stock build runs again: a second stock worker told the broker
	// it is ready.
	n.waitReady(stockVersion, 2)
}

func TestCheckFailsWhenTheIngressRefusesItsFrame(t *testing.T) {
	n := newNode(t)
	out, code := n.script("install", built.next, "--listen", n.ingress, "--timeout", "5")
	if code != 0 {
		t.Fatalf("install exited %d, want 0:\n%s", code, out)
	}
	// Now make the ingress refuse the check's frame: node-id.json names
	// another node than the one the running daemon announces.
	writeFile(t, filepath.Join(n.appDir, "node-id.json"), `{"node_uuid":"0a1b2c3d-0000-4000-8000-0000000000ff","created_at":1700000000000}`+"\n")
	out, code = n.script("check", "--timeout", "5")
	if code == 0 {
		t.Fatalf("check passed although the ingress refuses its frame:\n%s", out)
	}
	if !strings.Contains(out, "refused the check") || !strings.Contains(out, "not this node") {
		t.Fatalf("check did not show the ingress's refusal:\n%s", out)
	}
}

func TestRollbackPutsTheStockExecutableBack(t *testing.T) {
	n := newNode(t)
	if out, code := n.script("install", built.next, "--listen", n.ingress, "--timeout", "60"); code != 0 {
		t.Fatalf("install exited %d, want 0:\n%s", code, out)
	}
	out, code := n.script("rollback", "--timeout", "60")
	if code != 0 {
		t.Fatalf("rollback exited %d, want 0:\n%s", code, out)
	}
	if !n.is(built.stock) {
		t.Fatal("the worker's executable is not the stock one after rollback")
	}
	n.waitReady(stockVersion, 2)
}

func TestInstallRefusesWithoutARunningWorker(t *testing.T) {
	n := newNode(t)
	// Another app dir, where no worker runs: nothing is touched.
	other := filepath.Join(n.home, "elsewhere")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	out, code := n.script("install", built.next, "--app-dir", other)
	if code == 0 || !strings.Contains(out, "no running worker") {
		t.Fatalf("install without a worker exited %d, want an error naming it:\n%s", code, out)
	}
	if !n.is(built.stock) {
		t.Fatal("install without a worker replaced the executable")
	}
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b := readFileBytes(t, from)
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readFileBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// TestInstallScriptPassesShellcheck holds scripts/install.sh to POSIX sh as
// shellcheck reads it: the script runs on macOS's sh and on dash, where a
// bashism fails only on the operator's node.
func TestInstallScriptPassesShellcheck(t *testing.T) {
	sc, err := exec.LookPath("shellcheck")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("shellcheck is not installed (.ci/run installs it)")
		}
		t.Skip("shellcheck is not installed")
	}
	out, err := exec.Command(sc, "--shell=sh", "--severity=style", filepath.Join("..", "..", "..", "scripts", "install.sh")).CombinedOutput()
	if err != nil {
		t.Fatalf("shellcheck scripts/install.sh: %v\n%s", err, out)
	}
}

func TestCheckFailsWhenNoFileNamesTheNode(t *testing.T) {
	n := newNode(t)
	if out, code := n.script("install", built.next, "--listen", n.ingress, "--timeout", "60"); code != 0 {
		t.Fatalf("install exited %d, want 0:\n%s", code, out)
	}
	// The running daemon knows its id, but no file names it any more: a
	// check that posted without an id would pass on the ingress's stamp
	// and prove nothing about the id producers read.
	if err := os.Remove(filepath.Join(n.appDir, "node-id.json")); err != nil {
		t.Fatal(err)
	}
	out, code := n.script("check", "--timeout", "5")
	if code == 0 || !strings.Contains(out, "no node id yet") {
		t.Fatalf("check without a node id file exited %d, want a failure naming it:\n%s", code, out)
	}
}
