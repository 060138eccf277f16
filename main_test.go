package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestBadStartupIsOneLineOnStderrAndNonZeroExit(t *testing.T) {
	takenIngress := listenT(t, "127.0.0.1:0")
	takenMetrics := listenT(t, "127.0.0.1:0")
	takenPeer := listenT(t, ":0") // the daemon binds --port on every interface
	ingressFileTaken := t.TempDir()
	writeFile(t, filepath.Join(ingressFileTaken, ingressConfigFile), `{"listen": "`+takenIngress+`"}`)
	badID := t.TempDir()
	writeFile(t, filepath.Join(badID, nodeIDFileName), `{"node_uuid": "not-a-uuid"}`)
	badIdentity := filepath.Join(t.TempDir(), "cluster")
	writeFile(t, filepath.Join(badIdentity, identityFileName), `{"created_at": 1789661457000}`)

	for _, tc := range []struct {
		name string
		args []string
		want []string // the one line names what is wrong
	}{
		{"port negative", []string{"--port", "-1"}, []string{"--port -1"}},
		{"port too large", []string{"--port", "70000"}, []string{"--port 70000"}},
		{"port not a number", []string{"--port", "abc"}, []string{`--port: "abc" is not a whole number`}},
		{"port without a value", []string{"--port"}, []string{"--port needs a value, like --port 14320"}},
		{"resync interval zero", []string{"--resync-interval", "0"}, []string{"--resync-interval"}},
		{"resync interval not a duration", []string{"--resync-interval", "xyz"}, []string{`--resync-interval: "xyz" is not a duration; write it with a unit, like 5s or 1m`}},
		{"resync interval without a unit", []string{"--resync-interval", "5"}, []string{`--resync-interval: "5" is not a duration; write it with a unit, like 5s or 1m`}},
		{"drain timeout with one dash and no unit", []string{"-drain-timeout", "3"}, []string{`--drain-timeout: "3" is not a duration`}},
		{"live workload limit not a whole number", []string{"--max-live-workloads", "1e5"}, []string{`--max-live-workloads: "1e5" is not a whole number`}},
		{"version given a value", []string{"--version=maybe"}, []string{`--version: "maybe" is not true or false`}},
		{"unknown log level", []string{"--log-level", "verbose"}, []string{"verbose"}},
		{"drain timeout zero", []string{"--drain-timeout", "0"}, []string{"--drain-timeout"}},
		{"broker line max not a number", []string{"--broker-line-max", "abc"}, []string{`--broker-line-max "abc"`, "4096", "16777216"}},
		{"broker line max too small", []string{"--broker-line-max", "100"}, []string{"--broker-line-max 100", "between 4096 and 16777216 bytes"}},
		{"broker line max negative", []string{"--broker-line-max", "-1"}, []string{"--broker-line-max -1", "between 4096 and 16777216 bytes"}},
		{"broker line max too large", []string{"--broker-line-max", "16777217"}, []string{"--broker-line-max 16777217", "between 4096 and 16777216 bytes"}},
		{"unknown flag", []string{"--bogus"}, []string{"unknown flag --bogus (--help lists the flags)"}},
		{"stray argument", []string{"stray"}, []string{`"stray"`}},
		{"ingress on every interface", []string{"--local-ingress", "0.0.0.0:14324"}, []string{"--local-ingress 0.0.0.0:14324: not a loopback address"}},
		{"ingress port from the file taken", []string{"--app-dir", ingressFileTaken}, []string{"local ingress " + takenIngress + " (from \"listen\" in " + filepath.Join(ingressFileTaken, ingressConfigFile) + "): listen tcp"}},
		{"ingress on a LAN address", []string{"--local-ingress", "192.168.1.10:1"}, []string{"192.168.1.10:1", "loopback"}},
		{"ingress not host:port", []string{"--local-ingress", "nonsense"}, []string{"nonsense"}},
		{"ingress port taken", []string{"--local-ingress", takenIngress}, []string{"--local-ingress " + takenIngress + ": listen tcp"}},
		{"metrics port taken", []string{"--metrics", takenMetrics}, []string{"--metrics " + takenMetrics + ": listen tcp"}},
		{"peer port taken", []string{"--port", portOf(t, takenPeer)}, []string{"--port " + portOf(t, takenPeer) + ": listen tcp :" + portOf(t, takenPeer)}},
		{"node-id.json not a UUID", []string{"--app-dir", badID}, []string{filepath.Join(badID, nodeIDFileName), "not a UUID"}},
		{"identity.json names no node", []string{"--app-dir", badID, "--cluster-dir", badIdentity}, []string{filepath.Join(badIdentity, identityFileName), "node_uuid"}},
		{"empty log level", []string{"--log-level", ""}, []string{"--log-level"}},
		{"live workload limit zero", []string{"--max-live-workloads", "0"}, []string{"--max-live-workloads 0"}},
		{"live workload limit too large", []string{"--max-live-workloads", "10000001"}, []string{"--max-live-workloads 10000001"}},
		{"workload bound not a number", []string{"--workload-max-bytes", "16KiB"}, []string{`--workload-max-bytes: "16KiB" is not a whole number`}},
		{"workload bound too small", []string{"--workload-max-bytes", "4095"}, []string{"--workload-max-bytes 4095", "between 4096 and 1048576 bytes"}},
		{"workload bound too large", []string{"--workload-max-bytes", "1048577"}, []string{"--workload-max-bytes 1048577", "between 4096 and 1048576 bytes"}},
		{"live workload bytes not a number", []string{"--max-live-workload-bytes", "256MiB"}, []string{`--max-live-workload-bytes: "256MiB" is not a whole number`}},
		{"live workload bytes too small", []string{"--max-live-workload-bytes", "1048575"}, []string{"--max-live-workload-bytes 1048575", "between 1048576 and 1099511627776 bytes"}},
		{"live workload bytes too large", []string{"--max-live-workload-bytes", "1099511627777"}, []string{"--max-live-workload-bytes 1099511627777", "between 1048576 and 1099511627776 bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A fresh app dir and --port 0 first, so a case that wrongly
			// starts touches nothing outside the test; the case's own flags
			// come after and win.
			args := append([]string{"--app-dir", t.TempDir(), "--port", "0"}, tc.args...)
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

func TestVersionFlagPrintsTheStampedVersionAndReadyAnnouncesIt(t *testing.T) {
	// PAIR stamps its builds with -ldflags "-X main.Version=...".
	const stamped = "9.8.7-pair.test"
	bin := filepath.Join(t.TempDir(), "nvpair-workload-manager-stamped")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	build := exec.Command(goToolPath(), "build", "-ldflags", "-X main.Version="+stamped, "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if want := "nvpair-workload-manager " + stamped + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"; err != nil || string(out) != want {
		t.Fatalf("--version of a stamped build = %q, %v; want %q", out, err, want)
	}
	nodes := writeCluster(t, 1)
	d := startDaemonBinary(t, bin, nil, "--app-dir", nodes[0].AppDir, "--port", "0")
	var ready struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(d.waitMethod("ready", 1)[0].Params, &ready); err != nil || ready.Version != stamped {
		t.Fatalf("ready.version = %q (%v), want the stamped %q", ready.Version, err, stamped)
	}
}

func TestVersionFlagOfAnUnstampedBuildPrintsTheBuildInfoVersion(t *testing.T) {
	code, stdout, stderr := runBinary(t, "--version")
	// The name, the version, the Go release and the platform, one line.
	f := strings.Split(strings.TrimSuffix(stdout, "\n"), " ")
	if code != 0 || stderr != "" || strings.Count(stdout, "\n") != 1 || len(f) != 4 ||
		f[0] != "nvpair-workload-manager" || f[1] == "" || f[2] != runtime.Version() || f[3] != runtime.GOOS+"/"+runtime.GOARCH {
		t.Fatalf("--version: exit %d, stdout %q, stderr %q; want 0 and \"nvpair-workload-manager VERSION %s %s/%s\"", code, stdout, stderr, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
}

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

func TestHelpFlagExitsZeroWithUsage(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		code, stdout, stderr := runBinary(t, arg)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: nvpair-workload-manager") {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", arg, code, stdout, stderr)
		}
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

func TestProcessTakesItsLogLevelFromNVPAIRLogLevel(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       string
		args      []string
		wantDebug bool
		wantWarn  bool
	}{
		{"debug from the environment", "debug", nil, true, false},
		{"a bad value warns and logs at info", "loud", nil, false, true},
		{"the flag wins over the environment", "debug", []string{"--log-level", "info"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := writeCluster(t, 1)
			args := append([]string{"--app-dir", nodes[0].AppDir, "--port", "0"}, tc.args...)
			d := startDaemonBinary(t, daemonBinary(t), []string{logLevelEnv + "=" + tc.env}, args...)
			d.waitMethod("discovery:subscribe", 1)
			// A request's answer is logged at info after everything startup
			// logs, so once it is there the startup lines are all in.
			d.send(`{"jsonrpc":"2.0","id":7,"method":"nonexistent"}`)
			d.waitResponse("7")
			d.send(`{"jsonrpc":"2.0","method":"nonexistent/notification"}`) // logged at debug
			d.send(`{"jsonrpc":"2.0","id":8,"method":"nonexistent"}`)
			d.waitResponse("8")
			logs := d.stderr.String()
			if got := strings.Contains(logs, "level=DEBUG"); got != tc.wantDebug {
				t.Fatalf("debug lines logged = %v, want %v; log:\n%s", got, tc.wantDebug, logs)
			}
			warned := d.stderr.contains("level=WARN", logLevelEnv, "loud")
			if warned != tc.wantWarn {
				t.Fatalf("warning about %s logged = %v, want %v; log:\n%s", logLevelEnv, warned, tc.wantWarn, logs)
			}
			if !d.stderr.contains("level=INFO", "started") {
				t.Fatalf("the daemon did not start; log:\n%s", logs)
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
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
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
	netMust(t, err)
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
