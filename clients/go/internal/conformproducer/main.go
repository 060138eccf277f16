// Command conformproducer is the Go client's conformance producer (issue 23,
// item 5): it drives wlmclient the way a real producer drives its reports
// (many jobs at once, the steps of one job run back to back by whichever of
// several goroutines takes them, leases, a member named for scheduledOn, an
// outbox) and says on stdout, one JSON object a line, what it asked for and
// what each job was meant to end as. cmd/devcluster's conformance test
// drives it (and its Python twin, clients/python/conformance_producer.py,
// which has the same command line and the same stdout protocol) against a
// two-node cluster, kills and restarts it and the daemons, and checks that
// every job ends as meant on both nodes.
//
//	go -C clients/go build -o BIN ./internal/conformproducer
//	BIN --addr 127.0.0.1:PORT --producer conf-go --outbox /tmp/conf-go.outbox \
//	    --lease 10 --jobs 60 --member node-b
//
// It lives inside the client's module so that it imports the client as a
// producer does, and under internal/ so that no producer imports it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// options are the command line, checked.
type options struct {
	addr, producer, outbox, member string
	lease                          int
	jobs, concurrency, stepDelayMs int
	closeTimeout                   int
	seed                           int64
}

// parseFlags reads args; a bad or missing flag is one line naming it.
func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("conformproducer", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are ours, one line each
	fs.StringVar(&o.addr, "addr", "", "the ingress address, HOST:PORT")
	fs.StringVar(&o.producer, "producer", "", "the client's producer name (id prefix)")
	fs.StringVar(&o.outbox, "outbox", "", "the client's outbox file")
	fs.IntVar(&o.lease, "lease", 0, "the client's lease, whole seconds")
	fs.IntVar(&o.jobs, "jobs", 0, "how many jobs this process runs")
	fs.IntVar(&o.concurrency, "concurrency", 16, "at most this many jobs open at once")
	fs.StringVar(&o.member, "member", "", "every 4th job is scheduled on this member (empty: none)")
	fs.IntVar(&o.stepDelayMs, "step-delay-ms", 100, "a job's next step waits a random delay up to this")
	fs.IntVar(&o.closeTimeout, "close-timeout", 60, "Close's deadline in seconds")
	fs.Int64Var(&o.seed, "seed", 0, "random seed (default: time based)")
	if err := fs.Parse(args); err != nil {
		return o, errors.New(flagError(err))
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// --member is required but may be empty: a node whose GET /v1/node
	// lists no members (no cluster files) has no name to give.
	for _, name := range []string{"addr", "producer", "outbox", "lease", "jobs", "member"} {
		if !set[name] {
			return o, fmt.Errorf("--%s is required", name)
		}
	}
	if !set["seed"] {
		o.seed = time.Now().UnixNano()
	}
	switch {
	case !validAddr(o.addr):
		return o, fmt.Errorf("--addr %q: not HOST:PORT", o.addr)
	case o.producer == "":
		return o, errors.New("--producer: must not be empty")
	case o.outbox == "":
		return o, errors.New("--outbox: must not be empty")
	case o.lease < 5 || o.lease > 86400:
		return o, fmt.Errorf("--lease %d: must be whole seconds from 5 to 86400", o.lease)
	case o.jobs < 0:
		return o, fmt.Errorf("--jobs %d: must not be negative", o.jobs)
	case o.concurrency < 1:
		return o, fmt.Errorf("--concurrency %d: must be at least 1", o.concurrency)
	case o.stepDelayMs < 0:
		return o, fmt.Errorf("--step-delay-ms %d: must not be negative", o.stepDelayMs)
	case o.closeTimeout < 1:
		return o, fmt.Errorf("--close-timeout %d: must be at least 1", o.closeTimeout)
	}
	return o, nil
}

func validAddr(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	return err == nil && host != "" && port != ""
}

// flagError says a failed Parse's error in one line naming the flag with
// two dashes.
func flagError(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "--" + name + " needs a value"
	}
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "unknown flag --" + name
	}
	// `invalid value "x" for flag -name: parse error`
	if rest, ok := strings.CutPrefix(msg, "invalid value "); ok {
		if val, name, ok := strings.Cut(rest, " for flag -"); ok {
			name, _, _ = strings.Cut(name, ":")
			return fmt.Sprintf("--%s: %s is not a whole number", name, val)
		}
	}
	return strings.ReplaceAll(msg, "\n", " ")
}

