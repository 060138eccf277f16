package e2e

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/pairinstall"
)

// A second daemon on the same app dir (here through --cluster-dir, as PAIR
// starts it) is refused with one line naming the first one's pid, as the
// kernel names the lock's holder (never the pid the file holds, which an
// exited daemon may have written), and exit status 3, and the first one
// keeps running and answering.
func TestASecondDaemonOnTheSameAppDirIsRefusedNamingTheFirstsPid(t *testing.T) {
	app := t.TempDir()
	cluster := filepath.Join(app, "cluster")
	first := startDaemon(t, "--cluster-dir", cluster, "--port", "0")
	id := first.readyNodeID()
	lock := filepath.Join(app, pairinstall.LockFileName)
	const stale = "4242424"
	if err := os.WriteFile(lock, []byte(stale+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := runBinary(t, "--cluster-dir", cluster, "--port", "0")
	if code != exitAnotherInstance {
		t.Fatalf("second daemon exit status %d, want %d; stderr:\n%s", code, exitAnotherInstance, stderr)
	}
	pid := "pid " + strconv.Itoa(first.cmd.Process.Pid)
	if runtime.GOOS != "linux" {
		pid = "a process holds" // only Linux names a flock's holder
	}
	if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, pid) || !strings.Contains(stderr, lock) || strings.Contains(stderr, stale) {
		t.Fatalf("stderr is not one line naming %q and %s (and never the file's stale pid %s):\n%s", pid, lock, stale, stderr)
	}
	if stdout != "" {
		t.Fatalf("the refused daemon wrote to stdout: %q", stdout)
	}
	if first.exitedYet() {
		t.Fatalf("the first daemon exited; its log:\n%s", first.stderr.String())
	}
	first.send(`{"jsonrpc":"2.0","id":7,"method":"nosuch"}`)
	first.WaitResponse("7")
	first.send(`{"jsonrpc":"2.0","id":8,"method":"shutdown"}`)
	first.wantCleanExit(first.waitExit(testkit.WaitTimeout))
	if b, err := os.ReadFile(filepath.Join(app, nodeIDFileName)); err != nil || !strings.Contains(string(b), id) {
		t.Fatalf("node-id.json after the refusal: %q, %v; want the first daemon's %s", b, err, id)
	}
}

// A daemon killed with SIGKILL leaves its lock file behind, and the next
// start is not blocked by it: the lock is the operating system's, and it
// died with the process.
func TestAKilledDaemonsLockDoesNotBlockTheNextStart(t *testing.T) {
	app := t.TempDir()
	first := startDaemon(t, "--app-dir", app, "--port", "0")
	id := first.readyNodeID()
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	first.waitExit(testkit.WaitTimeout)
	if _, err := os.Stat(filepath.Join(app, pairinstall.LockFileName)); err != nil {
		t.Fatalf("the killed daemon's lock file: %v (the test wants it left behind)", err)
	}
	next := startDaemon(t, "--app-dir", app, "--port", "0")
	if got := next.readyNodeID(); got != id {
		t.Fatalf("next start's node id %s, want %s", got, id)
	}
}
