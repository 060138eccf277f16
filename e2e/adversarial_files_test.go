//go:build unix

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
)

// TestAdversarialPinFilesAreSkippedWhileMemoryStaysFlatAndTheDaemonStops
// puts a symlink to /dev/zero and a named pipe into a member's trusted/
// beside its real pins, runs the real binary over several reload ticks,
// and shows each skipped with one warning, the daemon's memory flat, a
// pinned peer's frame still accepted, and SIGTERM answered within the drain
// timeout plus one second.
func TestAdversarialPinFilesAreSkippedWhileMemoryStaysFlatAndTheDaemonStops(t *testing.T) {
	const drain = time.Second
	nodes := writeCluster(t, 2)
	trusted := filepath.Join(nodes[0].ClusterDir, "trusted")
	if err := os.Symlink(testkit.EndlessDevice(t), filepath.Join(trusted, "zzzz.json")); err != nil {
		t.Fatal(err)
	}
	testkit.MakeFIFO(t, filepath.Join(trusted, "fifo.json"))

	a := startDaemon(t, nodeArgs(nodes[0], 0, "--metrics", "127.0.0.1:0", "--drain-timeout", drain.String())...)
	b := startDaemon(t, nodeArgs(nodes[1], 0)...)
	a.port, b.port = a.boundPeerPort(), b.boundPeerPort()
	metrics := a.loggedValue("metrics endpoint listening", "addr")
	for _, file := range []string{"zzzz.json", "fifo.json"} {
		a.waitLog("ignoring pin", "file="+file, "not a regular file")
	}

	// A pinned peer is still accepted, and this node still reaches it.
	a.discover(nodes[1], b.port)
	b.discover(nodes[0], a.port)
	a.waitLog("broadcast targets changed", "total=1")
	b.waitLog("broadcast targets changed", "total=1")
	b.send(testframe.LifecycleLine("adv-files-1", "running", nodes[1].ID))
	a.WaitUpserts("adv-files-1", 1)
	a.send(testframe.LifecycleLine("adv-files-2", "running", nodes[0].ID))
	b.WaitUpserts("adv-files-2", 1)

	// Memory over several reload ticks: read from /proc where there is one.
	rssStart := residentKiB(t, a.cmd.Process.Pid)
	ticks := testkit.ScrapeValue(t, metrics, "nvpair_wlm_trust_reloads_total")
	maxRSS := rssStart
	testkit.Eventually(t, "three more reload ticks", func() bool {
		maxRSS = max(maxRSS, residentKiB(t, a.cmd.Process.Pid))
		return testkit.ScrapeValue(t, metrics, "nvpair_wlm_trust_reloads_total") >= ticks+3
	})
	const flatKiB = 16 << 10
	if rssStart >= 0 && maxRSS-rssStart > flatKiB {
		t.Fatalf("resident memory grew from %d KiB to %d KiB over three reload ticks, want under %d KiB of growth", rssStart, maxRSS, flatKiB)
	}
	t.Logf("resident memory %d KiB at the first tick, at most %d KiB over three more", rssStart, maxRSS)
	for _, file := range []string{"zzzz.json", "fifo.json"} {
		if n := countLines(a.stderr.String(), "ignoring pin", "file="+file); n != 1 {
			t.Fatalf("%d warnings naming %s, want 1 over all reloads", n, file)
		}
	}
	if got := testkit.ScrapeValue(t, metrics, `nvpair_wlm_cluster_files_refused_total{reason="not_regular"}`); got != 2 {
		t.Fatalf("not_regular refusals = %v, want 2: each file refused once, never opened again while unchanged", got)
	}

	start := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a.wantCleanExit(a.waitExit(drain + time.Second))
	t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
}

// residentKiB returns a process's resident memory in KiB from
// /proc/<pid>/status, or -1 where there is no /proc.
func residentKiB(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kib
		}
	}
	return -1
}

// countLines counts the lines of text holding every fragment.
func countLines(text string, fragments ...string) int {
	n := 0
	for _, line := range strings.Split(text, "\n") {
		all := true
		for _, f := range fragments {
			all = all && strings.Contains(line, f)
		}
		if all {
			n++
		}
	}
	return n
}