// out writes the stdout protocol: one JSON object a line, whole lines only.
type out struct {
	mu sync.Mutex // guards w: lines never interleave
	w  io.Writer
}

func (o *out) line(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only the protocol's own structs are written
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.w.Write(append(b, '\n')) // os.Stdout is unbuffered: each line is flushed
}

type nodeLine struct {
	Event    string `json:"event"`
	NodeID   string `json:"nodeId"`
	Member   string `json:"member"`
	MemberID string `json:"memberId"`
}

type submittedLine struct {
	Event       string `json:"event"`
	ID          string `json:"id"`
	ScheduledOn string `json:"scheduledOn"`
}

type meantLine struct {
	Event string `json:"event"`
	ID    string `json:"id"`
	Final string `json:"final"`
}

type stepErrorLine struct {
	Event string `json:"event"`
	ID    string `json:"id"`
	Step  string `json:"step"`
	Err   string `json:"err"`
}

type statsLine struct {
	Event         string `json:"event"`
	Queued        int64  `json:"queued"`
	Sent          int64  `json:"sent"`
	Retried       int64  `json:"retried"`
	Refused       int64  `json:"refused"`
	Dropped       int64  `json:"dropped"`
	OutboxPending int64  `json:"outboxPending"`
	OutboxFull    int64  `json:"outboxFull"`
}

type doneLine struct {
	Event    string `json:"event"`
	CloseErr string `json:"closeErr"`
}

func stats(s wlmclient.Stats) statsLine {
	return statsLine{Event: "stats", Queued: s.Queued, Sent: s.Sent, Retried: s.Retried, Refused: s.Refused,
		Dropped: s.Dropped, OutboxPending: s.OutboxPending, OutboxFull: s.OutboxFull}
}

// Steps of a job, in order.
const (
	stepSubmit = iota
	stepStart
	stepEnd
)

var stepNames = [...]string{"submit", "start", "end"}

// job is one of this process's jobs: k picks its steps.
type job struct {
	k    int
	step int
	h    *wlmclient.Job
}

