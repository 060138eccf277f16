// Command cpuburn keeps every core busy for a bounded time, so that CI can
// run the tests once more on a loaded machine: a test that passes only
// when the machine is idle (one that sleeps and hopes, or counts before a
// write has landed) then fails in CI instead of on a user's busy laptop.
//
//	go run ./internal/dev/cpuburn --duration 15m --ready /tmp/cpuburn.ready
//
// It stops by itself when --duration has passed, so a CI script that dies
// before it stops the burner leaves no process spinning for long; SIGINT
// and SIGTERM stop it at once. It writes nothing but one line at the start
// and one at the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxDuration bounds --duration: whatever CI passes, the burner is gone
// within an hour.
const maxDuration = time.Hour

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// config is the parsed command line.
type config struct {
	duration time.Duration
	workers  int
	ready    string
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("cpuburn", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&c.duration, "duration", 15*time.Minute, fmt.Sprintf("stop after this long (at most %s)", maxDuration))
	fs.IntVar(&c.workers, "workers", runtime.NumCPU(), "busy goroutines, one per core by default")
	fs.StringVar(&c.ready, "ready", "", "write this file once every worker spins (a script waits for it)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.duration <= 0 || c.duration > maxDuration:
		return c, fmt.Errorf("--duration %s: must be more than 0 and at most %s", c.duration, maxDuration)
	case c.workers < 1 || c.workers > 256:
		return c, fmt.Errorf("--workers %d: must be between 1 and 256", c.workers)
	}
	return c, nil
}

// run burns until the duration has passed or ctx ends; it returns the exit
// status: 0 when it ran, 2 for a bad flag, 1 when it could not start.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseFlags(args, stderr)
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "cpuburn: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, c.duration)
	defer cancel()
	start := time.Now()
	var readyErr error
	spins := burn(ctx, c.workers, func() {
		fmt.Fprintf(stdout, "cpuburn: %d workers busy for at most %s (pid %d)\n", c.workers, c.duration, os.Getpid())
		if c.ready != "" {
			// A script that cannot learn the burner runs must not wait on
			// it: stop at once and fail.
			if readyErr = os.WriteFile(c.ready, []byte(fmt.Sprintln(os.Getpid())), 0o644); readyErr != nil {
				cancel()
			}
		}
	})
	if readyErr != nil {
		fmt.Fprintf(stderr, "cpuburn: %v\n", readyErr)
		return 1
	}
	fmt.Fprintf(stdout, "cpuburn: stopped after %s, %d spins\n", time.Since(start).Round(time.Millisecond), spins)
	return 0
}

// burn runs workers busy goroutines until ctx ends and returns how many
// spins of work they did in all. started is called once every worker runs.
func burn(ctx context.Context, workers int, started func()) uint64 {
	var total atomic.Uint64
	var running, wg sync.WaitGroup
	running.Add(workers)
	for range workers {
		wg.Go(func() {
			running.Done()
			total.Add(spin(ctx))
		})
	}
	running.Wait()
	started()
	wg.Wait()
	return total.Load()
}

// spin does pure CPU work until ctx ends, checking it every few thousand
// iterations so it stops within microseconds, and returns how many rounds
// it did. It allocates nothing: the point is the cores, not the collector.
func spin(ctx context.Context) uint64 {
	done := ctx.Done()
	x, rounds := uint64(1), uint64(0)
	for {
		for range 1 << 14 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
		rounds++
		select {
		case <-done:
			sink.Store(x)
			return rounds
		default:
		}
	}
}

// sink keeps the compiler from removing spin's loop.
var sink atomic.Uint64
