//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// measureEnv opts in to the measurements below: each takes minutes, which
// neither the inner loop nor CI spends on a figure (the closing note of
// issue 38 gives it).
const measureEnv = "NVPAIR_WLM_MEASURE"

// TestSlurmBridgeAt1000JobsPolledEvery5sUsesUnderOnePercentOfACore
// measures the bridge at 1,000 Slurm jobs, polled every 5 s: the CPU time
// of its process over a minute of polls once it has reported them all,
// and apart the CPU time of the squeue runs it waited for (its children).
func TestSlurmBridgeAt1000JobsPolledEvery5sUsesUnderOnePercentOfACore(t *testing.T) {
	if os.Getenv(measureEnv) != "1" {
		t.Skipf("a measurement of minutes: set %s=1 to run it", measureEnv)
	}
	s := startSlurm(t, 2)
	nodes := writeCluster(t, 1)
	a := newPairNodeBroker(t, nodes[0], "--local-ingress", "127.0.0.1:0", "--max-live-workloads", "100000")
	a.start()
	ingress := a.cur().loggedValue("local ingress listening", "addr")
	// 1,000 jobs of their own (not one array: squeue lists a pending array
	// as one record), held so they stay.
	const jobs = 1000
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < jobs; i += 8 {
				s.sbatch("-J", "held-"+strconv.Itoa(i), "--hold", "--wrap", "true")
			}
		})
	}
	wg.Wait()
	br := startBridge(t, s, ingress, filepath.Join(t.TempDir(), "state.json"), "--interval", "5s", "--lease", "2m") // the defaults
	waitLong(t, "the 1,000 jobs queued on the node", func() bool {
		n := 0
		for _, r := range a.jobs().Snapshot() {
			if r.Engine == "slurm" && r.State == "queued" {
				n++
			}
		}
		return n == jobs
	})
	cpu := func() (own, children time.Duration) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", br.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		tick := func(i int) time.Duration {
			n, _ := strconv.ParseInt(f[i], 10, 64)
			return time.Duration(n) * 10 * time.Millisecond
		}
		// utime, stime, cutime, cstime: fields 14 to 17 of stat(5), 11 to 14 past the command.
		return tick(11) + tick(12), tick(13) + tick(14)
	}
	const window = time.Minute
	own0, ch0 := cpu()
	begun := time.Now()
	time.Sleep(window) // the measurement's window: the bridge polls on its own meanwhile
	own1, ch1 := cpu()
	elapsed := time.Since(begun)
	ownPct := 100 * float64(own1-own0) / float64(elapsed)
	sqPct := 100 * float64(ch1-ch0) / float64(elapsed)
	t.Logf("at %d jobs, polls every 5 s over %v: the bridge %.2f %% of a core (%v), squeue %.2f %% (%v)",
		jobs, elapsed.Round(time.Second), ownPct, own1-own0, sqPct, ch1-ch0)
	if ownPct >= 1 {
		t.Errorf("the bridge used %.2f %% of a core, over 1 %%", ownPct)
	}
}
