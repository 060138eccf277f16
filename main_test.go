package main

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testkit"
)

func TestBuildVersionPrefersTheStampedVersion(t *testing.T) {
	defer func(v string) { Version = v }(Version)
	Version = ""
	if got := buildVersion(); got == "" {
		t.Fatal("an unstamped build has an empty version; want the build info's or dev")
	}
	Version = "1.2.3"
	if got := buildVersion(); got != "1.2.3" {
		t.Fatalf("buildVersion() = %q with Version stamped 1.2.3", got)
	}
}

// --help lists every flag under one of its groups (channels, cluster,
// ingress, metrics, tuning, general), each on one line with its
// placeholder, its usage and its default.
func TestHelpListsEveryFlagInAGroupWithItsDefault(t *testing.T) {
	o, err := parseFlags([]string{"--app-dir", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	o.usage(&b)
	help := b.String()
	if strings.Contains(help, "\nOther:\n") {
		t.Fatalf("a flag is in no group:\n%s", help)
	}
	for _, g := range []string{"Channels:", "Cluster:", "Ingress:", "Metrics:", "Tuning:", "General:"} {
		if !strings.Contains(help, "\n"+g+"\n") {
			t.Fatalf("no %s group:\n%s", g, help)
		}
	}
	for name, def := range map[string]string{
		"port": "14320", "resync-interval": "30s", "drain-timeout": "1.5s", "broker-line-max": "262144",
		"max-live-workloads": "100000", "max-live-workload-bytes": "268435456", "workload-max-bytes": "16384", "peer-max-conns": "1024", "peer-max-conns-per-source": "64",
		"ingress-max-conns": "512", "metrics-max-conns": "64",
		"ipc": "", "cluster-dir": "", "app-dir": "", "local-ingress": "", "metrics": "", "log-level": "", "version": "", "help": "",
	} {
		line := helpLine(help, "--"+name)
		if line == "" {
			t.Fatalf("--%s is not listed:\n%s", name, help)
		}
		if def != "" && !strings.HasSuffix(line, "(default "+def+")") {
			t.Fatalf("--%s's line %q does not end with its default %s", name, line, def)
		}
	}
}

// helpLine is the line of help that lists flag, or "".
func helpLine(help, flag string) string {
	for _, l := range strings.Split(help, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == flag {
			return l
		}
	}
	return ""
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

func TestParseFlagsDefaultsToThePlatformPAIRDataDir(t *testing.T) {
	base := t.TempDir()
	var want string
	switch runtime.GOOS {
	case "windows":
		t.Skip("appdir_windows_test.go covers %LOCALAPPDATA%")
	case "darwin", "ios":
		t.Setenv("HOME", base)
		want = filepath.Join(base, "Library", "Application Support", "Nvidia Corporation", "NVIDIA PAIR")
	default:
		t.Setenv("XDG_CONFIG_HOME", base)
		want = filepath.Join(base, "Nvidia Corporation", "NVIDIA PAIR")
	}
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.appDir != want || o.clusterDir != filepath.Join(want, "cluster") {
		t.Fatalf("app dir %q, cluster dir %q; want %q and its cluster subdir", o.appDir, o.clusterDir, want)
	}
	if o.port != 14320 || o.resyncInterval != 30*time.Second || o.logLevelGiven ||
		o.drainTimeout != defaultDrainTimeout || o.brokerLineMax != 262144 || o.ipc != "" || o.localIngress != "" || o.showVersion {
		t.Fatalf("defaults = %+v, want port 14320, re-sync 30s, no level given, drain %v, broker lines up to 256 KiB, no ipc, no ingress", o, defaultDrainTimeout)
	}
}

func TestParseFlagsDefaultAppDirFollowsHOMEWithoutXDGConfigHome(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the ~/.config fallback is Linux's")
	}
	home := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("HOME", home)
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(home, ".config", "Nvidia Corporation", "NVIDIA PAIR"); o.appDir != want {
		t.Fatalf("app dir %q, want %q", o.appDir, want)
	}
}

func TestResolveLogLevelFlagThenEnvironmentThenInfo(t *testing.T) {
	for _, tc := range []struct {
		name        string
		flag        string
		given       bool
		env         string
		want        slog.Level
		warn, fails bool
	}{
		{"nothing set is info", "", false, "", slog.LevelInfo, false, false},
		{"the environment when no flag", "", false, "debug", slog.LevelDebug, false, false},
		{"the environment in any case", "", false, "WARN", slog.LevelWarn, false, false},
		{"the flag wins over the environment", "error", true, "debug", slog.LevelError, false, false},
		{"a bad environment value warns and is info", "", false, "loud", slog.LevelInfo, true, false},
		{"a bad flag value is an error", "loud", true, "debug", 0, false, true},
		{"an empty flag value is an error", "", true, "", 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lvl, warning, err := resolveLogLevel(tc.flag, tc.given, tc.env)
			if (err != nil) != tc.fails || (warning != "") != tc.warn {
				t.Fatalf("resolveLogLevel(%q, %v, %q) = %v, warning %q, err %v", tc.flag, tc.given, tc.env, lvl, warning, err)
			}
			if !tc.fails && lvl != tc.want {
				t.Fatalf("level %v, want %v", lvl, tc.want)
			}
			if tc.warn && !strings.Contains(warning, logLevelEnv) {
				t.Fatalf("warning %q does not name %s", warning, logLevelEnv)
			}
		})
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
		{[]string{"--workload-max-bytes", "4096"}, func(o options) bool { return o.workloadMax == 4096 }},
		{[]string{"--workload-max-bytes", "1048576"}, func(o options) bool { return o.workloadMax == 1048576 }},
		{[]string{"--max-live-workload-bytes", "1048576"}, func(o options) bool { return o.maxLiveBytes == 1048576 }},
		{[]string{"--max-live-workload-bytes", "1099511627776"}, func(o options) bool { return o.maxLiveBytes == 1<<40 }},
		{[]string{"--log-level", "debug"}, func(o options) bool { return o.logLevel == "debug" && o.logLevelGiven }},
		{[]string{"--log-level", "ERROR"}, func(o options) bool { return o.logLevel == "ERROR" && o.logLevelGiven }},
		{[]string{"--local-ingress", "127.0.0.1:14324"}, func(o options) bool { return o.localIngress == "127.0.0.1:14324" }},
	} {
		args := append([]string{"--app-dir", t.TempDir()}, tc.args...)
		o, err := parseFlags(args)
		if err != nil || !tc.check(o) {
			t.Errorf("parseFlags(%v) = %+v, %v", tc.args, o, err)
		}
	}
}

func TestMemoryLimitFollowsTheLiveWorkloadBoundUnlessGOMEMLIMITIsSet(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Setenv("GOMEMLIMIT", "")
	if got, want := applyMemoryLimit(100_000), int64(64<<20+1024*100_000); got != want || debug.SetMemoryLimit(-1) != want {
		t.Fatalf("limit %d, want 64 MiB + 1 KiB per workload = %d", got, want)
	}
	t.Setenv("GOMEMLIMIT", "1GiB")
	debug.SetMemoryLimit(1 << 30) // what the runtime read from GOMEMLIMIT at start
	if got := applyMemoryLimit(100_000); got != 1<<30 {
		t.Fatalf("with GOMEMLIMIT set the limit became %d, want the operator's %d", got, 1<<30)
	}
}

// A --cluster-dir whose app dir does not exist is a typo or a node that is
// not installed: one line naming it, exit 2, and nothing created, so no new
// node id is minted for a node nobody knows.
func TestAClusterDirWhoseAppDirIsMissingIsRefusedAndNothingIsCreated(t *testing.T) {
	base := t.TempDir()
	notADir := filepath.Join(base, "file")
	writeFile(t, notADir, "x")
	for _, tc := range []struct {
		name, clusterDir, appDir, want string
	}{
		{"a missing app dir", filepath.Join(base, "typo", "app", "cluster"), filepath.Join(base, "typo", "app"), "does not exist"},
		{"an app dir that is a file", filepath.Join(notADir, "cluster"), notADir, "is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run([]string{"--cluster-dir", tc.clusterDir, "--port", "0"}, strings.NewReader(""), &stdout, &stderr)
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			if code != 2 || len(lines) != 1 || !strings.Contains(lines[0], "--cluster-dir") || !strings.Contains(lines[0], tc.appDir) || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and one line naming --cluster-dir and %s (%s)", code, stderr.String(), tc.appDir, tc.want)
			}
			if stdout.Len() != 0 {
				t.Fatalf("a daemon that did not start wrote to the broker: %q", stdout.String())
			}
			if _, err := os.Stat(filepath.Join(base, "typo")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("something was created under %s: %v", base, err)
			}
		})
	}
}

