package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

// `nvpair-wlm run -- CMD ARGS...`: a command's life as a workload. The
// command is started first, with this process's own stdin, stdout and
// stderr (the same files, never copied through a pipe), so reporting
// neither delays it nor changes what it reads and writes; the workload is
// then reported running, and at the command's end completed (exit 0),
// failed (the exit code, or the signal that killed it) or cancelled (this
// process was interrupted and the command did not exit 0). Signals are
// forwarded (run_unix.go); the exit status is the command's. The client
// leases the running job and renews the lease while the command runs, so
// a wrapper killed with kill -9 leaves a job that expires, not one
// running forever; it parks the frames while the ingress does not answer,
// and keeps the end in an outbox (outboxes.go) when the ingress has not
// taken it by --wait after the command's end.

// runMain is `nvpair-wlm run`.
func runMain(args []string, stdout, stderr io.Writer) int {
	c := newCommand("run", "[flags] -- CMD ARGS...\n\nRuns CMD as a workload of this node: running while it runs, then completed, failed or cancelled.\nIts stdin, stdout, stderr and exit status are its own.", stdout, stderr)
	id := c.fs.String("id", "", "the workload's id (default: one the client mints, which no other process can)")
	model := c.fs.String("model", "", "the workload's model (default: CMD's base name)")
	engine := c.fs.String("engine", "command", "the workload's engine")
	requester := c.fs.String("requester", "", "the workload's requesterId (default: run/<user>)")
	lease := c.fs.Duration("lease", wlmclient.DefaultLease, "the lease on the running job, renewed while CMD runs: a wrapper killed with kill -9 leaves its job failed after it; whole seconds from 5s to 24h, 0 for none")
	wait := c.fs.Duration("wait", 5*time.Second, "how long after CMD ends to wait for the ingress to take its end; what it has not taken is kept and sent by the next nvpair-wlm run or flush")
	outboxDir := c.fs.String("outbox-dir", filepath.Join(stateDir(), "run-outbox"), "where ends not yet taken are kept; \"\" keeps none")
	if code, done := c.parse(args); done {
		return code
	}
	l, err := leaseFlag(*lease)
	switch {
	case err != nil:
		return c.fail(err)
	case c.fs.NArg() == 0:
		return c.fail(errors.New("no command to run: nvpair-wlm run [flags] -- CMD ARGS..."))
	case *wait < 0:
		return c.fail(fmt.Errorf("--wait %s: must not be negative", *wait))
	}
	argv := c.fs.Args()
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwardedSignals...) // before the command starts: none is lost
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	startErr := cmd.Start()

	// Reporting starts once the command runs; nothing below delays it.
	spec := wlmclient.JobSpec{ID: *id, Model: cmpStr(*model, filepath.Base(argv[0])), Engine: *engine,
		RequesterID: cmpStr(*requester, "run/"+userName())}
	r := startReport(c, l, spec, *outboxDir)
	if startErr != nil {
		fmt.Fprintf(stderr, "nvpair-wlm run: %v\n", startErr)
		r.end("failed", "could not start: "+startErr.Error())
		r.finish(*wait, sigs)
		return startFailure(startErr)
	}
	r.running()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	var interrupted os.Signal
	for waiting := true; waiting; {
		select {
		case s := <-sigs:
			if interrupted == nil && isInterrupt(s) {
				interrupted = s
			}
			forward(cmd.Process, s)
		case <-done:
			waiting = false
		}
	}
	st := cmd.ProcessState
	state, reason := outcome(st, interrupted)
	r.end(state, reason)
	r.finish(*wait, sigs)
	return exitLike(st)
}

// outcome is the workload's end for a command that ended as st, this
// process having been interrupted by interrupted (nil when not): an exit
// 0 completed it whatever happened; an interrupted command that did not
// exit 0 was cancelled; any other end failed it, with the exit code or the
// signal.
func outcome(st *os.ProcessState, interrupted os.Signal) (state, reason string) {
	how := fmt.Sprintf("exited with status %d", st.ExitCode())
	if sig := killedBy(st); sig != "" {
		how = "was killed by " + sig
	}
	switch {
	case st.Success():
		return "completed", ""
	case interrupted != nil:
		return "cancelled", fmt.Sprintf("interrupted by %s; the command %s", signalName(interrupted), how)
	}
	return "failed", "the command " + how
}

// userName is the user running the command, for the default requesterId.
func userName() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return cmpStr(os.Getenv("USER"), "unknown")
}

// startFailure is the exit status of a command that could not start, as a
// shell gives it: 127 when it was not found, 126 when it could not be run.
func startFailure(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return 127
	}
	return 126
}

