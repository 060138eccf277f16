package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/pairinstall"
)

// An app dir on a read-only file system, where node-id.json and the lock
// file already exist, is refused at the start with one line naming the app
// dir and what to do, exit 1, and nothing in it changes (spec 3.4.1, 7).
// The read-only mount is made for the daemon alone, in a user and mount
// namespace of its own (unshare), so the test needs no privilege; where
// that is not possible it falls back to an app dir this user cannot write
// (not as root, whom modes do not stop), and says so when it can do
// neither.
func TestAReadOnlyAppDirIsRefusedWithOneLineAndExit1(t *testing.T) {
	app := t.TempDir()
	idDoc := []byte(`{"node_uuid":"6f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0","created_at":1767225600000}` + "\n")
	lockFile := filepath.Join(app, pairinstall.LockFileName)
	if err := os.WriteFile(filepath.Join(app, nodeIDFileName), idDoc, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lockFile, []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := daemonBinary(t)
	args := []string{"--app-dir", app, "--port", "0"}
	var cmd *exec.Cmd
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	defer cancel()
	switch {
	case exec.Command("unshare", "-rm", "true").Run() == nil:
		script := `mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && shift && exec "$@"`
		cmd = exec.CommandContext(ctx, "unshare", append([]string{"-rm", "sh", "-c", script, "sh", app, bin}, args...)...)
	case os.Geteuid() != 0:
		for _, p := range []string{lockFile, filepath.Join(app, nodeIDFileName)} {
			if err := os.Chmod(p, 0o400); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(app, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(app, 0o700) })
		cmd = exec.CommandContext(ctx, bin, args...)
	default:
		t.Skip("no read-only app dir to be had: unshare -rm fails, and modes do not stop root")
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("run the daemon: %v", err)
	}
	code := cmd.ProcessState.ExitCode()
	line := stderr.String()
	if code != 1 || strings.Count(line, "\n") != 1 || !strings.Contains(line, "app dir "+app+" is read-only") || !strings.Contains(line, "make it writable") {
		t.Fatalf("exit %d, stderr %q; want exit 1 and one line naming the read-only app dir and what to do", code, line)
	}
	if stdout.Len() != 0 {
		t.Errorf("the refused daemon wrote to stdout: %q", stdout.String())
	}
	if b, err := os.ReadFile(filepath.Join(app, nodeIDFileName)); err != nil || !bytes.Equal(b, idDoc) {
		t.Errorf("node-id.json after the refusal: %q, %v", b, err)
	}
	if b, err := os.ReadFile(lockFile); err != nil || string(b) != "1\n" {
		t.Errorf("the lock file after the refusal: %q, %v", b, err)
	}
}
