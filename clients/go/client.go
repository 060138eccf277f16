package wlmclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of [Config]'s zero values.
const (
	DefaultAddr           = "127.0.0.1:14324"
	DefaultLease          = 30 * time.Second
	DefaultQueueSize      = 1024
	DefaultWorkers        = 4
	DefaultBackoffMin     = 200 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
	DefaultRetryAfterMax  = 5 * time.Minute
	DefaultRequestTimeout = 10 * time.Second
	DefaultOutboxMax      = 1024
)

// Config is how a [Client] reaches its node and how hard it tries. The zero
// value of every field is its default.
type Config struct {
	// Addr is the node's loopback ingress, HOST:PORT (DefaultAddr).
	Addr string
	// Producer prefixes every id the client mints and is the default
	// requesterId; say which program reports ("myharness"). Default
	// "wlmclient".
	Producer string
	// Lease is the Workload-Lease on queued and running frames, whole
	// seconds from 5 s to 24 h (DefaultLease); a negative Lease sends none.
	Lease time.Duration
	// QueueSize bounds the frames waiting to be sent, all jobs together
	// (DefaultQueueSize). A frame asked for beyond it is refused with
	// ErrQueueFull and counted in Stats.Dropped.
	QueueSize int
	// Workers is how many jobs send at once (DefaultWorkers).
	Workers int
	// MaxAttempts bounds the tries of one frame; 0 tries until it is
	// delivered, refused for good, or Close's deadline passes.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the delay between tries: it starts at
	// BackoffMin, doubles, is capped at BackoffMax and jittered down by up
	// to half.
	BackoffMin, BackoffMax time.Duration
	// RetryAfterMax caps how long a Retry-After may make the client wait
	// (DefaultRetryAfterMax).
	RetryAfterMax time.Duration
	// RequestTimeout bounds one request (DefaultRequestTimeout).
	RequestTimeout time.Duration
	// OutboxPath, when set, names a file that keeps terminal frames until
	// the daemon took them; New sends again what a previous process left.
	OutboxPath string
	// OutboxMax bounds the frames the outbox holds (DefaultOutboxMax).
	OutboxMax int
	// HTTPClient sends the requests (a client of its own by default).
	HTTPClient *http.Client
	// Logger receives retries and refusals (slog.Default() by default).
	Logger *slog.Logger
}

// Errors the client returns.
var (
	// ErrClosed is returned for a frame asked for after Close.
	ErrClosed = errors.New("wlmclient: client closed")
	// ErrQueueFull is returned for a frame asked for while QueueSize frames
	// wait; the frame is dropped and counted.
	ErrQueueFull = errors.New("wlmclient: queue full, frame dropped")
	// ErrJobEnded is returned for a frame asked for after the job's
	// terminal frame or removal.
	ErrJobEnded = errors.New("wlmclient: job already ended")
	// ErrOwned is a job whose frame was answered 409: the node's broker owns
	// the workload, and the job's later frames are dropped.
	ErrOwned = errors.New("wlmclient: the node's broker owns this workload (409)")
)

// StatusError is a frame the daemon refused for good (a 4xx other than 408
// and 429), or the last answer of a frame that ran out of attempts.
type StatusError struct {
	Method string // the frame's method
	Status int    // the HTTP status
	Reason string // the first line of the daemon's answer
}

// Error says which frame was refused, with the status and the daemon's reason.
func (e *StatusError) Error() string {
	return fmt.Sprintf("wlmclient: %s refused: %d %s: %s", e.Method, e.Status, http.StatusText(e.Status), e.Reason)
}

// Stats are the client's counters since New, like a metrics family's
// samples: all but Queued and OutboxPending only rise.
type Stats struct {
	Queued        int64 // frames waiting or in flight now
	Sent          int64 // frames the daemon answered 200
	Retried       int64 // tries after a retryable failure
	Refused       int64 // frames refused for good (4xx other than 408/429)
	Dropped       int64 // frames never sent: queue full, attempts spent, job owned, Close's deadline
	OutboxPending int64 // terminal frames in the outbox now
	OutboxFull    int64 // terminal frames not kept because the outbox was full
	OutboxTorn    int64 // outbox lines unreadable at New, skipped
}

// Client sends jobs' frames to one node. It is safe for concurrent use.
type Client struct {
	cfg     Config
	url     string
	log     *slog.Logger
	outbox  *outbox
	ready   chan *Job     // jobs with frames to send, each at most once
	stop    chan struct{} // closed when the workers must end
	runCtx  context.Context
	cancel  context.CancelFunc
	workers sync.WaitGroup
	// sleep waits between tries (sleepFor; a test records the waits
	// instead), and renewEvery is how often a lease is renewed (a third of
	// it; a test shortens it). Both are set by New, before any goroutine.
	sleep      func(time.Duration) bool
	renewEvery time.Duration
	// progress is signalled (without blocking) whenever a frame leaves the
	// queue, so Close can wait for an empty queue without polling.
	progress chan struct{}

	// mu guards closed, queued and jobs. Lock order: a Job's mu, then this
	// mu, then the outbox's mu; this mu is never held across a request or
	// a file write.
	mu     sync.Mutex
	closed bool
	queued int
	jobs   map[*Job]struct{} // jobs with a renewal timer

	sent, retried, refused, dropped, outboxFull atomic.Int64
}

