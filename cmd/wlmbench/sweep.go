package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
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
	p, _ := runFigure(trials, label, daemon, ceiling, nil)
	return p
}

// other is a build beside this one in a figure: its role and its trials.
type other struct {
	role  string
	trial trialFunc
}

// runFigure runs trials of this build's daemon, the ceiling and the other
// builds' daemons, interleaved (see interleave), and returns the daemon
// against the ceiling, and every server's series: this build's, the
// ceiling's, then the others' in order.
func runFigure(trials int, label string, daemon, ceiling trialFunc, others []other) (*pairResult, []*series) {
	fns := []trialFunc{daemon, ceiling}
	all := []*series{{role: roleThis}, {role: "ceiling"}}
	for _, o := range others {
		fns = append(fns, o.trial)
		all = append(all, &series{role: o.role})
	}
	p := &pairResult{}
	for i, res := range runGroup(trials, fns) {
		rd, rc := res[0], res[1]
		line := fmt.Sprintf("%s trial %d/%d: daemon %s (%s, %d failed), ceiling %s (%s, %d failed)", label, i+1, trials,
			fmtRate(rd.load.rate()), rd.load.lats, rd.load.failed, fmtRate(rc.load.rate()), rc.load.lats, rc.load.failed)
		for j, r := range res {
			all[j].add(r)
			if j >= 2 {
				line += fmt.Sprintf(", %s %s (%d failed)", all[j].role, fmtRate(r.load.rate()), r.load.failed)
			}
		}
		progress("%s", line)
		p.add(rd.load, rc.load, rd.cpu, rc.cpu)
	}
	return p, all
}

// compareRows fills the -baseline columns of a path's rate and CPU rows
// and returns its rows against the stock daemon, from the series
// runFigure returned.
func compareRows(path string, all []*series, rate, cpu *row) []row {
	var out []row
	for _, s := range all[2:] {
		switch s.role {
		case roleBaseline:
			compareSeries(all[0], s, all[1]).baseCells(rate, cpu)
		case roleStock:
			out = append(out, stockRows(path, all[0], s)...)
		}
	}
	return out
}

// ingress is the ingress section (issues 14, 30 and 39): for each mode and
// each producer count of the sweep, the daemon's loopback ingress against
// the bare net/http ceiling and the durable ceiling (and the -baseline
// build and the stock daemon, when asked for), in each of this build's
// fsync modes, interleaved; then the p99 in an open loop at half the
// daemon's rate at -c producers, against the ceiling's p99 at that same
// offered rate.
func (b *bench) ingress() error {
	cfg := b.cfg
	var builds []*contestant
	for _, c := range b.contestants(nil) {
		if miss := c.lacks("--local-ingress"); len(miss) > 0 {
			if c.role == roleThis {
				return fmt.Errorf("the daemon does not take %s", miss[0])
			}
			b.tbl.note("%s", skipLine("ingress", c, miss))
			continue
		}
		builds = append(builds, c)
	}
	if miss := b.this.lacks("--journal-fsync"); len(miss) > 0 && !slices.Equal(cfg.fsyncModes, []string{fsyncAlways}) {
		return fmt.Errorf("the daemon does not take --journal-fsync: run -journal-fsync %s", fsyncAlways)
	}
	ceil, err := startCeiling()
	if err != nil {
		return err
	}
	defer ceil.close()
	ceils := ingressCeilings{bare: ceil, durable: map[string]*ceilingServer{}}
	if cfg.minimalHTTP {
		if ceils.minimal, err = startMinimalCeiling(); err != nil {
			return err
		}
		defer ceils.minimal.close()
	}
	for _, m := range cfg.fsyncModes {
		dc, err := startDurableCeiling(b.root, m)
		if err != nil {
			return err
		}
		defer dc.close()
		ceils.durable[m] = dc
	}

	var rateAtC float64
	for _, mode := range cfg.ingressModes {
		for _, c := range sweepCounts(cfg.sweep, cfg.c) {
			p, err := b.ingressAt(builds, ceils, mode, c)
			if err != nil {
				return err
			}
			if c == cfg.c && (rateAtC == 0 || mode == modeCycling) {
				rateAtC = median(p.dRate)
			}
		}
	}
	b.tbl.note("ingress: the ceiling server is a process of its own, like the daemon; the producers run in the harness process; at each point the servers' trials interleave (the first rotates), and a ratio is the median of the per-trial ratios")
	b.tbl.note("ingress modes: cycling = each producer reports %d jobs of its own in turn with a rising seq; new = every frame opens a new job; every point starts fresh daemons with --max-live-workloads %d where the build takes it, so the live bound's 503s are not what is measured", ingressPool, cfg.ingressMaxLive)
	b.tbl.note("ingress: the durable ceiling is the bare ceiling with each frame made durable before its 200: a checksummed record (length, CRC32-C, body) appended under a short lock, one writer goroutine writing each pending group with one write and one fsync (group commit); with a duration D it answers once the group is written and fsyncs at most D after the first group written since the last fsync, as the daemon's --journal-fsync D does. Its file is under %s, beside the daemons' app dirs", b.root)
	b.tbl.note("ingress: this build runs with --journal-fsync %s (the first mode's rows are the ones issues 14 and 30 read); the -baseline build and the stock daemon with their defaults", strings.Join(cfg.fsyncModes, ", then "))
	// A long heartbeat keeps re-assertions of the growing re-sync set out of
	// the figures; the memory run keeps the default.
	d, err := startDaemon(b.bin, b.root, b.this.opts(daemonOpts{name: "ingress-half", ident: b.node, ingress: true, metrics: b.hasMetrics, resyncInterval: time.Hour, maxLive: cfg.ingressMaxLive, fsync: cfg.fsyncModes[0]}))
	if err != nil {
		return err
	}
	defer b.stopDaemon(d)
	b.ingressHalfRate("http://"+d.ingressAddr+ingressPath, "http://"+ceil.addr+ingressPath, rateAtC)
	return nil
}

