package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"nvpair-workload-manager/internal/dev/stockwlm"
)

// The -baseline and -stock modes (issue 30). A regression is cheapest to
// find in the run that causes it, so the harness can run a previous build
// (-baseline BIN) and the stock upstream daemon (-stock) beside this one,
// under the same load on the same machine, with their trials interleaved
// with this build's and the ceiling's, and print each path's ratio.

// Roles of the daemon builds a run may compare.
const (
	roleThis     = "this"
	roleBaseline = "baseline"
	roleStock    = "stock"
)

// contestant is one daemon build the harness runs: this build, the
// -baseline build or the stock upstream daemon. Builds differ in the flags
// they take, and a daemon refuses an unknown flag with exit 2, so the
// optional flags are probed once and a daemon is started only with those it
// knows.
type contestant struct {
	role     string
	bin      string
	known    map[string]bool // optional daemon flags it accepts, by name
	logLevel string          // its --log-level
	leases   *bool           // whether its ingress knows Workload-Lease; nil until probed
	// fsync and args are this build's --journal-fsync and -daemon-args,
	// given to each of its daemons; another build runs with its defaults.
	fsync string
	args  []string
}

// optionalFlags are the daemon flags a section may pass that an older build
// or the stock daemon may lack, each with a value to probe it with.
var optionalFlags = []struct{ name, probe string }{
	{"--app-dir", os.TempDir()},
	{"--local-ingress", "127.0.0.1:0"},
	{"--metrics", "127.0.0.1:0"},
	{"--resync-interval", "1h"},
	{"--max-live-workloads", "1000"},
	{"--journal-fsync", fsyncAlways},
}

// newContestant probes bin's optional flags.
func newContestant(role, bin, logLevel string) *contestant {
	c := &contestant{role: role, bin: bin, known: map[string]bool{}, logLevel: logLevel}
	for _, f := range optionalFlags {
		c.known[f.name] = supportsFlag(bin, f.name, f.probe)
	}
	return c
}

// lacks returns the flags of need that the build does not accept, in order.
func (c *contestant) lacks(need ...string) []string {
	var out []string
	for _, f := range need {
		if !c.known[f] {
			out = append(out, f)
		}
	}
	return out
}

// opts fills in what a daemon of this build is started with: its known
// flags and log level, and a directory of its own under the section's name.
func (c *contestant) opts(o daemonOpts) daemonOpts {
	o.known, o.logLevel = c.known, c.logLevel
	if o.fsync == "" {
		o.fsync = c.fsync
	}
	o.extra = append(o.extra, c.args...)
	if c.role != roleThis {
		o.name += "-" + c.role
	}
	return o
}

// skipLine is the one line a section prints for a build it cannot run: the
// flags it lacks, so the reader knows it was skipped and why.
func skipLine(section string, c *contestant, missing []string) string {
	return fmt.Sprintf("%s: the %s build (%s) does not take %s: skipped for it", section, c.role, filepath.Base(c.bin), strings.Join(missing, ", "))
}

// buildFailed handles a build that failed in a section: this build's
// failure ends the run, since there is nothing to measure; another build's
// is one line in the notes, and the section goes on without it (nil).
func (b *bench) buildFailed(section string, bc *contestant, err error) error {
	if bc.role == roleThis {
		return err
	}
	b.tbl.note("%s: the %s build (%s) failed: %s: skipped for it", section, bc.role, filepath.Base(bc.bin), strings.ReplaceAll(err.Error(), "\n", " "))
	return nil
}

// interleave returns the order the n servers of one figure run in at trial
// i: each trial runs every server once, and which goes first rotates, so
// drift on a shared machine (another process taking a core for a while)
// falls on each alike: A B, B A for two; A B C, B C A, C A B for three.
func interleave(i, n int) []int {
	out := make([]int, n)
	for j := range n {
		out[j] = (i + j) % n
	}
	return out
}

// trialResult is one server's trial: what the load measured and the
// server's CPU per accepted frame.
type trialResult struct {
	load loadResult
	cpu  time.Duration
}

// runGroup runs trials of each of fns, interleaved, and returns the results
// by trial and then by server, in fns' order.
func runGroup(trials int, fns []trialFunc) [][]trialResult {
	out := make([][]trialResult, trials)
	for i := range trials {
		out[i] = make([]trialResult, len(fns))
		for _, s := range interleave(i, len(fns)) {
			r, cpu := fns[s](i)
			out[i][s] = trialResult{load: r, cpu: cpu}
		}
	}
	return out
}

// series is what one server measured over a figure's trials.
type series struct {
	role     string
	rate     []float64
	cpu      []time.Duration
	lats     []latencySummary
	ok       int64
	failed   int64
	failures []string
}

func (s *series) add(t trialResult) {
	s.rate, s.cpu, s.lats = append(s.rate, t.load.rate()), append(s.cpu, t.cpu), append(s.lats, t.load.lats)
	s.ok, s.failed = s.ok+t.load.ok, s.failed+t.load.failed
	s.failures = appendFailure(s.failures, s.role, t.load)
}

