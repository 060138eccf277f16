package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestBadStartupIsOneLineOnStderrAndNonZeroExit(t *testing.T) {
	takenIngress := listenT(t, "127.0.0.1:0")
	takenPeer := listenT(t, ":0") // the daemon binds --port on every interface
	badID := t.TempDir()
	writeFile(t, filepath.Join(badID, "node-id"), "not-a-uuid\n")

	for _, tc := range []struct {
		name string
		args []string
		want []string // the one line names what is wrong
	}{
		{"port negative", []string{"--port", "-1"}, []string{"--port -1"}},
		{"port too large", []string{"--port", "70000"}, []string{"--port 70000"}},
		{"port not a number", []string{"--port", "abc"}, []string{"port"}},
		{"resync interval zero", []string{"--resync-interval", "0"}, []string{"--resync-interval"}},
		{"resync interval not a duration", []string{"--resync-interval", "xyz"}, []string{"resync-interval"}},
		{"unknown log level", []string{"--log-level", "verbose"}, []string{"verbose"}},
		{"drain timeout zero", []string{"--drain-timeout", "0"}, []string{"--drain-timeout"}},
		{"broker line max not a number", []string{"--broker-line-max", "abc"}, []string{`--broker-line-max "abc"`, "4096", "16777216"}},
		{"broker line max too small", []string{"--broker-line-max", "100"}, []string{"--broker-line-max 100", "between 4096 and 16777216 bytes"}},
		{"broker line max negative", []string{"--broker-line-max", "-1"}, []string{"--broker-line-max -1", "between 4096 and 16777216 bytes"}},
		{"broker line max too large", []string{"--broker-line-max", "16777217"}, []string{"--broker-line-max 16777217", "between 4096 and 16777216 bytes"}},
		{"unknown flag", []string{"--bogus"}, []string{"bogus"}},
		{"stray argument", []string{"stray"}, []string{`"stray"`}},
		{"ingress on every interface", []string{"--local-ingress", "0.0.0.0:14324"}, []string{"0.0.0.0:14324", "loopback"}},
		{"ingress on a LAN address", []string{"--local-ingress", "192.168.1.10:1"}, []string{"192.168.1.10:1", "loopback"}},
		{"ingress not host:port", []string{"--local-ingress", "nonsense"}, []string{"nonsense"}},
		{"ingress port taken", []string{"--local-ingress", takenIngress}, []string{takenIngress}},
		{"peer port taken", []string{"--port", portOf(t, takenPeer)}, []string{":" + portOf(t, takenPeer)}},
		{"node id not a UUID", []string{"--app-dir", badID}, []string{"not a UUID"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A fresh app dir and a free port first, so a case that wrongly
			// starts touches nothing outside the test; the case's own flags
			// come after and win.
			args := append([]string{"--app-dir", t.TempDir(), "--port", itoa(freePort(t))}, tc.args...)
			code, stdout, stderr := runBinary(t, args...)
			if code == 0 {
				t.Fatalf("exit 0 for %v; stderr:\n%s", tc.args, stderr)
			}
			if code < 0 {
				t.Fatalf("the daemon did not exit by itself for %v; stderr:\n%s", tc.args, stderr)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") ||
				!strings.HasPrefix(stderr, "nvpair-workload-manager: ") {
				t.Fatalf("stderr for %v is not one line starting %q:\n%s", tc.args, "nvpair-workload-manager: ", stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Fatalf("stderr %q does not name %q", stderr, w)
				}
			}
			if stdout != "" {
				t.Fatalf("stdout = %q, want nothing: it carries only frames", stdout)
			}
		})
	}
}

func TestVersionFlagPrintsVersionAndExitsZero(t *testing.T) {
	code, stdout, stderr := runBinary(t, "--version")
	if code != 0 || stdout != version+"\n" || stderr != "" {
		t.Fatalf("--version: exit %d, stdout %q, stderr %q; want 0, %q, nothing", code, stdout, stderr, version+"\n")
	}
}

func TestHelpFlagExitsZeroWithUsage(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		code, stdout, stderr := runBinary(t, arg)
		if code != 0 || stdout != "" || !strings.HasPrefix(stderr, "usage: nvpair-workload-manager") {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want 0 and the usage on stderr", arg, code, stdout, stderr)
		}
	}
}