// ingressCeilings are the servers the ingress is measured against: the
// bare net/http ceiling and a durable ceiling per fsync mode.
type ingressCeilings struct {
	bare    *ceilingServer
	durable map[string]*ceilingServer
	minimal *ceilingServer // -minimal-http; nil when not asked for
}

// ingressBody returns the frames of an ingress mode.
func ingressBody(mode, prefix string) bodyFunc {
	if mode == modeNew {
		return newJobBody(prefix)
	}
	return lifecycleBody(prefix)
}

// newJobBody returns frames that each open a job of their own: a producer's
// n-th frame starts prefix-worker-n, as a producer that runs many short
// jobs reports them, so every frame grows the set of live jobs.
func newJobBody(prefix string) bodyFunc {
	return func(buf []byte, worker, n int) []byte {
		return appendLifecycle(buf, "workload:started", "running", prefix, worker, n, 1)
	}
}

// ingressPoint names a point of the sweep in rows and goals: the cycling
// mode keeps issue 14's names.
func ingressPoint(mode string, c int) string {
	if mode == modeNew {
		return fmt.Sprintf("C=%d, new job per frame", c)
	}
	return fmt.Sprintf("C=%d", c)
}

// ingressServer is one server of an ingress point: its role in the table,
// its process and its URL.
type ingressServer struct {
	role string
	pid  int
	url  string
}