// final is the state job k is meant to end as.
func final(k int) string {
	switch k % 6 {
	case 1:
		return "failed"
	case 2:
		return "cancelled"
	case 3:
		return "removed"
	default:
		return "completed"
	}
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args)
	if err != nil {
		fmt.Fprintf(stderr, "conformproducer: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "conformproducer: seed %d\n", o.seed)
	c, err := wlmclient.New(wlmclient.Config{
		Addr: o.addr, Producer: o.producer, OutboxPath: o.outbox,
		Lease:  time.Duration(o.lease) * time.Second,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintf(stderr, "conformproducer: %v\n", err)
		return 1
	}
	w := &out{w: stdout}
	closeTimeout := time.Duration(o.closeTimeout) * time.Second

	// The node may be restarting: ask until the close timeout.
	var node *wlmclient.Node
	for deadline := time.Now().Add(closeTimeout); ; {
		node, err = c.Node(context.Background())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(stderr, "conformproducer: %v\n", err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			c.Close(ctx)
			cancel()
			return 1
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The member's node id, for the "scheduledOn" the orchestrator checks,
	// from the client's own lookup (the one Submit makes for
	// JobSpec.ScheduledOnMember), not a scan of node.Members of our own:
	// the producer then checks what producers use. The Node call above
	// taught it the members, so this asks the node nothing more. (This
	// program is in the client's module, not the daemon's, so it calls the
	// client with no require in the daemon's go.mod, which must have none.)
	memberID := ""
	if o.member != "" {
		if memberID, err = c.MemberID(context.Background(), o.member); err != nil {
			// Submit will say so for each job that names it.
			fmt.Fprintf(stderr, "conformproducer: %v\n", err)
			memberID = ""
		}
	}
	w.line(nodeLine{Event: "node", NodeID: node.NodeID, Member: o.member, MemberID: memberID})

	stopStats := make(chan struct{})
	statsDone := make(chan struct{})
	go func() {
		defer close(statsDone)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				w.line(stats(c.Stats()))
			case <-stopStats:
				return
			}
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if o.jobs == 0 {
		// Only the outbox's replay: wait for it, within the close timeout.
		for {
			s := c.Stats()
			if s.Queued == 0 && s.OutboxPending == 0 || ctx.Err() != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	} else {
		runJobs(c, w, o, memberID)
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
	}
	closeErr := c.Close(ctx)
	close(stopStats)
	<-statsDone
	w.line(stats(c.Stats()))
	d := doneLine{Event: "done"}
	if closeErr != nil {
		d.CloseErr = closeErr.Error()
	}
	w.line(d)
	return 0
}

// runJobs runs jobs 0..o.jobs-1, at most o.concurrency open at once, their
// steps taken from one queue by o.concurrency workers, and returns when
// every job ended (its end call returned nil, or a step failed).
func runJobs(c *wlmclient.Client, w *out, o options, memberID string) {
	// Every open job has at most one step on the queue or on a timer, so
	// the queue never holds more than o.concurrency and a send never blocks.
	queue := make(chan *job, o.concurrency)
	allEnded := make(chan struct{})
	var (
		mu    sync.Mutex // guards next, ended and rng
		next  int
		ended int
		rng   = rand.New(rand.NewPCG(uint64(o.seed), uint64(o.seed)>>1^0x9e3779b97f4a7c15))
	)
	mu.Lock()
	for ; next < o.jobs && next < o.concurrency; next++ {
		queue <- &job{k: next}
	}
	mu.Unlock()
	// finish admits the next job in the place of one that ended.
	finish := func() {
		mu.Lock()
		defer mu.Unlock()
		ended++
		if next < o.jobs {
			queue <- &job{k: next}
			next++
		}
		if ended == o.jobs {
			close(allEnded)
		}
	}
	// later hands j's next step to the workers after a random delay.
	later := func(j *job) {
		mu.Lock()
		d := time.Duration(rng.IntN(o.stepDelayMs+1)) * time.Millisecond
		mu.Unlock()
		time.AfterFunc(d, func() { queue <- j })
	}
	var workers sync.WaitGroup
	for range o.concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				select {
				case j := <-queue:
					if step(c, w, j, o.member, memberID) {
						finish()
					} else {
						later(j)
					}
				case <-allEnded:
					return
				}
			}
		}()
	}
	<-allEnded
	workers.Wait()
}

// step runs j's current step and reports whether the job ended.
func step(c *wlmclient.Client, w *out, j *job, member, memberID string) (ended bool) {
	var err error
	switch j.step {
	case stepSubmit:
		spec := wlmclient.JobSpec{Model: "conformance", Engine: "test"}
		scheduledOn := ""
		if j.k%4 == 3 && member != "" {
			spec.ScheduledOnMember, scheduledOn = member, memberID
		}
		j.h, err = c.Submit(context.Background(), spec)
		if err == nil {
			w.line(submittedLine{Event: "submitted", ID: j.h.ID(), ScheduledOn: scheduledOn})
		}
	case stepStart:
		err = j.h.Start()
	case stepEnd:
		// Said before the call, so a kill between the call and its
		// "meant" line still tells the orchestrator which end was under
		// way (the outbox may hold it).
		w.line(meantLine{Event: "ending", ID: j.h.ID(), Final: final(j.k)})
		switch j.k % 6 {
		case 1:
			err = j.h.Fail("conformance")
		case 2:
			err = j.h.Cancel("conformance")
		case 3:
			err = j.h.Remove()
		default:
			err = j.h.Complete()
		}
		if err == nil {
			w.line(meantLine{Event: "meant", ID: j.h.ID(), Final: final(j.k)})
			return true
		}
	}
	if err != nil {
		id := ""
		if j.h != nil {
			id = j.h.ID()
		}
		w.line(stepErrorLine{Event: "stepError", ID: id, Step: stepNames[j.step], Err: err.Error()})
		return true
	}
	j.step++
	if j.step == stepStart && j.k%6 == 5 {
		j.step = stepEnd // completed straight from queued
	}
	return false
}