func TestParseFlagsDerivesDirectories(t *testing.T) {
	base := t.TempDir()
	cluster := filepath.Join(base, "cluster")
	other := filepath.Join(t.TempDir(), "elsewhere")
	for _, tc := range []struct {
		name                 string
		args                 []string
		wantApp, wantCluster string
	}{
		{"app dir is the parent of the cluster dir", []string{"--cluster-dir", cluster}, base, cluster},
		{"trailing separator on the cluster dir", []string{"--cluster-dir", cluster + string(filepath.Separator)}, base, cluster + string(filepath.Separator)},
		{"cluster dir defaults under the app dir", []string{"--app-dir", base}, base, cluster},
		{"both given are kept", []string{"--app-dir", base, "--cluster-dir", other}, base, other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if o.appDir != tc.wantApp || o.clusterDir != tc.wantCluster {
				t.Fatalf("app dir %q, cluster dir %q; want %q, %q", o.appDir, o.clusterDir, tc.wantApp, tc.wantCluster)
			}
		})
	}
}

func TestParseFlagsDefaultsToUserConfigDir(t *testing.T) {
	cfg := t.TempDir()
	switch runtime.GOOS {
	case "windows":
		t.Setenv("AppData", cfg)
	case "darwin", "ios", "plan9":
		t.Setenv("HOME", cfg)
	default:
		t.Setenv("XDG_CONFIG_HOME", cfg)
	}
	want, err := os.UserConfigDir()
	if err != nil {
		t.Skip("no user config directory here:", err)
	}
	want = filepath.Join(want, "nvpair")
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.appDir != want || o.clusterDir != filepath.Join(want, "cluster") {
		t.Fatalf("app dir %q, cluster dir %q; want %q and its cluster subdir", o.appDir, o.clusterDir, want)
	}
	if o.port != 14320 || o.resyncInterval != 30*time.Second || o.logLevel != slog.LevelInfo ||
		o.drainTimeout != defaultDrainTimeout || o.brokerLineMax != 262144 || o.ipc != "" || o.localIngress != "" || o.showVersion {
		t.Fatalf("defaults = %+v, want port 14320, re-sync 30s, level info, drain %v, broker lines up to 256 KiB, no ipc, no ingress", o, defaultDrainTimeout)
	}
}

func TestParseFlagsAcceptsBoundaryValues(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		check func(options) bool
	}{
		{[]string{"--port", "0"}, func(o options) bool { return o.port == 0 }},
		{[]string{"--port", "65535"}, func(o options) bool { return o.port == 65535 }},
		{[]string{"--resync-interval", "100ms"}, func(o options) bool { return o.resyncInterval == 100*time.Millisecond }},
		{[]string{"--drain-timeout", "1ns"}, func(o options) bool { return o.drainTimeout == time.Nanosecond }},
		{[]string{"--broker-line-max", "4096"}, func(o options) bool { return o.brokerLineMax == 4096 }},
		{[]string{"--broker-line-max", "16777216"}, func(o options) bool { return o.brokerLineMax == 16777216 }},
		{[]string{"--log-level", "debug"}, func(o options) bool { return o.logLevel == slog.LevelDebug }},
		{[]string{"--log-level", "error"}, func(o options) bool { return o.logLevel == slog.LevelError }},
		{[]string{"--local-ingress", "127.0.0.1:14324"}, func(o options) bool { return o.localIngress == "127.0.0.1:14324" }},
	} {
		args := append([]string{"--app-dir", t.TempDir()}, tc.args...)
		o, err := parseFlags(args)
		if err != nil || !tc.check(o) {
			t.Errorf("parseFlags(%v) = %+v, %v", tc.args, o, err)
		}
	}
}

// runBinary runs the daemon with args and no stdin (EOF at once) and returns
// its exit code (-1 when it did not exit by itself within the deadline),
// stdout and stderr.
func runBinary(t testing.TB, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	bin := daemonBinary(t) // before the clock starts: the first call builds
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
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
