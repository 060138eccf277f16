// Command producer is an example third-party workload producer: it reports
// one job's lifecycle (submitted, started, completed) to a node's loopback
// ingress through the Go client, wlmclient, the way an external scheduler
// or a local inference harness would.
//
//	go -C examples/producer run . --addr 127.0.0.1:14324
//
// Everything a producer must get right is the client's: the job's frames
// go in order with a rising seq and the method that carries their state;
// the id cannot collide with another process's; originatedFrom is left to
// the daemon; a 5xx, a 408, a 429 or a refused connection is retried with
// backoff that honours Retry-After, and any other 4xx is a bug in the
// producer, never retried (this example prints the daemon's one-line reason
// and exits with status 2); the queued and running frames carry a lease
// renewed while the job runs, which the completed frame ends.
//
//	go -C examples/producer run . --lease 5s --abandon   # report, then "crash": the job turns failed after 5 s
//
// It is a module of its own so that it imports the client exactly as a
// producer outside this repository does (see its go.mod).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("producer", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a bad flag is one line of ours (flagError); --help goes to stdout
	addr := fs.String("addr", wlmclient.DefaultAddr, "the node's loopback ingress, HOST:PORT")
	id := fs.String("id", "", "the job id (default: one the client mints, which no other process can)")
	model := fs.String("model", "qwen3-8b", "the model the job runs")
	engine := fs.String("engine", "llamacpp", "the engine the job runs on")
	work := fs.Duration("work", time.Second, "how long the job 'runs' between started and completed")
	attempts := fs.Int("attempts", 6, "attempts per frame before giving up on 5xx or connection errors; 0: until --flush runs out")
	backoff := fs.Duration("backoff", 200*time.Millisecond, "first retry delay; doubled on each retry, up to 10s")
	leaseFor := fs.Duration("lease", 30*time.Second, "the lease on the queued and running frames, whole seconds from 5s to 24h; renewed at a third of it while the job runs; 0 reports without a lease")
	abandon := fs.Bool("abandon", false, "exit after reporting the job running, without closing it, as a crashed producer would: its lease retires it")
	flush := fs.Duration("flush", time.Minute, "how long to wait at the end for the frames to be sent")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, "usage: producer [flags]\n\nReports one job's life (queued, running, completed) to a node's local ingress.\n\n")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(stderr, "producer: %s\n", flagError(fs, err))
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "producer: unexpected argument %q (--help lists the flags)\n", fs.Arg(0))
		return 2
	}
	if _, _, err := net.SplitHostPort(*addr); err != nil {
		fmt.Fprintf(stderr, "producer: --addr %q: not HOST:PORT, like 127.0.0.1:14324\n", *addr)
		return 2
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--work", *work}, {"--backoff", *backoff}, {"--flush", *flush}} {
		if d.v < 0 {
			fmt.Fprintf(stderr, "producer: %s %s: must not be negative\n", d.flag, d.v)
			return 2
		}
	}
	if *leaseFor != 0 && (*leaseFor < 5*time.Second || *leaseFor > 24*time.Hour || *leaseFor%time.Second != 0) {
		fmt.Fprintf(stderr, "producer: --lease %s: must be whole seconds from 5s to 24h, or 0\n", *leaseFor)
		return 2
	}
	lease := *leaseFor
	if lease == 0 {
		lease = -1 // the client's "no lease"
	}
	c, err := wlmclient.New(wlmclient.Config{
		Addr: *addr, Producer: "example-producer", Lease: lease,
		MaxAttempts: max(*attempts, 0), BackoffMin: max(*backoff, time.Millisecond), BackoffMax: 10 * time.Second,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintf(stderr, "producer: %v\n", err)
		return 2
	}
	job, err := c.Submit(context.Background(), wlmclient.JobSpec{ID: *id, Model: *model, Engine: *engine})
	if err != nil {
		fmt.Fprintf(stderr, "producer: %v\n", err)
		return 2
	}
	job.Start()
	if *abandon {
		fmt.Fprintf(stdout, "abandoned %s while running: its lease of %s retires it\n", job.ID(), *leaseFor)
	} else {
		time.Sleep(*work) // the job runs; the client renews its lease meanwhile
		job.Complete()
	}
	ctx, cancel := context.WithTimeout(context.Background(), *flush)
	defer cancel()
	closeErr := c.Close(ctx)
	s := c.Stats()
	fmt.Fprintf(stdout, "%s: %d frames sent, %d retries, %d refused, %d dropped\n", job.ID(), s.Sent, s.Retried, s.Refused, s.Dropped)
	var refused *wlmclient.StatusError
	switch err := job.Err(); {
	case errors.As(err, &refused) && refused.Status >= 400 && refused.Status < 500 && s.Refused > 0:
		fmt.Fprintf(stderr, "producer: the daemon refused %s (%d %s): %s\n", refused.Method, refused.Status, http.StatusText(refused.Status), refused.Reason)
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "producer: giving up: %v\n", err)
		return 1
	case closeErr != nil:
		fmt.Fprintf(stderr, "producer: %v\n", closeErr)
		return 1
	}
	return 0
}

// badValue matches the flag package's error for a value a flag refuses:
// `invalid value "x" for flag -name: ...` (`invalid boolean value "x" for
// -name: ...` for a bool).
var badValue = regexp.MustCompile(`^invalid (?:boolean )?value ("(?:[^"\\]|\\.)*") for (?:flag )?-([^:]+):`)

// flagError turns a failed Parse's error into one line that names the flag
// with two dashes, as --help spells it, and says what it takes. The example
// is a module of its own, so it cannot share the daemon's internal/cliflags;
// the flag package has only three such errors to say again.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return fmt.Sprintf("--%s needs a value (--help lists the flags)", name)
	}
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return fmt.Sprintf("unknown flag --%s (--help lists the flags)", name)
	}
	m := badValue.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	want := "a valid value"
	if f := fs.Lookup(m[2]); f != nil {
		if g, ok := f.Value.(flag.Getter); ok {
			switch g.Get().(type) {
			case time.Duration:
				want = "a duration, like 30s"
			case int:
				want = "a whole number"
			case bool:
				want = "true or false"
			}
		}
	}
	return fmt.Sprintf("--%s: %s is not %s", m[2], m[1], want)
}
