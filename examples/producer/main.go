// Command producer is an example third-party workload producer: it reports
// one job's lifecycle (submitted, started, completed) to a node's loopback
// ingress, the way an external scheduler or a local inference harness would.
//
//	go run ./examples/producer --addr 127.0.0.1:14324
//
// What it shows:
//
//   - every event carries a seq that rises from 1, so the peers'
//     deduplication keeps events that share a state apart;
//
//   - the id has a prefix of its own, so it cannot equal a proxy's id;
//
//   - originatedFrom is left out: the daemon stamps its node id;
//
//   - a 500 (the daemon could not write to its broker) is retried with
//     exponential backoff, and so is a refused connection;
//
//   - a 4xx is a bug in the producer: it prints the daemon's one-line
//     reason and exits with status 2, without retrying;
//
//   - the queued and running frames carry a lease (Workload-Lease), renewed
//     at a third of its length while the job runs, so a producer that dies
//     mid-job has its job retired as failed by the daemon instead of left
//     running on every node; the terminal frame ends the lease.
//
//     go run ./examples/producer --lease 5s --abandon   # report, then "crash": the job turns failed after 5 s
package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"nvpair-workload-manager/internal/cliflags"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// workload is the object the ingress takes (spec.md 3.2). Metadata
// only: never put prompts, messages or responses in it.
type workload struct {
	ID          string  `json:"id"`
	RunID       string  `json:"runId"`
	Seq         int     `json:"seq"`
	Model       string  `json:"model"`
	Engine      string  `json:"engine"`
	State       string  `json:"state"`
	CreatedAt   int64   `json:"createdAt"`
	StartedAt   *int64  `json:"startedAt"`
	CompletedAt *int64  `json:"completedAt"`
	Error       *string `json:"error"`
	RequesterID string  `json:"requesterId"`
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("producer", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are one line of ours (internal/cliflags), help is on stdout
	addr := fs.String("addr", "127.0.0.1:14324", "the node's loopback ingress, HOST:PORT")
	id := fs.String("id", "", "the job id (default: example-producer-<random>)")
	model := fs.String("model", "qwen3-8b", "the model the job runs")
	engine := fs.String("engine", "llamacpp", "the engine the job runs on")
	work := fs.Duration("work", time.Second, "how long the job 'runs' between started and completed")
	attempts := fs.Int("attempts", 6, "attempts per event before giving up on 5xx or connection errors")
	backoff := fs.Duration("backoff", 200*time.Millisecond, "first retry delay; doubled on each retry")
	leaseFor := fs.Duration("lease", 30*time.Second, "the lease on the queued and running frames, whole seconds from 5s to 24h; renewed at a third of it while the job runs; 0 reports without a lease")
	abandon := fs.Bool("abandon", false, "exit after reporting the job running, without closing it, as a crashed producer would: its lease retires it")
	explain := cliflags.Explain(fs, map[string]string{"addr": "HOST:PORT", "id": "ID", "model": "MODEL", "engine": "ENGINE"})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, "usage: producer [flags]\n\nReports one job's life (queued, running, completed) to a node's local ingress.\n\n")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(stderr, "producer: %v\n", explain(err))
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
	}{{"--work", *work}, {"--backoff", *backoff}} {
		if d.v < 0 {
			fmt.Fprintf(stderr, "producer: %s %s: must not be negative\n", d.flag, d.v)
			return 2
		}
	}
	if *leaseFor != 0 && (*leaseFor < 5*time.Second || *leaseFor > 24*time.Hour || *leaseFor%time.Second != 0) {
		fmt.Fprintf(stderr, "producer: --lease %s: must be whole seconds from 5s to 24h, or 0\n", *leaseFor)
		return 2
	}
	nonce := randomHex(4)
	if *id == "" {
		*id = "example-producer-" + randomHex(8)
	}
	r := &reporter{
		url:      "http://" + *addr + "/v1/workloads/events",
		lease:    int(*leaseFor / time.Second),
		client:   &http.Client{Timeout: 5 * time.Second},
		attempts: max(*attempts, 1),
		backoff:  *backoff,
		log:      stderr,
	}
	now := func() *int64 { ms := time.Now().UnixMilli(); return &ms }
	w := workload{ID: *id, RunID: nonce, Model: *model, Engine: *engine, CreatedAt: *now(), RequesterID: "example-producer"}
	steps := []struct {
		method, state string
		apply         func(*workload)
	}{
		{"workload:submitted", "queued", func(*workload) {}},
		{"workload:started", "running", func(w *workload) { w.StartedAt = now() }},
		{"workload:completed", "completed", func(w *workload) { w.CompletedAt = now() }},
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "producer: %v\n", err)
		if errors.As(err, new(*refusedError)) {
			return 2
		}
		return 1
	}
	for i, s := range steps {
		if s.state == "completed" {
			if *abandon {
				fmt.Fprintf(stdout, "abandoned %s while running: its lease of %s retires it\n", w.ID, *leaseFor)
				return 0
			}
			// The job runs: renew the lease at a third of its length by
			// sending the running frame again, unchanged.
			if err := r.renewWhile(*work, "workload:started", w, stdout); err != nil {
				return fail(err)
			}
		}
		w.Seq, w.State = i+1, s.state
		s.apply(&w)
		if err := r.send(s.method, w); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "reported %s %s (seq %d)\n", w.ID, w.State, w.Seq)
	}
	return 0
}

