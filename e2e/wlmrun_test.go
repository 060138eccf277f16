//go:build unix

package e2e

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testkit"
)

// `nvpair-wlm run -- CMD` (issue 38) against the real daemon: two members,
// A with the ingress and B its pinned peer, each judged by what PAIR's
// store fed its stdout shows (FrameLog.JobsList). The command's stdio and
// exit status pass through unchanged; its end decides the job's; a
// wrapper killed with kill -9 leaves a job its lease retires; a down
// ingress delays nothing and the states arrive once it is back.

// wlmRun is one nvpair-wlm run process.
type wlmRun struct {
	cmd            *exec.Cmd
	stdout, stderr *testkit.LogBuffer
	done           chan struct{}
}

// startRun starts nvpair-wlm run against ingress with flags, running argv,
// its stdin from stdin (nil: none). It is killed at cleanup if it still
// runs.
func startRun(t *testing.T, ingress string, stdin io.Reader, flags []string, argv ...string) *wlmRun {
	t.Helper()
	args := append([]string{"run", "--addr", ingress, "--outbox-dir", filepath.Join(t.TempDir(), "outbox")}, flags...)
	args = append(append(args, "--"), argv...)
	r := &wlmRun{cmd: exec.Command(wlmBinary(t), args...), stdout: &testkit.LogBuffer{}, stderr: &testkit.LogBuffer{}, done: make(chan struct{})}
	r.cmd.Stdin, r.cmd.Stdout, r.cmd.Stderr = stdin, r.stdout, r.stderr
	r.cmd.Dir = t.TempDir()
	// A command the wrapper leaves behind (kill -9) holds the output pipes
	// open: Wait then returns this long after the wrapper itself ended.
	r.cmd.WaitDelay = time.Second
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			r.cmd.Process.Kill()
			<-r.done
		}
		if t.Failed() {
			t.Logf("nvpair-wlm %q: stdout %q, stderr %q", args, r.stdout.String(), r.stderr.String())
		}
	})
	return r
}

// wait waits for the wrapper to end and returns how it ended.
func (r *wlmRun) wait(t *testing.T) *os.ProcessState {
	t.Helper()
	select {
	case <-r.done:
		return r.cmd.ProcessState
	case <-time.After(2 * testkit.WaitTimeout):
		t.Fatal("nvpair-wlm run did not end")
		return nil
	}
}

// runID is the workload id of the only job the wrapper reported, read
// from A's broker frames.
func runID(t *testing.T, a *daemonProc) string {
	t.Helper()
	var id string
	testkit.Eventually(t, "the wrapper's job at A's broker", func() bool {
		for _, w := range a.Upserts() {
			if s, _ := w["id"].(string); strings.HasPrefix(s, "run-") {
				id = s
				return true
			}
		}
		return false
	})
	return id
}

// wantEnd waits until both members' Jobs lists show workload id of origin
// in state, with errText in its error, and A's broker got the job's
// states in the order given.
func wantEnd(t *testing.T, a, b *daemonProc, origin, id, state, errText string, order ...string) {
	t.Helper()
	for _, m := range []struct {
		name string
		d    *daemonProc
	}{{"A", a}, {"B", b}} {
		var rec map[string]any
		testkit.Eventually(t, fmt.Sprintf("%s's Jobs list to show %s %s", m.name, id, state), func() bool {
			r, ok := shownOf(m.d.JobsList(), origin, id)
			if ok {
				rec = infoOf(t, r)
			}
			return ok && r.State == state
		})
		if e, _ := rec["error"].(string); !strings.Contains(e, errText) {
			t.Errorf("%s shows %s's error %q, want it to say %q", m.name, id, e, errText)
		}
	}
	if got := upsertStates(a, id); len(order) > 0 && !slices.Equal(got, order) {
		t.Errorf("A's broker got %s's states %v, want %v", id, got, order)
	}
}

