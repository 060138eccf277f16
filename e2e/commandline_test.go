package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The daemon's command line as PAIR and an operator meet it: a bad start is
// one line on stderr and a non-zero exit, --version and --help answer and
// exit, and $NVPAIR_LOG_LEVEL stands in for --log-level.

func TestBadStartupIsOneLineOnStderrAndNonZeroExit(t *testing.T) {
	skipUnderShort(t) // here, not in its subtests alone: they start the binary after its setup
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
	skipUnderShort(t) // it builds a binary of its own before it starts one
	// PAIR stamps its builds with -ldflags "-X main.Version=...".
	const stamped = "9.8.7-pair.test"
	bin := filepath.Join(t.TempDir(), "nvpair-workload-manager-stamped")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	build := exec.Command(goToolPath(), "build", "-ldflags", "-X main.Version="+stamped, "-o", bin, ".")
	build.Dir = moduleRoot(t)
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
	if err := json.Unmarshal(d.WaitMethod("ready", 1)[0].Params, &ready); err != nil || ready.Version != stamped {
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

func TestHelpFlagExitsZeroWithUsage(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		code, stdout, stderr := runBinary(t, arg)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: nvpair-workload-manager") {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", arg, code, stdout, stderr)
		}
	}
}

func TestProcessTakesItsLogLevelFromNVPAIRLogLevel(t *testing.T) {
	skipUnderShort(t) // here, not in its subtests alone: they start the binary after its setup
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
			d.WaitMethod("discovery:subscribe", 1)
			// A request's answer is logged at info after everything startup
			// logs, so once it is there the startup lines are all in.
			d.send(`{"jsonrpc":"2.0","id":7,"method":"nonexistent"}`)
			d.WaitResponse("7")
			d.send(`{"jsonrpc":"2.0","method":"nonexistent/notification"}`) // logged at debug
			d.send(`{"jsonrpc":"2.0","id":8,"method":"nonexistent"}`)
			d.WaitResponse("8")
			logs := d.stderr.String()
			if got := strings.Contains(logs, "level=DEBUG"); got != tc.wantDebug {
				t.Fatalf("debug lines logged = %v, want %v; log:\n%s", got, tc.wantDebug, logs)
			}
			warned := d.stderr.Contains("level=WARN", logLevelEnv, "loud")
			if warned != tc.wantWarn {
				t.Fatalf("warning about %s logged = %v, want %v; log:\n%s", logLevelEnv, warned, tc.wantWarn, logs)
			}
			if !d.stderr.Contains("level=INFO", "started") {
				t.Fatalf("the daemon did not start; log:\n%s", logs)
			}
		})
	}
}