// renewWhile waits for d, renewing the lease every third of its length by
// sending the job's last frame again with the lease header. A renewal is
// retried like any frame; a renewal that fails for good is the producer's
// end (its lease will run out).
func (r *reporter) renewWhile(d time.Duration, method string, w workload, stdout io.Writer) error {
	end := time.Now().Add(d)
	if r.lease == 0 {
		time.Sleep(d)
		return nil
	}
	every := time.Duration(r.lease) * time.Second / 3
	for {
		next := time.Now().Add(every)
		if next.After(end) {
			time.Sleep(time.Until(end))
			return nil
		}
		time.Sleep(every)
		if err := r.send(method, w); err != nil {
			return fmt.Errorf("renewing the lease: %w", err)
		}
		fmt.Fprintf(stdout, "renewed the lease of %s for %d s\n", w.ID, r.lease)
	}
}

// refusedError is a 4xx: the frame is wrong, and sending it again cannot
// help.
type refusedError struct {
	method string
	status int
	reason string
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("the daemon refused %s (%d %s): %s", e.method, e.status, http.StatusText(e.status), e.reason)
}

// reporter posts frames to the ingress.
type reporter struct {
	url      string
	lease    int // seconds of Workload-Lease on queued and running frames; 0: none
	client   *http.Client
	attempts int
	backoff  time.Duration
	log      io.Writer
}

// send posts one lifecycle frame, retrying a 5xx or a failed connection with
// exponential backoff.
func (r *reporter) send(method string, w workload) error {
	lease := 0
	if w.State == "queued" || w.State == "running" {
		lease = r.lease // a terminal frame ends the lease and may not carry one
	}
	body, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"method":  method,
		"params":  map[string]any{"workloadInfo": w},
	})
	if err != nil {
		return err
	}
	delay := r.backoff
	for attempt := 1; ; attempt++ {
		status, reason, err := r.post(body, lease)
		switch {
		case err == nil && status == http.StatusOK:
			return nil
		case err == nil && status >= 400 && status < 500:
			return &refusedError{method, status, reason}
		case err == nil && status < 500:
			return fmt.Errorf("%s: unexpected answer %d %s", method, status, reason)
		}
		problem := fmt.Sprintf("%d %s", status, reason)
		if err != nil {
			problem = err.Error()
		}
		if attempt == r.attempts {
			return fmt.Errorf("%s: giving up after %d attempts: %s", method, attempt, problem)
		}
		fmt.Fprintf(r.log, "producer: %s: %s; retrying in %s\n", method, problem, delay)
		time.Sleep(delay)
		delay = min(2*delay, 10*time.Second)
	}
}

// post sends one request and returns the status and the first line of the
// answer, which is the daemon's reason on a refusal.
func (r *reporter) post(body []byte, lease int) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if lease > 0 {
		req.Header.Set("Workload-Lease", strconv.Itoa(lease))
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	reason, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return resp.StatusCode, reason, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
