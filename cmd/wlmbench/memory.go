package main

import (
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
