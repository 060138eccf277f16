//go:build unix

package installtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// startImpostor runs a process of this user that passes the node's
// --cluster-dir as PAIR's broker passes it to the worker, but is a shell
// loop, not the workload manager. The shell is a private copy of the
// system's, so the impostor's executable is the test's own file: a script
// that wrongly took the impostor for the worker (as install.sh once did)
// replaces that copy, never the machine's /bin/sh, whatever user the
// tests run as. It is killed at cleanup.
func startImpostor(t *testing.T, n *node) (cmd *exec.Cmd, exe string) {
	t.Helper()
	shell, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(t.TempDir(), "impostor-sh")
	copyFile(t, shell, own)
	if err := os.Chmod(own, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(own, "-c", "while :; do sleep 1; done", "impostor",
		"--port", "0", "--log-level", "info", "--cluster-dir", filepath.Join(n.appDir, "cluster"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, own
}

// alive reports whether the impostor still runs: the script never signals it.
func alive(cmd *exec.Cmd) bool { return cmd.Process.Signal(syscall.Signal(0)) == nil }

// With PAIR's worker stopped and a stand-in passing its --cluster-dir,
// install changes nothing and says why in one line: the stand-in's
// executable is not saved as the stock one, nothing is replaced or
// recorded for a rollback, and the stand-in is not signalled.
func TestInstallRefusesAnImpostorWorkerAndChangesNothing(t *testing.T) {
	n := newNode(t)
	n.sup.Process.Signal(syscall.SIGTERM)
	n.sup.Wait() // the supervisor waits for its worker to exit first
	imp, impExe := startImpostor(t, n)
	impBytes := readFileBytes(t, impExe)
	out, code := n.script("install", built.next, "--timeout", "5")
	if code != 1 || strings.Count(out, "\n") != 1 || !strings.Contains(out, "is not PAIR's workload manager") ||
		!strings.Contains(out, "nothing changed") || strings.Contains(out, "no running worker") {
		t.Fatalf("install with an impostor exited %d, want 1 and one line saying why and that nothing changed:\n%s", code, out)
	}
	if !n.is(built.stock) {
		t.Error("the worker's executable was replaced")
	}
	for _, p := range []string{n.exe + ".stock", filepath.Join(n.appDir, "nvpair-workload-manager.installed-at")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after the refusal (%v)", p, err)
		}
	}
	if !alive(imp) {
		t.Error("the impostor was signalled")
	}
	if !bytes.Equal(readFileBytes(t, impExe), impBytes) {
		t.Error("the impostor's executable was replaced")
	}
	out, code = n.script("rollback", "--timeout", "5")
	if code == 0 || !n.is(built.stock) || !alive(imp) {
		t.Errorf("rollback with an impostor exited %d; want a refusal that touches nothing:\n%s", code, out)
	}
}

// With PAIR's worker and a stand-in both passing the --cluster-dir, install
// acts on the worker it can prove is PAIR's workload manager and leaves the
// stand-in alone; it no longer adds that no worker runs.
func TestInstallBesideAnImpostorActsOnlyOnThePAIRWorker(t *testing.T) {
	n := newNode(t)
	imp, _ := startImpostor(t, n)
	out, code := n.script("install", built.next, "--listen", n.ingress, "--timeout", "60")
	if code != 0 || strings.Contains(out, "no running worker") {
		t.Fatalf("install beside an impostor exited %d, want 0:\n%s", code, out)
	}
	if !n.is(built.next) {
		t.Error("the worker's executable is not the new one")
	}
	if !alive(imp) {
		t.Error("the impostor was signalled")
	}
	if got := readFile(t, filepath.Join(n.appDir, "nvpair-workload-manager.installed-at")); strings.TrimSpace(got) != n.exe {
		t.Errorf("installed-at names %q, want the worker's executable %s", got, n.exe)
	}
}
