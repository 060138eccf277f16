package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The renewals section (issue 30): a daemon holds N leased ingress jobs
// and a few of them are renewed in a closed loop, the same frame again
// with its Workload-Lease header, as a producer renews at a third of its
// lease. What a renewal costs should depend on what changes, not on what
// is held, so the figure is the daemon's CPU per renewal at a small N and
// at a large one, and their ratio. Every (build, N) has a daemon of its
// own, filled once, and their trials interleave.

// renewPrefix names the held jobs.
const renewPrefix = "lease"

// leasedFrame appends held job j's frame: running, seq 1. A renewal is the
// same frame again.
func leasedFrame(buf []byte, j int) []byte {
	return appendLifecycle(buf, "workload:started", "running", renewPrefix, 0, j, 1)
}

// postLease sends one frame with a Workload-Lease header and reports
// whether it was accepted (200), and the status.
func postLease(client *http.Client, url string, body []byte, lease string) (bool, int, string) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false, 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Workload-Lease", lease)
	resp, err := client.Do(req)
	if err != nil {
		return false, 0, err.Error()
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, resp.StatusCode, fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return true, resp.StatusCode, ""
}

// knowsLeases reports whether the ingress at url reads Workload-Lease: one
// that does refuses a malformed header with 400, one that does not (the
// stock daemon, a build before leases) ignores it and answers 200. A
// build's flags cannot tell, since a lease is a header, not a flag.
func knowsLeases(url string) (bool, error) {
	client, closeIdle := producerClient(1)
	defer closeIdle()
	body := appendLifecycle(nil, "workload:started", "running", "lease-probe", 0, 0, 1)
	ok, status, why := postLease(client, url, body, "not-a-number")
	switch {
	case ok:
		return false, nil
	case status == http.StatusBadRequest:
		return true, nil
	}
	return false, fmt.Errorf("lease probe: %s", why)
}

// renewTarget returns which held job a producer's n-th renewal renews:
// producer w takes w, w+c, w+2c, ... of the first jobs, in turn, so each
// renewed job belongs to one producer when c divides jobs, and every one
// of them is renewed about as often.
func renewTarget(w, n, c, jobs int) int {
	return (w + n*c) % jobs
}

// fillLeased opens jobs 0..n-1 leased, from c producers, and returns the
// frames accepted, refused and the first refusal.
func fillLeased(client *http.Client, url string, c, n int, lease string) (ok, failed int64, firstErr string) {
	var (
		okN, failN atomic.Int64
		errOnce    sync.Once
		wg         sync.WaitGroup
	)
	for w := range c {
		wg.Go(func() {
			var buf []byte
			for j := w; j < n; j += c {
				buf = leasedFrame(buf[:0], j)
				if accepted, _, why := postLease(client, url, buf, lease); !accepted {
					failN.Add(1)
					errOnce.Do(func() { firstErr = why })
					continue
				}
				okN.Add(1)
			}
		})
	}
	wg.Wait()
	return okN.Load(), failN.Load(), firstErr
}