// New returns a client for cfg. With an OutboxPath it reads the outbox
// first and queues what a previous process left there; an unreadable line
// (a torn write, a damaged file) is skipped and counted, never fatal.
func New(cfg Config) (*Client, error) {
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.Producer == "" {
		cfg.Producer = "wlmclient"
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Lease > 0 && (cfg.Lease < 5*time.Second || cfg.Lease > 24*time.Hour || cfg.Lease%time.Second != 0) {
		return nil, fmt.Errorf("wlmclient: Lease %s: must be whole seconds from 5s to 24h, or negative for none", cfg.Lease)
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = DefaultBackoffMin
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	cfg.BackoffMax = max(cfg.BackoffMax, cfg.BackoffMin)
	if cfg.RetryAfterMax <= 0 {
		cfg.RetryAfterMax = DefaultRetryAfterMax
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.OutboxMax <= 0 {
		cfg.OutboxMax = DefaultOutboxMax
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{
		cfg: cfg, url: "http://" + cfg.Addr, log: cfg.Logger,
		stop: make(chan struct{}), progress: make(chan struct{}, 1),
		jobs: map[*Job]struct{}{},
	}
	c.runCtx, c.cancel = context.WithCancel(context.Background())
	c.sleep, c.renewEvery = c.sleepFor, cfg.Lease/3
	var replay []outboxEntry
	if cfg.OutboxPath != "" {
		ob, entries, err := openOutbox(cfg.OutboxPath, cfg.OutboxMax)
		if err != nil {
			c.cancel()
			return nil, err
		}
		c.outbox, replay = ob, entries
	}
	// A replayed frame has room in the queue beyond QueueSize: the outbox
	// is bounded itself, and what it holds must not be dropped.
	c.ready = make(chan *Job, cfg.QueueSize+len(replay))
	for i := 0; i < cfg.Workers; i++ {
		c.workers.Add(1)
		go c.work()
	}
	for _, e := range replay {
		j := &Job{c: c, id: e.ID, ended: true}
		c.mu.Lock()
		c.queued++
		c.mu.Unlock()
		j.mu.Lock()
		j.appendLocked(&frame{method: e.Method, body: e.Body, terminal: true, outboxKey: e.Key})
		j.mu.Unlock()
		c.wake(j)
	}
	return c, nil
}

// Stats returns the client's counters now.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	queued := c.queued
	c.mu.Unlock()
	s := Stats{
		Queued: int64(queued), Sent: c.sent.Load(), Retried: c.retried.Load(),
		Refused: c.refused.Load(), Dropped: c.dropped.Load(), OutboxFull: c.outboxFull.Load(),
	}
	if c.outbox != nil {
		s.OutboxPending, s.OutboxTorn = c.outbox.stats()
	}
	return s
}

// Close stops taking frames, stops renewing leases and waits until every
// queued frame is delivered or refused, or ctx is done. On ctx's end it
// abandons what is left (terminal frames stay in the outbox for the next
// New) and returns an error saying how many frames were not sent. Jobs
// left open keep their leases at the daemon, which retires them as failed
// when the leases run out.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed = true
	jobs := c.jobs
	c.jobs = nil
	c.mu.Unlock()
	for j := range jobs {
		j.stopRenewing()
	}
	var err error
	for {
		c.mu.Lock()
		left := c.queued
		c.mu.Unlock()
		if left == 0 {
			break
		}
		select {
		case <-c.progress:
			continue
		case <-ctx.Done():
			err = fmt.Errorf("wlmclient: close: %d frames not sent: %w", left, ctx.Err())
		}
		break
	}
	c.cancel() // ends requests in flight and retry waits
	close(c.stop)
	c.workers.Wait()
	if c.outbox != nil {
		c.outbox.close()
	}
	return err
}

// reserve takes a place in the queue for one frame, or refuses it. The
// caller holds the frame's Job's mu, which comes before the Client's mu.
func (c *Client) reserve() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return ErrClosed
	case c.queued >= c.cfg.QueueSize:
		c.dropped.Add(1)
		return ErrQueueFull
	}
	c.queued++
	return nil
}

// appendLocked appends f, which has its place in the queue, to j's frames
// and reports whether j must be handed to a worker: it must unless one
// already owns it. A job is sent by one worker at a time, which is what
// keeps its frames in order and never two in flight. j.mu is held.
func (j *Job) appendLocked(f *frame) (wake bool) {
	j.pending = append(j.pending, f)
	wake = !j.busy
	j.busy = true
	return wake
}