func TestRunACommandThatExits0IsCompletedAndItsStdioPassesThroughUnchanged(t *testing.T) {
	a, b, nodes, ingress := leaseProcPair(t)
	in := make([]byte, 64<<10)
	rand.Read(in)
	copy(in, "line\r\n\x00") // bytes a copy through a terminal or a text reader would change
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() { stdinW.Write(in); stdinW.Close() }()
	script := `cat; printf 'to stderr\000' >&2`
	wantErr := "to stderr\x00"
	if runtime.GOOS == "linux" {
		// The command reads the very pipe the wrapper was given, not a
		// copy of it through a pipe of the wrapper's own.
		var st syscall.Stat_t
		if err := syscall.Fstat(int(stdinR.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		script = `readlink /proc/$$/fd/0 >&2; ` + script
		wantErr = fmt.Sprintf("pipe:[%d]\n", st.Ino) + wantErr
	}
	r := startRun(t, ingress, stdinR, nil, "sh", "-c", script)
	stdinR.Close()
	if st := r.wait(t); !st.Exited() || st.ExitCode() != 0 {
		t.Fatalf("the wrapper ended %v, want exit status 0", st)
	}
	if !bytes.Equal([]byte(r.stdout.String()), in) {
		t.Errorf("stdout is %d bytes that differ from the %d sent to stdin", len(r.stdout.String()), len(in))
	}
	if r.stderr.String() != wantErr {
		t.Errorf("stderr %q, want %q exactly: the command's own, nothing of the wrapper's", r.stderr.String(), wantErr)
	}
	wantEnd(t, a, b, nodes[0].ID, runID(t, a), "completed", "", "queued", "running", "completed")
}

func TestRunACommandThatExits3FailsWithItsCodeAndTheWrapperExits3(t *testing.T) {
	a, b, nodes, ingress := leaseProcPair(t)
	r := startRun(t, ingress, nil, []string{"--model", "qwen3-8b", "--engine", "vllm"}, "sh", "-c", "exit 3")
	if st := r.wait(t); !st.Exited() || st.ExitCode() != 3 {
		t.Fatalf("the wrapper ended %v, want exit status 3", st)
	}
	id := runID(t, a)
	wantEnd(t, a, b, nodes[0].ID, id, "failed", "the command exited with status 3", "queued", "running", "failed")
	if w := a.Upserts()[len(a.Upserts())-1]; w["model"] != "qwen3-8b" || w["engine"] != "vllm" {
		t.Errorf("the job's model and engine: %v %v", w["model"], w["engine"])
	}
}

func TestRunACommandKilledByASignalFailsNamingItAndTheWrapperDiesOfItToo(t *testing.T) {
	a, b, nodes, ingress := leaseProcPair(t)
	r := startRun(t, ingress, nil, nil, "sh", "-c", "kill -KILL $$")
	st := r.wait(t)
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the wrapper ended %v, want killed by SIGKILL as its command was", st)
	}
	wantEnd(t, a, b, nodes[0].ID, runID(t, a), "failed", "the command was killed by SIGKILL (9)", "queued", "running", "failed")
}

func TestRunAWrapperSIGTERMedForwardsItAndTheJobIsCancelled(t *testing.T) {
	a, b, nodes, ingress := leaseProcPair(t)
	r := startRun(t, ingress, nil, nil, "sh", "-c", "echo ready; exec sleep 60")
	testkit.Eventually(t, "the command to run", func() bool { return r.stdout.String() == "ready\n" })
	id := runID(t, a)
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st := r.wait(t)
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("the wrapper ended %v, want killed by SIGTERM as its command was", st)
	}
	wantEnd(t, a, b, nodes[0].ID, id, "cancelled", "interrupted by SIGTERM (15); the command was killed by SIGTERM (15)", "queued", "running", "cancelled")
}

func TestRunAWrapperKilledWithKill9LeavesAJobItsLeaseRetires(t *testing.T) {
	a, b, nodes, ingress := leaseProcPair(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	r := startRun(t, ingress, nil, []string{"--lease", "5s"}, "sh", "-c", "echo $$ > "+pidFile+"; exec sleep 60")
	var child int
	testkit.Eventually(t, "the command's pid", func() bool {
		b, _ := os.ReadFile(pidFile)
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return child > 0
	})
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) }) // orphaned by the kill below
	id := runID(t, a)
	testkit.Eventually(t, "the job running at A", func() bool { return slices.Contains(upsertStates(a, id), "running") })
	killed := time.Now()
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r.wait(t)
	wantEnd(t, a, b, nodes[0].ID, id, "failed", "producer stopped reporting: lease of 5 s expired", "queued", "running", "failed")
	if d := time.Since(killed); d > 5*time.Second+testkit.WaitTimeout {
		t.Errorf("the lease retired the job %v after the wrapper died", d)
	}
}

