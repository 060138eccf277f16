package e2e

import (
	"path/filepath"
	"strings"
	"testing"
)

// Every flag, given a bad value, stops the real binary with exit status 2
// and one line naming the flag (spec 3.9). The table has a case for every
// flag --help lists, so a new flag must bring its own.
func TestEveryBadFlagValueExitsTwoWithOneLineNamingTheFlag(t *testing.T) {
	aFile := filepath.Join(t.TempDir(), "plain-file")
	writeFile(t, aFile, "not a directory\n")
	cases := map[string][][]string{
		"ipc":                       {{"--ipc", filepath.Join(t.TempDir(), "no-socket-here")}},
		"port":                      {{"--port", "-1"}, {"--port", "70000"}, {"--port", "abc"}, {"--port"}},
		"cluster-dir":               {{"--cluster-dir", filepath.Join(t.TempDir(), "missing", "cluster")}, {"--cluster-dir", aFile}},
		"app-dir":                   {{"--app-dir", aFile}},
		"local-ingress":             {{"--local-ingress", "14324"}, {"--local-ingress", "0.0.0.0:14324"}, {"--local-ingress", "127.0.0.1:http"}, {"--local-ingress", "127.0.0.1:70000"}},
		"ingress-max-conns":         {{"--ingress-max-conns", "0"}, {"--ingress-max-conns", "many"}},
		"metrics":                   {{"--metrics", "9464"}, {"--metrics", "192.168.1.10:9464"}},
		"metrics-max-conns":         {{"--metrics-max-conns", "0"}, {"--metrics-max-conns", "1.5"}},
		"resync-interval":           {{"--resync-interval", "5"}, {"--resync-interval", "1ms"}},
		"max-live-workloads":        {{"--max-live-workloads", "0"}, {"--max-live-workloads", "1e5"}},
		"max-live-workload-bytes":   {{"--max-live-workload-bytes", "1"}, {"--max-live-workload-bytes", "256MiB"}},
		"max-ended-bytes":           {{"--max-ended-bytes", "1"}, {"--max-ended-bytes", "64MiB"}},
		"journal-fsync":             {{"--journal-fsync", "5"}, {"--journal-fsync", "1ms"}, {"--journal-fsync", "1m"}, {"--journal-fsync", "sometimes"}},
		"workload-max-bytes":        {{"--workload-max-bytes", "4095"}, {"--workload-max-bytes", "16KiB"}},
		"broker-line-max":           {{"--broker-line-max", "100"}, {"--broker-line-max", "abc"}},
		"drain-timeout":             {{"--drain-timeout", "0"}, {"--drain-timeout", "3"}},
		"peer-max-conns":            {{"--peer-max-conns", "-1"}, {"--peer-max-conns", "x"}},
		"peer-max-conns-per-source": {{"--peer-max-conns-per-source", "0"}},
		"log-level":                 {{"--log-level", "verbose"}, {"--log-level", ""}},
		"version":                   {{"--version=maybe"}},
	}
	for _, name := range helpFlags(t) {
		if name != "help" && len(cases[name]) == 0 {
			t.Errorf("no bad-value case for --%s", name)
		}
	}
	for name, argsList := range cases {
		for _, args := range argsList {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				// A fresh app dir and --port 0 first (a case's own flags
				// come after and win), so a case that wrongly starts touches
				// nothing outside the test and exits at stdin's end.
				// --cluster-dir's cases name their app dir themselves.
				all := append([]string{"--app-dir", t.TempDir(), "--port", "0"}, args...)
				if name == "cluster-dir" {
					all = append([]string{"--port", "0"}, args...)
				}
				code, stdout, stderr := runBinary(t, all...)
				if code != 2 {
					t.Fatalf("exit status %d for %v, want 2; stderr:\n%s", code, args, stderr)
				}
				if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "nvpair-workload-manager: ") {
					t.Fatalf("stderr for %v is not one line:\n%s", args, stderr)
				}
				if !strings.Contains(stderr, "--"+name) {
					t.Fatalf("stderr %q does not name --%s", stderr, name)
				}
				if stdout != "" {
					t.Fatalf("stdout = %q, want nothing", stdout)
				}
			})
		}
	}
}

// helpFlags returns the names of the flags the binary's --help lists, each
// on a line of its own that starts with the flag.
func helpFlags(t *testing.T) []string {
	t.Helper()
	code, help, stderr := runBinary(t, "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d, stderr %q", code, stderr)
	}
	var names []string
	for _, line := range strings.Split(help, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "--") {
			names = append(names, strings.TrimPrefix(f[0], "--"))
		}
	}
	if len(names) == 0 {
		t.Fatalf("--help lists no flag:\n%s", help)
	}
	return names
}