// report is the run's workload and the clients that send it.
type report struct {
	c       *command
	client  *wlmclient.Client
	job     *wlmclient.Job
	outbox  string     // this run's outbox, "" without one
	orphans *outboxSet // earlier runs' outboxes this run claimed, once claimed is closed
	claimed chan struct{}
	down    chan string // the probe's verdict: why the ingress does not answer, "" when it does
}

// startReport makes the client, submits the job and probes the ingress in
// the background: when it does not answer, one line on stderr says so.
func startReport(c *command, lease time.Duration, spec wlmclient.JobSpec, outboxDir string) *report {
	r := &report{c: c, down: make(chan string, 1)}
	cfg := wlmclient.Config{Addr: *c.addr, Producer: "run", Lease: lease, Logger: c.logger(),
		// A probe every 2 s at most while the ingress does not answer: on
		// loopback it costs nothing, and the states arrive soon after the
		// ingress is back.
		BackoffMax: 2 * time.Second}
	if outboxDir != "" && os.MkdirAll(outboxDir, 0o700) == nil {
		cfg.OutboxPath = newOutboxPath(outboxDir)
	}
	client, err := wlmclient.New(cfg)
	if err != nil && cfg.OutboxPath != "" {
		cfg.OutboxPath = "" // an outbox that cannot be made: report without one
		client, err = wlmclient.New(cfg)
	}
	if err != nil {
		fmt.Fprintf(c.stderr, "nvpair-wlm run: not reporting: %v\n", err)
		return r
	}
	r.client, r.outbox = client, cfg.OutboxPath
	if r.job, err = client.Submit(context.Background(), spec); err != nil {
		fmt.Fprintf(c.stderr, "nvpair-wlm run: not reporting: %v\n", err)
	}
	go r.probe()
	if outboxDir != "" {
		orphanCfg := cfg
		orphanCfg.OutboxPath = ""
		r.claimed = make(chan struct{})
		go func() { r.orphans = claimOrphans(outboxDir, orphanCfg, c.logger()); close(r.claimed) }()
	}
	return r
}

// probeTimeout bounds the probe of the ingress: on loopback an answer
// takes a millisecond, so a daemon that has not answered in this long is
// as good as down for a user watching the command start.
const probeTimeout = 2 * time.Second

// probe asks the ingress who it is, once, and says in one line on stderr
// when it does not answer.
func (r *report) probe() {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	_, err := r.client.Node(ctx)
	why := ""
	if err != nil {
		why = rootCause(err)
		fmt.Fprintf(r.c.stderr, "nvpair-wlm run: the ingress at %s does not answer (%s); the command runs, and its states are sent when the ingress answers\n", *r.c.addr, why)
	}
	r.down <- why
}

// rootCause is what a network error comes down to ("connect: connection
// refused"), without the URL and the client's prefixes around it.
func rootCause(err error) string {
	var op *net.OpError
	if errors.As(err, &op) {
		return op.Err.Error()
	}
	return err.Error()
}

// running reports the job running.
func (r *report) running() {
	if r.job != nil {
		r.job.Start()
	}
}

// end reports the job's end.
func (r *report) end(state, reason string) {
	if r.job == nil {
		return
	}
	switch state {
	case "completed":
		r.job.Complete()
	case "cancelled":
		r.job.Cancel(reason)
	default:
		r.job.Fail(reason)
	}
}

// finish waits at most wait for the frames to be taken (a signal cuts the
// wait short), then closes the clients: what was not taken stays in the
// outboxes for a later run.
func (r *report) finish(wait time.Duration, sigs <-chan os.Signal) {
	if r.client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := r.client.Close(ctx)
	if r.outbox != "" && r.client.Stats().OutboxPending == 0 {
		os.Remove(r.outbox)
	}
	if err != nil && r.probeSaidUp() {
		where := "it is lost"
		if r.outbox != "" {
			where = "it is kept in " + r.outbox + " and sent by the next nvpair-wlm run or flush"
		}
		fmt.Fprintf(r.c.stderr, "nvpair-wlm run: the ingress at %s did not take the job's end within %s; %s\n", *r.c.addr, wait, where)
	}
	if r.claimed != nil {
		<-r.claimed // a read of a directory and a few renames
		r.orphans.close(ctx)
	}
}

// probeSaidUp reports whether the probe found the ingress answering (or
// has not finished): only then is a line about the end still news.
func (r *report) probeSaidUp() bool {
	select {
	case why := <-r.down:
		return why == ""
	default:
		return true
	}
}