// trialRatios returns the per-trial ratios of a over b, where both measured
// a positive figure: a ratio of medians would let one noisy trial of either
// side decide it, while interleaved trials see the same machine.
func trialRatios(a, b []float64) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		if a[i] > 0 && b[i] > 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}

func durations(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d)
	}
	return out
}

// compare is one build's figures beside this build's for one path.
type compare struct {
	rate, cpu   string // the other build's rate and CPU per frame
	rateRatio   float64
	rateOK      bool
	cpuRatio    float64
	cpuOK       bool
	ceilingCell string // the other build's own ratio to the ceiling, when there is one
}

// compareSeries sets this build's series against another's: the medians of
// the per-trial ratios of throughput (this over other: above 1 is faster)
// and of CPU per frame (this over other: below 1 is cheaper).
func compareSeries(this, other, ceiling *series) compare {
	c := compare{rate: fmtRate(median(other.rate)), cpu: "n/a"}
	if m := medianDuration(other.cpu); m > 0 {
		c.cpu = fmtMicros(m)
	}
	c.rateRatio, c.rateOK = ratioOf(trialRatios(this.rate, other.rate))
	c.cpuRatio, c.cpuOK = ratioOf(trialRatios(durations(this.cpu), durations(other.cpu)))
	if ceiling != nil {
		if r, ok := ratioOf(trialRatios(other.rate, ceiling.rate)); ok {
			c.ceilingCell = fmtX(r) + " of ceiling"
		}
	}
	return c
}

// baseCells fills a rate row's and a CPU row's baseline columns from a
// comparison with the -baseline build.
func (c compare) baseCells(rate, cpu *row) {
	rate.base = c.rate
	if c.ceilingCell != "" {
		rate.base += ", " + c.ceilingCell
	}
	rate.vsBase = optX(c.rateRatio, c.rateOK)
	cpu.base, cpu.vsBase = c.cpu, optX(c.cpuRatio, c.cpuOK)
}

// optX is a ratio cell, "-" when there is no ratio.
func optX(r float64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmtX(r)
}

// Issue 30's targets against the stock daemon: on every path, at least
// 2.5 times its throughput at most 0.35 times its CPU per frame.
const (
	stockRateRatio = 2.50
	stockCPURatio  = 0.35
)

// stockRows are a path's two rows against the stock daemon.
func stockRows(path string, this, stock *series) []row {
	c := compareSeries(this, stock, nil)
	thisCPU := "n/a"
	if m := medianDuration(this.cpu); m > 0 {
		thisCPU = fmtMicros(m)
	}
	return []row{
		{section: "stock", figure: path + ": frames/s, this over the stock daemon",
			measured: fmtRate(median(this.rate)), baseline: c.rate + " stock", ratio: optX(c.rateRatio, c.rateOK),
			target: ">= " + fmtX(stockRateRatio), result: atLeast(c.rateRatio, c.rateOK, stockRateRatio)},
		{section: "stock", figure: "  " + path + ": CPU per frame, this over the stock daemon",
			measured: thisCPU, baseline: c.cpu + " stock", ratio: optX(c.cpuRatio, c.cpuOK),
			target: "<= " + fmtX(stockCPURatio), result: atMost(c.cpuRatio, c.cpuOK, stockCPURatio)},
	}
}

// buildStock builds the stock upstream daemon with its local ingress (the
// tree's nvpair-workload-manager-ingress, the same worker with the ingress
// pull request) into dir, through internal/dev/stockwlm, which locates the
// tree and builds it without touching it or the network.
func buildStock(dir string) (string, error) {
	src, err := stockwlm.Find(".")
	if err != nil {
		return "", err
	}
	withIngress := src + "-ingress"
	if fi, err := os.Stat(withIngress); err == nil && fi.IsDir() {
		src = withIngress
	}
	progress("building the stock daemon from %s", src)
	return stockwlm.Build("", src, dir)
}

// contestants returns the builds a figure runs beside the ceiling, this
// build first, each with its role, leaving out those skip rejects.
func (b *bench) contestants(skip func(*contestant) bool) []*contestant {
	out := []*contestant{b.this}
	for _, c := range []*contestant{b.base, b.stock} {
		if c != nil && (skip == nil || !skip(c)) {
			out = append(out, c)
		}
	}
	return out
}

// without returns cs less the stock daemon, for a figure the stock daemon
// has no part in.
func without(cs []*contestant, role string) []*contestant {
	return slices.DeleteFunc(slices.Clone(cs), func(c *contestant) bool { return c.role == role })
}

// stockGoals adds a path's rows against the stock daemon to issue 30's
// summary block.
func (b *bench) stockGoals(rows []row) {
	for _, r := range rows {
		b.goals30.set(strings.TrimSpace(r.figure), r.target, fmt.Sprintf("%s (%s vs %s)", r.ratio, r.measured, r.baseline), r.result)
	}
}
