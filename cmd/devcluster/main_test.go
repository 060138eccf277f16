package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseFlagsDefaultsAndRefusals(t *testing.T) {
	c, err := parseFlags(nil, &lockedBuffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.nodes != 3 || c.metrics || c.ingress != "127.0.0.1:14324" || c.resyncInterval != 2*time.Second || c.duration != 0 || c.simulate || c.keep || c.dir != "" || c.bin != "" {
		t.Errorf("defaults %+v", c)
	}
	for _, args := range [][]string{
		{"--nodes", "0"}, {"--nodes", "129"}, {"--duration", "-1s"}, {"--resync-interval", "10ms"},
		{"--ingress", "127.0.0.1"}, {"stray"}, {"--no-such-flag"},
	} {
		if _, err := parseFlags(args, &lockedBuffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

// The dev cluster runs past 16 nodes, up to maxNodes (issue 37: the scale
// benchmark's 128 members); one more is refused in one line naming the flag.
func TestParseFlagsAcceptsMoreThan16NodesUpTo128(t *testing.T) {
	for _, n := range []string{"17", "64", "128"} {
		c, err := parseFlags([]string{"--nodes", n}, &lockedBuffer{})
		if err != nil || fmt.Sprint(c.nodes) != n {
			t.Errorf("--nodes %s: %+v, %v", n, c.nodes, err)
		}
	}
	_, err := parseFlags([]string{"--nodes", "129"}, &lockedBuffer{})
	if err == nil || !strings.Contains(err.Error(), "--nodes 129") || !strings.Contains(err.Error(), "128") {
		t.Errorf("--nodes 129: %v, want a refusal naming --nodes and the bound 128", err)
	}
}

// Every flag with a bad value (of the wrong kind, out of range, or none)
// is one line naming the flag with two dashes, and exit status 2; the flag
// package's own "invalid value ... for flag -x" and its usage dump are not
// printed.
func TestRunRefusesABadFlagWithStatus2AndOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nodes", "0"}, "--nodes 0"},
		{[]string{"--nodes", "three"}, `--nodes: "three" is not a whole number`},
		{[]string{"--duration", "5"}, `--duration: "5" is not a duration`},
		{[]string{"--duration", "-1s"}, "--duration -1s"},
		{[]string{"--resync-interval", "10ms"}, "--resync-interval 10ms"},
		{[]string{"--resync-interval", "2"}, `--resync-interval: "2" is not a duration`},
		{[]string{"--ingress", "14324"}, "--ingress 14324"},
		{[]string{"--log-level", "verbose"}, `--log-level "verbose"`},
		{[]string{"--keep=maybe"}, `--keep: "maybe" is not true or false`},
		{[]string{"--simulate=2"}, `--simulate: "2" is not true or false`},
		{[]string{"--metrics=x"}, `--metrics: "x" is not true or false`},
		{[]string{"--dir"}, "--dir needs a value, like --dir DIR"},
		{[]string{"--bin"}, "--bin needs a value, like --bin PATH"},
		{[]string{"-nodes"}, "--nodes needs a value, like --nodes 3"},
		{[]string{"--bogus"}, "unknown flag --bogus (--help lists the flags)"},
		{[]string{"stray"}, `unexpected argument "stray"`},
	} {
		var stdout, stderr lockedBuffer
		if code := run(tc.args, &stdout, &stderr, nil, false, hooks{}); code != 2 {
			t.Errorf("%v: exit status %d, want 2", tc.args, code)
		}
		if got := stderr.String(); strings.Count(got, "\n") != 1 || !strings.HasPrefix(got, "devcluster: ") || !strings.Contains(got, tc.want) {
			t.Errorf("%v: stderr %q, want one line naming the flag: %q", tc.args, got, tc.want)
		}
	}
}

// TestHelpIsTheUsageWithEveryFlagsDefault: -h and --help print the usage
// with each flag's kind and default and exit 0, and no "panic calling
// String method on zero ..." line (what internal/cliflags' wrapped flags
// made PrintDefaults print under every flag). internal/cliflags'
// TestEveryCommandsHelpIsClean runs the built command the same way.
func TestHelpIsTheUsageWithEveryFlagsDefault(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		var stdout, stderr lockedBuffer
		if code := run([]string{arg}, &stdout, &stderr, nil, false, hooks{}); code != 0 {
			t.Errorf("%s: exit status %d, want 0", arg, code)
		}
		got := stderr.String()
		if strings.Contains(got, "panic") {
			t.Errorf("%s prints a panic:\n%s", arg, got)
		}
		for _, want := range []string{"usage: devcluster", "-nodes int", "(default 3)", "-stale-after duration", "-log-level string", `(default "info")`} {
			if !strings.Contains(got, want) {
				t.Errorf("%s: the usage lacks %q:\n%s", arg, want, got)
			}
		}
	}
}

func TestWorkDirIsRemovedUnlessKeptOrGiven(t *testing.T) {
	dir, cleanup, err := workDir(config{})
	if err != nil {
		t.Fatal(err)
	}
	cleanup()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("temporary %s survived the cleanup (%v)", dir, err)
	}

	dir, cleanup, err = workDir(config{keep: true})
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if msg := cleanup(); !strings.Contains(msg, dir) {
		t.Errorf("--keep cleanup said %q, want the kept directory", msg)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("--keep removed %s", dir)
	}

	given := filepath.Join(t.TempDir(), "dc")
	dir, cleanup, err = workDir(config{dir: given})
	if err != nil || dir != given {
		t.Fatalf("workDir(--dir %s) = %s, %v", given, dir, err)
	}
	cleanup()
	if _, err := os.Stat(given); err != nil {
		t.Errorf("a given --dir was removed")
	}
	os.WriteFile(filepath.Join(given, "x"), nil, 0o600)
	if _, _, err := workDir(config{dir: given}); err == nil {
		t.Error("a non-empty --dir was accepted")
	}
}

func TestModuleRootIsTheDaemonModule(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "main.go")); err != nil || !isDaemonModule(root) {
		t.Errorf("moduleRoot() = %s, not the daemon's module", root)
	}
}

func TestAwaitConvergenceEndsOnItsDeadlineOrASecondSignal(t *testing.T) {
	c := paperCluster(t, 2)
	c.nodes[0].broker.handle(upsertLine(info(c.nodes[0].id, "only-on-1", "running", 1)), nil, nil)

	start := time.Now()
	ok, why := awaitConvergence(c, 300*time.Millisecond, nil)
	if ok || !strings.Contains(why, "node2 differs") || !strings.Contains(why, "not converged within 300ms") {
		t.Errorf("diverged views: %v %q", ok, why)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Error("returned before its deadline")
	}

	sigs := make(chan os.Signal, 1)
	sigs <- os.Interrupt
	ok, why = awaitConvergence(c, time.Hour, sigs)
	if ok || !strings.Contains(why, "skipped") {
		t.Errorf("after a signal: %v %q, want a skipped wait", ok, why)
	}

	c.nodes[1].broker.handle(upsertLine(info(c.nodes[0].id, "only-on-1", "running", 1)), nil, nil)
	if ok, why := awaitConvergence(c, time.Hour, nil); !ok {
		t.Errorf("equal views not seen as converged: %s", why)
	}
}
