package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The release tool builds the binary of this machine's platform, stamped,
// into the directory asked for, with a SHA256SUMS line that matches it;
// its own --version check (which fails the build) has passed by then.
func TestReleaseBuildsAStampedBinaryWithItsChecksum(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the daemon (a full compile on a cold cache)")
	}
	host := runtime.GOOS + "/" + runtime.GOARCH
	found := false
	for _, tg := range targets {
		found = found || tg == host
	}
	if !found {
		t.Skipf("%s is not a release target", host)
	}
	out := t.TempDir()
	writeFile := func(name string) {
		if err := os.WriteFile(filepath.Join(out, name), []byte("stale\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(daemonName + "-0.9.0-linux-amd64") // a previous run's file goes
	writeFile("keep.txt")                        // what is not the tool's stays
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--version", "1.2.3-test", "--out", out, "--targets", host}, &stdout, &stderr); code != 0 {
		t.Fatalf("release: exit %d\n%s", code, stderr.String())
	}
	name := daemonName + "-1.2.3-test-" + runtime.GOOS + "-" + runtime.GOARCH
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	sum, err := fileSHA256(filepath.Join(out, name))
	if err != nil {
		t.Fatal(err)
	}
	sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	if err != nil || string(sums) != sum+"  "+name+"\n" {
		t.Fatalf("SHA256SUMS = %q, %v; want %q", sums, err, sum+"  "+name+"\n")
	}
	entries, _ := os.ReadDir(out)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if got := strings.Join(names, " "); got != "SHA256SUMS keep.txt "+name && got != name+" SHA256SUMS keep.txt" {
		t.Fatalf("out dir holds %q", got)
	}
}

func TestReleaseFlagErrorsAreOneLineNamingTheFlagAndExitTwo(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--targets", "plan9/386"}, `--targets: "plan9/386" is not one of`},
		{[]string{"--version", "1.0 beta"}, `--version "1.0 beta"`},
		{[]string{"--out"}, "--out needs a value, like --out dist"},
		{[]string{"--bogus"}, "unknown flag --bogus"},
		{[]string{"stray"}, `unexpected argument "stray"`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != 2 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line with %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