// wake hands j to a worker. It never blocks: the channel has room for
// every queued frame, and a job is in it at most once.
func (c *Client) wake(j *Job) { c.ready <- j }

// dequeued accounts for one frame that left the queue.
func (c *Client) dequeued() {
	c.mu.Lock()
	c.queued--
	c.mu.Unlock()
	select {
	case c.progress <- struct{}{}:
	default:
	}
}

// work sends jobs' frames until the client stops.
func (c *Client) work() {
	defer c.workers.Done()
	for {
		var j *Job
		select {
		case j = <-c.ready:
		case <-c.stop:
			return
		}
		for {
			j.mu.Lock()
			if len(j.pending) == 0 {
				j.busy = false
				j.mu.Unlock()
				break
			}
			f := j.pending[0]
			owned := j.owned
			j.mu.Unlock()
			if owned {
				c.dropped.Add(1)
				c.forget(f)
			} else {
				c.deliver(j, f)
			}
			j.mu.Lock()
			j.pending = j.pending[1:]
			j.mu.Unlock()
			c.dequeued()
		}
	}
}

// forget takes a frame that will never be sent again out of the outbox.
func (c *Client) forget(f *frame) {
	if c.outbox != nil && f.outboxKey != "" {
		if err := c.outbox.remove(f.outboxKey); err != nil {
			c.log.Warn("wlmclient: outbox", "err", err)
		}
	}
}

// deliver sends f until the daemon takes it, refuses it for good, the
// attempts are spent or the client is stopped.
func (c *Client) deliver(j *Job, f *frame) {
	delay := c.cfg.BackoffMin
	for attempt := 1; ; attempt++ {
		status, reason, retryAfter, err := c.post(f)
		if err == nil && status == http.StatusOK {
			c.sent.Add(1)
			c.forget(f)
			return
		}
		if err == nil && !retryable(status) {
			c.refused.Add(1)
			serr := &StatusError{Method: f.method, Status: status, Reason: reason}
			j.mu.Lock()
			j.err = serr
			if status == http.StatusConflict {
				j.owned = true
			}
			j.mu.Unlock()
			c.log.Warn("wlmclient: frame refused, not retried", "method", f.method, "id", j.id, "status", status, "reason", reason)
			c.forget(f)
			return
		}
		problem := err
		if err == nil {
			problem = &StatusError{Method: f.method, Status: status, Reason: reason}
		}
		if c.cfg.MaxAttempts > 0 && attempt >= c.cfg.MaxAttempts {
			c.dropped.Add(1)
			j.mu.Lock()
			j.err = problem
			j.mu.Unlock()
			c.log.Warn("wlmclient: giving up on a frame", "method", f.method, "id", j.id, "attempts", attempt, "err", problem)
			return // a terminal frame stays in the outbox for the next start
		}
		wait := jitter(delay)
		delay = min(2*delay, c.cfg.BackoffMax)
		if retryAfter > 0 {
			// Honour the daemon: never earlier than it asked, plus up to a
			// quarter more so producers it turned away do not return at
			// the same instant.
			ra := min(retryAfter, c.cfg.RetryAfterMax)
			wait = ra + rand.N(ra/4+1)
		}
		c.log.Debug("wlmclient: retrying", "method", f.method, "id", j.id, "err", problem, "in", wait)
		if !c.sleep(wait) {
			c.dropped.Add(1)
			return // a terminal frame stays in the outbox for the next start
		}
		c.retried.Add(1)
	}
}

// sleepFor waits d, or less when the client stops; it reports whether
// the whole of d passed.
func (c *Client) sleepFor(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.runCtx.Done():
		return false
	}
}

// retryable reports whether a status may succeed when sent again: a 5xx,
// a 408 (the body came too slowly) or a 429. Every other 4xx means the
// producer must change, and sending the same frame again cannot help.
func retryable(status int) bool {
	return status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests
}

// jitter returns d less up to half of it, so retries spread out.
func jitter(d time.Duration) time.Duration {
	return d - rand.N(d/2+1)
}

// post sends f once and returns the status, the first line of the answer,
// the Retry-After it carried and a transport error.
func (c *Client) post(f *frame) (int, string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(c.runCtx, c.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/workloads/events", bytes.NewReader(f.body))
	if err != nil {
		return 0, "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if f.lease > 0 {
		req.Header.Set("Workload-Lease", strconv.Itoa(f.lease))
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	reason, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return resp.StatusCode, reason, parseRetryAfter(resp.Header.Get("Retry-After")), nil
}

// parseRetryAfter reads a Retry-After of delay-seconds or an HTTP date; 0
// when absent or unreadable.
func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		if n <= 0 {
			return 0
		}
		return time.Duration(min(n, 1<<20)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}
