package main

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// memFramesPerWorkload is the memory run's frames per workload: queued,
// running, running (progress), a terminal state, then a removal for nine
// workloads in ten and a repeated terminal update for the tenth, which stays
// in the re-sync set for its retention window.
const memFramesPerWorkload = 5

// memResult is what the memory run measured.
type memResult struct {
	ok, failed     int64
	firstError     string
	elapsed        time.Duration
	rssStartKB     int64
	peakKB         int64 // VmHWM at the end: the peak over the process's life
	rssEndKB       int64
	goroutinesPre  int
	goroutinesPost int
	goroutineErr   error
}

// memoryLoad drives workloads workloads through memFramesPerWorkload frames
// each over the ingress, from c producers. Each producer takes its
// workloads in chunks of live/c and walks a whole chunk through one phase
// before the next, so about live workloads are open at any time.
func memoryLoad(client *http.Client, url string, c, workloads, live int, onProgress func(done int64)) (ok, failed int64, firstErr string) {
	chunk := max(1, live/c)
	var (
		okN, failN atomic.Int64
		errOnce    sync.Once
		wg         sync.WaitGroup
	)
	for w := range c {
		wg.Go(func() {
			var mine []int // this producer's workloads: w, w+c, w+2c, ...
			for j := w; j < workloads; j += c {
				mine = append(mine, j)
			}
			var buf []byte
			for lo := 0; lo < len(mine); lo += chunk {
				part := mine[lo:min(lo+chunk, len(mine))]
				for phase := range memFramesPerWorkload {
					for _, j := range part {
						buf = memFrame(buf[:0], phase, j)
						accepted, why := post(client, url, buf)
						if !accepted {
							failN.Add(1)
							errOnce.Do(func() { firstErr = why })
							continue
						}
						if n := okN.Add(1); n%20000 == 0 && onProgress != nil {
							onProgress(n)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	return okN.Load(), failN.Load(), firstErr
}

// memFrame appends the phase-th frame of workload j.
func memFrame(buf []byte, phase, j int) []byte {
	const prefix = "mem"
	switch phase {
	case 0:
		return appendLifecycle(buf, "workload:submitted", "queued", prefix, 0, j, 1)
	case 1:
		return appendLifecycle(buf, "workload:started", "running", prefix, 0, j, 2)
	case 2:
		return appendLifecycle(buf, "workload:started", "running", prefix, 0, j, 3)
	case 3:
		if j%7 == 0 {
			return appendLifecycle(buf, "workload:errored", "failed", prefix, 0, j, 4)
		}
		return appendLifecycle(buf, "workload:completed", "completed", prefix, 0, j, 4)
	default:
		if j%10 == 0 {
			return appendLifecycle(buf, "workload:completed", "completed", prefix, 0, j, 5)
		}
		return appendRemove(buf, prefix, 0, j)
	}
}

// liveRSS is the memory section's RSS per live workload (issue 30): each
// build's daemon is filled with -mem-rss-live running ingress jobs, one
// frame each, and what its RSS grew by, per job, less the mean frame's
// bytes, is what holding a workload costs beyond the frame it must keep.
// Builds run one after another: a figure of memory, not of time, does not
// drift with another process's load.
func (b *bench) liveRSS() error {
	cfg := b.cfg
	n := cfg.memRSSLive
	var thisBeyond float64
	for _, bc := range b.contestants(nil) {
		if miss := bc.lacks("--local-ingress"); len(miss) > 0 {
			if bc.role == roleThis {
				return fmt.Errorf("the daemon does not take %s", miss[0])
			}
			b.tbl.note("%s", skipLine("memory", bc, miss))
			continue
		}
		r, err := b.liveRSSOf(bc, n)
		if err != nil {
			if err := b.buildFailed("memory", bc, err); err != nil {
				return err
			}
			continue
		}
		progress("memory: %s build, %d live jobs: RSS %s -> %s, %.0f bytes each, %.0f beyond a %.0f-byte frame",
			bc.role, r.live, mib(r.startKB), mib(r.endKB), r.perLive(), r.beyond(), r.frameBytes)
		if r.failed > 0 {
			b.tbl.note("memory: the %s build refused %d of %d live jobs, first: %s", bc.role, r.failed, n, r.firstErr)
		}
		cell := fmt.Sprintf("%.0f B (%.0f B each, %s -> %s)", r.beyond(), r.perLive(), mib(r.startKB), mib(r.endKB))
		switch bc.role {
		case roleThis:
			thisBeyond = r.beyond()
			b.tbl.add(row{section: "memory", figure: fmt.Sprintf("RSS per live workload beyond its frame's %.0f bytes, %s live ingress jobs", r.frameBytes, fmtCount(n)),
				measured: cell, target: fmt.Sprintf("<= %d B", issue30RSSBeyond), result: check(r.live > 0 && r.failed == 0 && r.beyond() <= issue30RSSBeyond)})
			b.goals30.set(rssGoalName, fmt.Sprintf("<= %d B", issue30RSSBeyond), fmt.Sprintf("%s at %s live", cell, fmtCount(n)), b.tbl.rows[len(b.tbl.rows)-1].result)
		case roleBaseline:
			last := &b.tbl.rows[len(b.tbl.rows)-1]
			last.base = fmt.Sprintf("%.0f B", r.beyond())
			if r.beyond() > 0 {
				last.vsBase = fmtX(thisBeyond / r.beyond())
			}
		case roleStock:
			b.tbl.add(row{section: "stock", figure: fmt.Sprintf("  memory: RSS per live workload beyond its frame, %s live", fmtCount(n)),
				measured: fmt.Sprintf("%.0f B", thisBeyond), baseline: cell + " stock"})
		}
	}
	b.tbl.note("memory: RSS per live workload = (VmRSS after the fill and 2 s of rest - VmRSS before) / jobs accepted; beyond its frame = that less the mean frame body posted; --max-live-workloads 2N+1000 where the build takes it")
	return nil
}

// rssResult is one build's fill.
type rssResult struct {
	live, failed   int64
	firstErr       string
	startKB, endKB int64
	frameBytes     float64 // the mean frame body posted
}

// perLive is the RSS growth per accepted job, in bytes.
func (r rssResult) perLive() float64 {
	if r.live <= 0 {
		return 0
	}
	return float64(r.endKB-r.startKB) * 1024 / float64(r.live)
}

// beyond is perLive less the frame's own bytes, which the daemon must hold
// to re-assert the job.
func (r rssResult) beyond() float64 { return r.perLive() - r.frameBytes }

// liveRSSOf fills one daemon of build bc with n live jobs.
func (b *bench) liveRSSOf(bc *contestant, n int) (rssResult, error) {
	cfg := b.cfg
	var r rssResult
	d, err := startDaemon(bc.bin, b.root, bc.opts(daemonOpts{name: "memory-live", ident: b.node, ingress: true,
		resyncInterval: time.Hour, maxLive: 2*n + 1000}))
	if err != nil {
		return r, err
	}
	defer b.stopDaemon(d)
	time.Sleep(time.Second)
	st, err := d.procStatus()
	if err != nil {
		return r, err
	}
	r.startKB = st["VmRSS"]
	client, closeIdle := producerClient(cfg.c)
	defer closeIdle()
	url := "http://" + d.ingressAddr + ingressPath
	var (
		okN, failN, bytesN atomic.Int64
		errOnce            sync.Once
		wg                 sync.WaitGroup
	)
	for w := range cfg.c {
		wg.Go(func() {
			var buf []byte
			for j := w; j < n; j += cfg.c {
				buf = appendLifecycle(buf[:0], "workload:started", "running", "live", 0, j, 1)
				if accepted, why := post(client, url, buf); !accepted {
					failN.Add(1)
					errOnce.Do(func() { r.firstErr = why })
					continue
				}
				okN.Add(1)
				bytesN.Add(int64(len(buf)))
			}
		})
	}
	wg.Wait()
	r.live, r.failed = okN.Load(), failN.Load()
	if r.live > 0 {
		r.frameBytes = float64(bytesN.Load()) / float64(r.live)
	}
	time.Sleep(2 * time.Second)
	if st, err = d.procStatus(); err != nil {
		return r, err
	}
	r.endKB = st["VmRSS"]
	return r, nil
}