// ingressAt is one point of the sweep: c closed-loop producers in one mode
// against fresh daemons of each build (this one in each fsync mode) and
// against the ceilings, cfg.trials times each, interleaved; it adds the
// point's rows and its targets.
func (b *bench) ingressAt(builds []*contestant, ceils ingressCeilings, mode string, c int) (*pairResult, error) {
	cfg := b.cfg
	point := ingressPoint(mode, c)
	// This build once per fsync mode, then the other builds.
	type start struct {
		bc    *contestant
		role  string
		fsync string
	}
	var starts []start
	for i, m := range cfg.fsyncModes {
		role := roleThis
		if i > 0 {
			role = thisInMode(m)
		}
		starts = append(starts, start{builds[0], role, m})
	}
	for _, bc := range builds[1:] {
		starts = append(starts, start{bc, bc.role, ""})
	}
	url := func(addr string) string { return "http://" + addr + ingressPath }
	var servers []ingressServer // the daemons, this build's first
	var thisD *daemon           // this build's daemon in the first mode, for its collector's figures
	for _, st := range starts {
		name := fmt.Sprintf("ingress-%s-%d", mode, c)
		if st.role != roleThis && st.bc.role == roleThis {
			name += "-fsync-" + st.fsync
		}
		d, err := startDaemon(st.bc.bin, b.root, st.bc.opts(daemonOpts{name: name, ident: b.node, fsync: st.fsync,
			ingress: true, metrics: st.role == roleThis && b.hasMetrics, resyncInterval: time.Hour, maxLive: cfg.ingressMaxLive}))
		if err != nil {
			if err := b.buildFailed("ingress "+point, st.bc, err); err != nil {
				return nil, err
			}
			continue
		}
		defer b.stopDaemon(d)
		defer b.noteDaemonErrors("ingress "+point, st.role, d)
		servers = append(servers, ingressServer{role: st.role, pid: d.cmd.Process.Pid, url: url(d.ingressAddr)})
		if st.role == roleThis {
			thisD = d
		}
	}
	// The figure's servers: this build, the bare ceiling, the durable
	// ceilings, then the others.
	all := []ingressServer{servers[0], {role: "ceiling", pid: ceils.bare.cmd.Process.Pid, url: url(ceils.bare.addr)}}
	for _, m := range cfg.fsyncModes {
		dc := ceils.durable[m]
		all = append(all, ingressServer{role: durableRole(m), pid: dc.cmd.Process.Pid, url: url(dc.addr)})
	}
	if ceils.minimal != nil {
		all = append(all, ingressServer{role: minimalRole, pid: ceils.minimal.cmd.Process.Pid, url: url(ceils.minimal.addr)})
	}
	all = append(all, servers[1:]...)

	client, closeIdle := producerClient(c)
	defer closeIdle()
	prefix := mode[:1] + strconv.Itoa(c) + "-"
	warm := min(cfg.t/5, 500*time.Millisecond)
	for _, s := range all {
		closedLoop(client, s.url, c, warm, ingressBody(mode, prefix+"warm"))
	}
	// Every trial has workloads of its own, so no trial reports a workload
	// at a seq below the one an earlier trial left it at.
	trialOn := func(s ingressServer) trialFunc {
		return func(i int) (loadResult, time.Duration) {
			return withCPU(s.pid, func() loadResult {
				return closedLoop(client, s.url, c, cfg.t, ingressBody(mode, prefix+strconv.Itoa(i)))
			})
		}
	}
	var others []other
	for _, s := range all[2:] {
		others = append(others, other{role: s.role, trial: trialOn(s)})
	}
	gcBefore, gcOK := b.collectorCPU(thisD)
	p, series := runFigure(cfg.trials, "ingress "+point, trialOn(all[0]), trialOn(all[1]), others)
	if gcAfter, ok := b.collectorCPU(thisD); ok && gcOK {
		b.collectorRow(point, gcAfter-gcBefore, series[0])
	}

	ratio, ok := ratioOf(p.ratio)
	r := row{section: "ingress",
		figure:   fmt.Sprintf("accepted frames/s, %s closed loop, median of %d x %s", point, cfg.trials, cfg.t),
		measured: fmtRate(median(p.dRate)), baseline: fmtRate(median(p.cRate)), ratio: fmtX(ratio)}
	if !ok {
		r.ratio = "-"
	}
	if least, has := ingressTarget(c); has {
		r.target, r.result = ">= "+fmtX(least), atLeast(ratio, ok, least)
		b.goals.set(ingressGoalName(c)+strings.TrimPrefix(point, fmt.Sprintf("C=%d", c)), r.target, ratioCell(r, ok, p), r.result)
	}
	if slices.Contains(issue14Producers, c) {
		b.goals30.set(ingress30GoalName(mode, c), ">= "+fmtX(issue30IngressRatio), ratioCell(r, ok, p), atLeast(ratio, ok, issue30IngressRatio))
	}
	cr := cpuRow("ingress", fmt.Sprintf("  server CPU per accepted frame at %s (ratio: ceiling/daemon)", point), p.dCPU, p.cCPU)
	stock := compareRows("ingress "+point, series, &r, &cr)
	b.stockGoals(stock)
	b.tbl.add(r)
	b.tbl.add(cr)
	if c == cfg.c {
		b.tbl.add(row{section: "ingress", figure: fmt.Sprintf("  latency p50 / p99 / max at %s (medians)", point),
			measured: medianLats(p.dLats).String(), baseline: medianLats(p.cLats).String()})
	}
	for _, sr := range stock {
		b.tbl.add(sr)
	}
	b.fsyncRows(point, c, series)
	b.minimalRows(point, series)
	for _, f := range p.failures {
		b.tbl.note("ingress %s: %s", point, f)
	}
	for _, s := range series[2:] {
		for _, f := range s.failures {
			b.tbl.note("ingress %s: %s", point, f)
		}
	}
	return p, nil
}

// noteDaemonErrors notes the error lines a daemon logged, if any.
func (b *bench) noteDaemonErrors(what, role string, d *daemon) {
	if n := d.errorLines.Load(); n > 0 {
		b.tbl.note("%s: the %s daemon logged %d errors", what, role, n)
	}
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
// the same offered rate, interleaved: the issue's latency target is their
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
