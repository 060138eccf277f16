package cliflags

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestEveryCommandsHelpIsClean builds the module's commands (the daemon
// at the root, cmd/devcluster, cmd/release, cmd/wlmbench, cmd/wlmjournal)
// and runs each with -h and --help, as a newcomer's first command: each
// prints its usage with its flags' defaults and exits 0 or 2 (what the
// flag package does for -h), and never prints "panic" (PrintDefaults'
// "panic calling String method on zero" of the type Explain wrapped them
// in, printed
// under every flag while Explain wrapped the flags' values, exit 0 all the
// same). It runs the
// binaries, not parseFlags, because the daemon's flags are defined in the
// root's main package, which a test outside it cannot call.
func TestEveryCommandsHelpIsClean(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	gomod, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	// One go build for them all: they share its cache and its work.
	bin := t.TempDir()
	build := exec.Command(goBin, "build", "-o", bin+string(filepath.Separator), ".", "./cmd/devcluster", "./cmd/release", "./cmd/wlmbench", "./cmd/wlmjournal")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, c := range []struct {
		name string
		want []string // in the usage: what a broken help lost
	}{
		{"nvpair-workload-manager", []string{"usage: nvpair-workload-manager", "--port N", "(default 14320)"}},
		{"devcluster", []string{"usage: devcluster", "-nodes int", "(default 3)", "-resync-interval duration", "(default 2s)"}},
		{"release", []string{"usage: go run ./cmd/release", "-out string", `(default "dist")`}},
		{"wlmbench", []string{"Usage of wlmbench", "-c int", "(default 32)"}},
		{"wlmjournal", []string{"usage: wlmjournal", "-max-record-bytes int", "(default 2097152)"}},
	} {
		for _, arg := range []string{"-h", "--help"} {
			exe := filepath.Join(bin, c.name)
			if runtime.GOOS == "windows" {
				exe += ".exe"
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			cmd := exec.CommandContext(ctx, exe, arg)
			cmd.Stdin = nil // the daemon's broker channel: empty, not this test's stdin
			out, err := cmd.CombinedOutput()
			cancel()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Errorf("%s %s: %v", c.name, arg, err)
				continue
			}
			text := string(out)
			if code != 0 && code != 2 {
				t.Errorf("%s %s: exit %d, want 0 or 2 (as the flag package exits on -h)\n%s", c.name, arg, code, text)
			}
			if strings.Contains(strings.ToLower(text), "panic") {
				t.Errorf("%s %s prints a panic:\n%s", c.name, arg, text)
			}
			for _, w := range c.want {
				if !strings.Contains(text, w) {
					t.Errorf("%s %s: the usage lacks %q:\n%s", c.name, arg, w, text)
				}
			}
		}
	}
}
