package main

import (
	"fmt"
	"slices"
	"strconv"
	"time"
)

// sweepCounts returns the producer counts the ingress section runs: the
// -sweep counts and -c (the half-rate run's producers, whose closed-loop
// rate sets the half rate), sorted, each once.
func sweepCounts(sweep []int, c int) []int {
	out := slices.Clone(sweep)
	if !slices.Contains(out, c) {
		out = append(out, c)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// pairResult is one figure measured on the daemon and on its ceiling over
// the same trials, interleaved.
type pairResult struct {
	dRate, cRate []float64
	ratio        []float64 // per trial, daemon over ceiling, where the ceiling measured any
	dCPU, cCPU   []time.Duration
	dLats, cLats []latencySummary
	dOK, cOK     int64 // frames accepted over every trial
	dFailed      int64 // frames the daemon did not accept (a 503 at its waiter bound, say)
	failures     []string
}

// add records one trial of each.
func (p *pairResult) add(rd, rc loadResult, dCPU, cCPU time.Duration) {
	p.dRate, p.cRate = append(p.dRate, rd.rate()), append(p.cRate, rc.rate())
	if rc.rate() > 0 {
		p.ratio = append(p.ratio, rd.rate()/rc.rate())
	}
	p.dCPU, p.cCPU = append(p.dCPU, dCPU), append(p.cCPU, cCPU)
	p.dLats, p.cLats = append(p.dLats, rd.lats), append(p.cLats, rc.lats)
	p.dOK, p.cOK, p.dFailed = p.dOK+rd.ok, p.cOK+rc.ok, p.dFailed+rd.failed
	p.failures = appendFailure(p.failures, "daemon", rd)
	p.failures = appendFailure(p.failures, "ceiling", rc)
}

// p99Ratios returns the per-trial ratios of the daemon's p99 over the
// ceiling's, where both measured one.
func (p *pairResult) p99Ratios() []float64 {
	var out []float64
	for i := range min(len(p.dLats), len(p.cLats)) {
		if d, c := p.dLats[i].p99, p.cLats[i].p99; d > 0 && c > 0 {
			out = append(out, float64(d)/float64(c))
		}
	}
	return out
}

// medianLats is the per-statistic median of runs' latency summaries.
func medianLats(ls []latencySummary) latencySummary {
	var p50, p99, mx []time.Duration
	for _, l := range ls {
		p50, p99, mx = append(p50, l.p50), append(p99, l.p99), append(mx, l.max)
	}
	return latencySummary{p50: medianDuration(p50), p99: medianDuration(p99), max: medianDuration(mx)}
}

// trialFunc runs one trial of trial number i against one server and
// returns what it measured and the server's CPU per accepted frame.
type trialFunc func(i int) (loadResult, time.Duration)

// withCPU runs load and measures the CPU the process pid used per frame it
// accepted.
func withCPU(pid int, load func() loadResult) (loadResult, time.Duration) {
	m := startCPU(pid)
	r := load()
	return r, m.perFrame(r.ok)
}

// runPair runs trials of the daemon and of the ceiling, alternating which
// goes first, so drift on a shared machine hits both alike.
func runPair(trials int, label string, daemon, ceiling trialFunc) *pairResult {
	p := &pairResult{}
	for i := range trials {
		var rd, rc loadResult
		var dCPU, cCPU time.Duration
		runD := func() { rd, dCPU = daemon(i) }
		runC := func() { rc, cCPU = ceiling(i) }
		if i%2 == 0 {
			runD()
			runC()
		} else {
			runC()
			runD()
		}
		progress("%s trial %d/%d: daemon %s (%s, %d failed), ceiling %s (%s, %d failed)", label, i+1, trials,
			fmtRate(rd.rate()), rd.lats, rd.failed, fmtRate(rc.rate()), rc.lats, rc.failed)
		p.add(rd, rc, dCPU, cCPU)
	}
	return p
}

// ingress is the ingress section (issue 14): the concurrency sweep, the
// daemon's loopback ingress against the bare net/http ceiling at each
// producer count, then the p99 in an open loop at half the daemon's rate
// at -c producers, against the ceiling's p99 at that same offered rate.
func (b *bench) ingress() error {
	cfg := b.cfg
	// A long heartbeat keeps re-assertions of the growing re-sync set out of
	// the figures; the memory run keeps the default.
	d, err := startDaemon(b.bin, b.root, daemonOpts{name: "ingress", ident: b.node, ingress: true, metrics: b.hasMetrics, resyncInterval: time.Hour})
	if err != nil {
		return err
	}
	defer b.stopDaemon(d)
	ceil, err := startCeiling()
	if err != nil {
		return err
	}
	defer ceil.close()
	dURL, cURL := "http://"+d.ingressAddr+ingressPath, "http://"+ceil.addr+ingressPath

	var rateAtC float64
	for _, c := range sweepCounts(cfg.sweep, cfg.c) {
		p := b.ingressAt(d, ceil, dURL, cURL, c)
		if c == cfg.c {
			rateAtC = median(p.dRate)
		}
	}
	b.tbl.note("ingress: the ceiling server is a process of its own, like the daemon; the producers run in the harness process; at each C the daemon's and the ceiling's trials interleave, and a ratio is the median of the per-trial ratios")
	b.ingressHalfRate(dURL, cURL, rateAtC)
	if n := d.errorLines.Load(); n > 0 {
		b.tbl.note("ingress: the daemon logged %d errors", n)
	}
	return nil
}

// ingressAt is one point of the sweep: c closed-loop producers against the
// daemon and against the ceiling, cfg.trials times each, interleaved; it
// adds the point's rows and its target.
func (b *bench) ingressAt(d *daemon, ceil *ceilingServer, dURL, cURL string, c int) *pairResult {
	cfg := b.cfg
	client, closeIdle := producerClient(c)
	defer closeIdle()
	// Every C has workloads of its own, so no trial reports a workload at a
	// seq below the one an earlier trial left it at.
	prefix := "c" + strconv.Itoa(c) + "-"
	warm := min(cfg.t/5, 500*time.Millisecond)
	closedLoop(client, dURL, c, warm, lifecycleBody(prefix+"warm"))
	closedLoop(client, cURL, c, warm, lifecycleBody(prefix+"warm"))
	load := func(url string, i int) loadResult {
		return closedLoop(client, url, c, cfg.t, lifecycleBody(prefix+strconv.Itoa(i)))
	}
	p := runPair(cfg.trials, fmt.Sprintf("ingress C=%d", c),
		func(i int) (loadResult, time.Duration) {
			return withCPU(d.cmd.Process.Pid, func() loadResult { return load(dURL, i) })
		},
		func(i int) (loadResult, time.Duration) {
			return withCPU(ceil.cmd.Process.Pid, func() loadResult { return load(cURL, i) })
		})

	ratio, ok := ratioOf(p.ratio)
	r := row{section: "ingress",
		figure:   fmt.Sprintf("accepted frames/s, C=%d closed loop, median of %d x %s", c, cfg.trials, cfg.t),
		measured: fmtRate(median(p.dRate)), baseline: fmtRate(median(p.cRate)), ratio: fmtX(ratio)}
	if !ok {
		r.ratio = "-"
	}
	if least, has := ingressTarget(c); has {
		r.target, r.result = ">= "+fmtX(least), atLeast(ratio, ok, least)
		b.goals.set(ingressGoalName(c), r.target, ratioCell(r, ok, p), r.result)
	}
	b.tbl.add(r)
	b.tbl.add(cpuRow("ingress", fmt.Sprintf("  server CPU per accepted frame at C=%d (ratio: ceiling/daemon)", c), p.dCPU, p.cCPU))
	if c == cfg.c {
		b.tbl.add(row{section: "ingress", figure: fmt.Sprintf("  latency p50 / p99 / max at C=%d (medians)", c),
			measured: medianLats(p.dLats).String(), baseline: medianLats(p.cLats).String()})
	}
	for _, f := range p.failures {
		b.tbl.note("ingress C=%d: %s", c, f)
	}
	return p
}

// ratioCell is a target's figure for the summary block: the ratio, with
// the two figures it was taken from and the frames the daemon refused, if
// any, since a refusal is a frame the rate does not count.
func ratioCell(r row, ok bool, p *pairResult) string {
	if !ok {
		return "n/a"
	}
	cell := fmt.Sprintf("%s (%s vs %s", r.ratio, r.measured, r.baseline)
	if p.dFailed > 0 {
		cell += fmt.Sprintf("; daemon refused %d of %d", p.dFailed, p.dOK+p.dFailed)
	}
	return cell + ")"
}

// ingressHalfRate measures the p99 in an open loop at half the rate the
// daemon sustained at -c producers, on the daemon and on the ceiling at
// the same offered rate, interleaved: the latency target is their
// ratio, since a bare server on a shared 2-core machine misses an absolute
// figure too.
func (b *bench) ingressHalfRate(dURL, cURL string, rateAtC float64) {
	cfg := b.cfg
	half := rateAtC / 2
	if half <= 0 {
		b.tbl.add(row{section: "ingress", figure: "p99 latency at half the daemon's rate", measured: "n/a", result: unavailable})
		b.goals.set(halfRateGoalName, "<= "+fmtX(halfRateP99Ratio), "n/a (the daemon accepted nothing)", unavailable)
		return
	}
	client, closeIdle := producerClient(cfg.c)
	defer closeIdle()
	load := func(url string, i int) loadResult {
		return openLoop(client, url, cfg.c, half, cfg.t, lifecycleBody("half"+strconv.Itoa(i)))
	}
	p := runPair(cfg.trials, "ingress half-rate at "+fmtRate(half),
		func(i int) (loadResult, time.Duration) { return load(dURL, i), 0 },
		func(i int) (loadResult, time.Duration) { return load(cURL, i), 0 })

	dl, cl := medianLats(p.dLats), medianLats(p.cLats)
	ratio, ok := ratioOf(p.p99Ratios())
	r := row{section: "ingress",
		figure:   fmt.Sprintf("p99 latency, open loop at 0.5x the daemon's C=%d rate (%s offered to both)", cfg.c, fmtRate(half)),
		measured: fmtDur(dl.p99), baseline: fmtDur(cl.p99), ratio: fmtX(ratio),
		target: "<= " + fmtX(halfRateP99Ratio), result: atMost(ratio, ok, halfRateP99Ratio)}
	if !ok {
		r.ratio = "-"
	}
	b.tbl.add(r)
	b.goals.set(halfRateGoalName, r.target, ratioCell(r, ok, p), r.result)
	b.tbl.add(row{section: "ingress", figure: "  p50 / p99 / max at half rate (medians), achieved rate",
		measured: dl.String() + ", " + fmtRate(median(p.dRate)), baseline: cl.String() + ", " + fmtRate(median(p.cRate))})
	for _, f := range p.failures {
		b.tbl.note("ingress half rate: %s", f)
	}
}