// A start that fails leaves no node id behind when it minted one, and never
// touches an id it read.
func TestAFailedStartForgetsTheNodeIDItMintedAndKeepsOneItRead(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	testkit.Must(t, err)
	defer taken.Close()
	port := strconv.Itoa(taken.Addr().(*net.TCPAddr).Port)
	start := func(app string) int {
		var stdout, stderr bytes.Buffer
		return run([]string{"--app-dir", app, "--port", port}, strings.NewReader(""), &stdout, &stderr)
	}
	fresh := t.TempDir()
	if code := start(fresh); code != 1 {
		t.Fatalf("a start on a taken port: exit %d, want 1", code)
	}
	if _, err := os.Stat(filepath.Join(fresh, "node-id.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the failed start left a node-id.json behind: %v", err)
	}
	known := t.TempDir()
	doc := `{"node_uuid": "11111111-2222-4333-8444-555555555555", "created_at": 1}` + "\n"
	writeFile(t, filepath.Join(known, "node-id.json"), doc)
	if code := start(known); code != 1 {
		t.Fatalf("a start on a taken port: exit %d, want 1", code)
	}
	if b, err := os.ReadFile(filepath.Join(known, "node-id.json")); err != nil || string(b) != doc {
		t.Fatalf("the failed start changed the node's existing id: %q, %v", b, err)
	}
}