// renewLoop renews the first jobs of the held ones from c producers in a
// closed loop for d.
func renewLoop(client *http.Client, url string, c, jobs int, lease string, d time.Duration) loadResult {
	var (
		ok, failed atomic.Int64
		errOnce    sync.Once
		firstErr   string
		wg         sync.WaitGroup
	)
	lats := make([][]time.Duration, c)
	start := time.Now()
	stopAt := start.Add(d)
	for w := range c {
		wg.Go(func() {
			var buf []byte
			for n := 0; time.Now().Before(stopAt); n++ {
				buf = leasedFrame(buf[:0], renewTarget(w, n, c, jobs))
				t0 := time.Now()
				accepted, _, why := postLease(client, url, buf, lease)
				if !accepted {
					failed.Add(1)
					errOnce.Do(func() { firstErr = why })
					continue
				}
				ok.Add(1)
				lats[w] = append(lats[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	return loadResult{ok: ok.Load(), failed: failed.Load(), elapsed: time.Since(start),
		lats: summarize(flatten(lats)), firstError: firstErr}
}

// renewDaemon is one (build, N) of the section.
type renewDaemon struct {
	build *contestant
	held  int
	d     *daemon
	s     *series
}

// renewals is the renewals section.
func (b *bench) renewals() error {
	cfg := b.cfg
	lease := strconv.Itoa(cfg.renewLease)
	producers := min(cfg.c, cfg.renewJobs)
	held := slices.Clone(cfg.renewHeld)
	slices.Sort(held)
	held = slices.Compact(held)
	var runs []*renewDaemon
	for _, bc := range b.contestants(nil) {
		if miss := bc.lacks("--local-ingress"); len(miss) > 0 {
			if bc.role == roleThis {
				return fmt.Errorf("the daemon does not take %s", miss[0])
			}
			b.tbl.note("%s", skipLine("renewals", bc, miss))
			continue
		}
		for i, n := range held {
			d, err := startDaemon(bc.bin, b.root, bc.opts(daemonOpts{name: "renew-" + fmtCount(n), ident: b.node, ingress: true,
				metrics: bc.role == roleThis && b.hasMetrics, resyncInterval: time.Hour, maxLive: 2*n + 1000}))
			if err != nil {
				if err := b.buildFailed("renewals", bc, err); err != nil {
					return err
				}
				break
			}
			defer b.stopDaemon(d)
			url := "http://" + d.ingressAddr + ingressPath
			if i == 0 {
				knows, err := knowsLeases(url)
				if err != nil {
					if err := b.buildFailed("renewals", bc, err); err != nil {
						return err
					}
					break
				}
				if !knows {
					b.tbl.note("renewals: the %s build's ingress ignores Workload-Lease: skipped for it", bc.role)
					break
				}
			}
			client, closeIdle := producerClient(cfg.c)
			t0 := time.Now()
			ok, failed, why := fillLeased(client, url, cfg.c, n, lease)
			closeIdle()
			progress("renewals: %s build holds %d leased jobs (%d refused) after %s", bc.role, ok, failed, time.Since(t0).Round(time.Millisecond))
			if failed > 0 {
				b.tbl.note("renewals: the %s build refused %d of %d held jobs, first: %s", bc.role, failed, n, why)
			}
			runs = append(runs, &renewDaemon{build: bc, held: n, d: d, s: &series{role: bc.role}})
		}
	}
	client, closeIdle := producerClient(producers)
	defer closeIdle()
	fns := make([]trialFunc, len(runs))
	for i, r := range runs {
		url := "http://" + r.d.ingressAddr + ingressPath
		renewLoop(client, url, producers, cfg.renewJobs, lease, min(cfg.t/5, 500*time.Millisecond)) // warm-up
		fns[i] = func(int) (loadResult, time.Duration) {
			return withCPU(r.d.cmd.Process.Pid, func() loadResult { return renewLoop(client, url, producers, cfg.renewJobs, lease, cfg.t) })
		}
	}
	for i, res := range runGroup(cfg.trials, fns) {
		line := fmt.Sprintf("renewals trial %d/%d:", i+1, cfg.trials)
		for j, t := range res {
			runs[j].s.add(t)
			line += fmt.Sprintf(" %s N=%s %s %s/renewal;", runs[j].build.role, fmtCount(runs[j].held), fmtRate(t.load.rate()), fmtMicros(t.cpu))
		}
		progress("%s", line)
	}
	find := func(role string, n int) *series {
		for _, r := range runs {
			if r.build.role == role && r.held == n {
				return r.s
			}
		}
		return nil
	}
	for _, n := range held {
		this, base := find(roleThis, n), find(roleBaseline, n)
		rr := row{section: "renewals", figure: fmt.Sprintf("leased renewals/s, %s held, %d renewed by %d producers, median of %d x %s", fmtCount(n), cfg.renewJobs, producers, cfg.trials, cfg.t),
			measured: fmtRate(median(this.rate))}
		cr := row{section: "renewals", figure: fmt.Sprintf("  daemon CPU per renewal, %s held", fmtCount(n)), measured: fmtMicros(medianDuration(this.cpu))}
		if base != nil {
			compareSeries(this, base, nil).baseCells(&rr, &cr)
		}
		b.tbl.add(rr)
		b.tbl.add(cr)
		for _, s := range []*series{this, base} {
			if s != nil {
				for _, f := range s.failures {
					b.tbl.note("renewals %s held: %s", fmtCount(n), f)
				}
			}
		}
	}
	if lo, hi := held[0], held[len(held)-1]; lo != hi {
		growth := func(role string) (float64, bool) {
			a, z := find(role, lo), find(role, hi)
			if a == nil || z == nil {
				return 0, false
			}
			return ratioOf(trialRatios(durations(z.cpu), durations(a.cpu)))
		}
		g, ok := growth(roleThis)
		r := row{section: "renewals", figure: fmt.Sprintf("CPU per renewal, %s held over %s held (per-trial ratios, median)", fmtCount(hi), fmtCount(lo)),
			measured: optX(g, ok), target: "<= " + fmtX(renewGrowth), result: atMost(g, ok, renewGrowth)}
		if bg, bok := growth(roleBaseline); find(roleBaseline, lo) != nil {
			r.base = optX(bg, bok)
		}
		b.tbl.add(r)
		b.goals30.set(renewGoalName, r.target, fmt.Sprintf("%s (%s at %s, %s at %s)", r.measured,
			fmtMicros(medianDuration(find(roleThis, hi).cpu)), fmtCount(hi), fmtMicros(medianDuration(find(roleThis, lo).cpu)), fmtCount(lo)), r.result)
	}
	b.tbl.note("renewals: every (build, held) pair has a daemon of its own, filled once with leased running jobs (Workload-Lease %s) and --max-live-workloads 2N+1000 where the build takes it; a renewal is the same frame again with the header; trials interleave", lease)
	return nil
}

// renewGrowth is issue 30's bound on CPU per leased renewal from 1,000 to
// 100,000 held jobs.
const renewGrowth = 1.20