func TestRunStartsTheCommandAtOnceWhenTheIngressIsDownAndReportsItOnceItIsBack(t *testing.T) {
	nodes := writeCluster(t, 2)
	a := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0")
	b := startNode(t, nodes[1])
	ingress := a.loggedValue("local ingress listening", "addr")
	aPort := a.port
	a.cmd.Process.Kill() // the node's daemon is down, its ingress with it
	a.waitExit(exitDeadline)

	dir := t.TempDir()
	started, goOn := filepath.Join(dir, "started"), filepath.Join(dir, "go")
	begun := time.Now()
	r := startRun(t, ingress, nil, nil, "sh", "-c", "touch "+started+"; while [ ! -e "+goOn+" ]; do sleep 0.05; done")
	testkit.Eventually(t, "the command to start while the ingress is down", func() bool { _, err := os.Stat(started); return err == nil })
	t.Logf("the command started %v after the wrapper, the ingress down", time.Since(begun).Round(time.Millisecond))
	testkit.Eventually(t, "one line on stderr saying the ingress does not answer", func() bool {
		return strings.Contains(r.stderr.String(), "does not answer")
	})

	// The daemon is back, on its ports, and meets B again.
	a2 := startDaemon(t, nodeArgs(nodes[0], aPort, "--local-ingress", ingress)...)
	a2.port = a2.boundPeerPort()
	a2.WaitMethod("discovery:subscribe", 1)
	b.WaitMethod("discovery:subscribe", 1)
	a2.discover(nodes[1], b.port)
	b.discover(nodes[0], a2.port)
	id := runID(t, a2)
	testkit.Eventually(t, "the job running at A once its ingress is back", func() bool {
		r, ok := shownOf(a2.JobsList(), nodes[0].ID, id)
		return ok && r.State == "running"
	})
	os.WriteFile(goOn, nil, 0o600)
	if st := r.wait(t); !st.Exited() || st.ExitCode() != 0 {
		t.Fatalf("the wrapper ended %v, want exit status 0", st)
	}
	wantEnd(t, a2, b, nodes[0].ID, id, "completed", "", "queued", "running", "completed")
	if lines := strings.Split(strings.TrimSpace(r.stderr.String()), "\n"); len(lines) != 1 {
		t.Errorf("stderr has %d lines, want the one saying the ingress was down: %q", len(lines), r.stderr.String())
	}
}

// TestRunAddsLittleToACommandsStart measures what the wrapper adds to a
// command's start: the median, over runs, of the time from exec to the
// command's first instruction with the wrapper, less the same without it
// (issue 38's target: under 20 ms). The command prints the clock when it
// starts.
func TestRunAddsLittleToACommandsStart(t *testing.T) {
	_, _, _, ingress := leaseProcPair(t)
	bin := wlmBinary(t)
	dateBin, err := exec.LookPath("date")
	if err != nil {
		t.Skip("no date command")
	}
	startDelay := func(wrapped bool) time.Duration {
		args := []string{dateBin, "+%s%N"}
		if wrapped {
			args = append([]string{bin, "run", "--addr", ingress, "--outbox-dir", t.TempDir(), "--"}, args...)
		}
		cmd := exec.Command(args[0], args[1:]...)
		begun := time.Now()
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return time.Unix(0, ns).Sub(begun)
	}
	const runs = 15
	median := func(wrapped bool) time.Duration {
		var ds []time.Duration
		for range runs {
			ds = append(ds, startDelay(wrapped))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[runs/2]
	}
	direct, wrapped := median(false), median(true)
	added := wrapped - direct
	t.Logf("a command starts %v after its exec directly, %v through nvpair-wlm run: %v added (median of %d)", direct, wrapped, added, runs)
	// The bound is loose: CI runs this beside a CPU burner, where every
	// exec is slower; the figure above is what the target is judged by.
	if added > 200*time.Millisecond {
		t.Errorf("nvpair-wlm run adds %v to a command's start", added)
	}
}
