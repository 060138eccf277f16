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
	// Workers is how many jobs send at once (DefaultWorkers). A job
	// waiting for its frame's next try holds none.
	Workers int
	// MaxAttempts bounds the tries of one frame; 0 tries until it is
	// delivered, refused for good, or Close's deadline passes. A frame
	// held back while the daemon does not answer (only one job probes it)
	// spends no attempt until it is sent.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the delay between tries: it starts at
	// BackoffMin, doubles, is capped at BackoffMax and jittered down by up
	// to half.
	BackoffMin, BackoffMax time.Duration
	// RetryAfterMax caps how long a Retry-After may make the client wait
	// (DefaultRetryAfterMax).
	RetryAfterMax time.Duration
	// RequestTimeout bounds one request from start to end: the connect,
	// the request, the answer's headers and its body, all together
	// (DefaultRequestTimeout). A daemon that answers slowly, a byte at a
	// time, is cut off at it like one that does not answer.
	RequestTimeout time.Duration
	// OutboxPath, when set, names a file that keeps terminal frames until
	// the daemon took them; New sends again what a previous process left.
	OutboxPath string
	// OutboxMax bounds the frames the outbox holds (DefaultOutboxMax).
	OutboxMax int
	// HTTPClient sends the requests (a client of its own by default). The
	// client uses a copy whose redirect policy follows none: a 3xx is the
	// daemon's answer, never a request to somewhere else.
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
// and 429, or a 3xx, which the client never follows), or the last answer
// of a frame that ran out of attempts.
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
	Retried       int64 // tries after a retryable failure, counted when sent
	Refused       int64 // frames refused for good (4xx other than 408/429, or a 3xx)
	Dropped       int64 // frames never sent: queue full, attempts spent, job owned, left at Close's deadline
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
	// afterFunc arms the timer of a retry wait (time.AfterFunc; a test
	// records the waits, or fires them itself), and renewEvery is how
	// often a lease is renewed (a third of it; a test shortens it). Both
	// are set by New, before any goroutine.
	afterFunc  func(time.Duration, func()) *time.Timer
	renewEvery time.Duration
	// progress is signalled (without blocking) whenever a frame leaves the
	// queue, so Close can wait for an empty queue without polling.
	progress chan struct{}

	// mu guards closed, stopped, queued, jobs, parked and the gate. Lock
	// order: a Job's mu, then this mu, then the outbox's mu; this mu is
	// never held across a request or a file write.
	mu      sync.Mutex
	closed  bool
	stopped bool // Close is ending the workers: no job is handed on to them
	queued  int
	jobs    map[*Job]struct{} // jobs with a renewal timer

	// parked are the jobs whose first frame waits for its next try, each
	// with the timer that hands it back to the workers. A parked job stays
	// busy (no worker takes it, so its frames stay in order) and its frame
	// keeps its place in the queue; the worker that parked it has moved on.
	parked map[*Job]*time.Timer
	// The gate is shut while the daemon does not answer at all (a
	// transport error: refused, reset, timed out): no job sends then but
	// the one probe the gate's timer lets through, every gateDelay
	// (backoff doubling to BackoffMax). The jobs a worker took meanwhile
	// wait in gated, in the order they came, and all go back to the
	// workers as soon as any request is answered. gateGen tells a timer
	// that fired late that the gate it was armed for is gone.
	gateShut  bool
	gateDelay time.Duration // the next wait of the gate
	gateTimer *time.Timer   // armed while the gate waits for its next probe
	gateGen   uint64
	probe     *Job // the job the gate let through, until its answer
	probeFree bool // the gate's timer fired with no job waiting: the next job probes
	gated     []*Job

	// members is what GET /v1/node last said of the members' names
	// (node.go); its own mutex is a leaf.
	members memberCache

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
	cfg.HTTPClient = noRedirects(cfg.HTTPClient)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{
		cfg: cfg, url: "http://" + cfg.Addr, log: cfg.Logger,
		stop: make(chan struct{}), progress: make(chan struct{}, 1),
		jobs: map[*Job]struct{}{}, parked: map[*Job]*time.Timer{},
	}
	c.runCtx, c.cancel = context.WithCancel(context.Background())
	c.afterFunc, c.renewEvery = time.AfterFunc, cfg.Lease/3
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
// abandons what is left, frames in flight, waiting for a retry or behind
// them (terminal frames stay in the outbox for the next New), counts them
// in Stats.Dropped and returns an error saying how many frames were not
// sent. Jobs left open keep their leases at the daemon, which retires them
// as failed when the leases run out.
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
	// No timer hands a job back from here on: a parked job's timer is
	// stopped, or finds it gone when it fires; the gate's finds stopped.
	c.mu.Lock()
	c.stopped = true
	for _, t := range c.parked {
		t.Stop()
	}
	c.parked = nil
	if c.gateTimer != nil {
		c.gateTimer.Stop()
		c.gateTimer = nil
	}
	c.gateGen++
	c.gated, c.probe = nil, nil
	c.mu.Unlock()
	c.cancel() // ends requests in flight
	close(c.stop)
	c.workers.Wait()
	// What is still queued was never sent: it was in flight when the
	// requests were cancelled, parked, gated, or behind one of those.
	c.mu.Lock()
	left := c.queued
	c.queued = 0
	c.mu.Unlock()
	c.dropped.Add(int64(left))
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
// every queued frame, and a job is in it at most once, because a job is in
// one place at a time: the channel, a worker, parked or gated, and in each
// it has its first frame queued. The channel is never closed, so a wake
// that races Close (a timer that took a job out of parked just before
// Close stopped) only leaves the job in the buffer, unread.
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
		c.run(j)
	}
}

// run sends j's frames one after the other until j has none left (then j
// is no longer busy) or its first frame must wait: parked for its retry,
// or gated while the daemon does not answer. A waiting job stays busy and
// is handed back to the workers when its wait ends, so the worker moves
// on to other jobs at once: a retry wait never holds a worker.
func (c *Client) run(j *Job) {
	for {
		if c.runCtx.Err() != nil {
			return // Close gave up: what is left is counted there
		}
		j.mu.Lock()
		if len(j.pending) == 0 {
			j.busy = false
			j.mu.Unlock()
			return
		}
		f := j.pending[0]
		owned := j.owned
		j.mu.Unlock()
		if owned {
			c.dropped.Add(1)
			c.forget(f)
		} else if !c.mayTry(j) || !c.try(j, f) {
			return
		}
		j.mu.Lock()
		j.pending = j.pending[1:]
		j.mu.Unlock()
		c.dequeued()
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

// try sends f, j's first frame, once and reports whether f is done with:
// taken, refused for good, or its attempts spent. When it is not, j waits
// for f's next try (parked, or behind the gate) and the caller lets go.
func (c *Client) try(j *Job, f *frame) (done bool) {
	if f.attempts > 0 {
		c.retried.Add(1)
	}
	f.attempts++
	status, reason, retryAfter, err := c.post(f)
	if err == nil {
		c.answered()
	}
	if err == nil && status == http.StatusOK {
		c.sent.Add(1)
		c.forget(f)
		return true
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
		return true
	}
	problem := err
	if err == nil {
		problem = &StatusError{Method: f.method, Status: status, Reason: reason}
	}
	spent := c.cfg.MaxAttempts > 0 && f.attempts >= c.cfg.MaxAttempts
	if spent {
		c.dropped.Add(1)
		j.mu.Lock()
		j.err = problem
		j.mu.Unlock()
		c.log.Warn("wlmclient: giving up on a frame", "method", f.method, "id", j.id, "attempts", f.attempts, "err", problem)
		// A terminal frame stays in the outbox for the next start.
	}
	if err != nil {
		// The daemon did not answer: the gate shuts for every job, this
		// one included, whether or not its frame has tries left.
		c.unanswered(j, !spent)
		return spent
	}
	if spent {
		return true
	}
	if f.delay == 0 {
		f.delay = c.cfg.BackoffMin
	}
	wait := jitter(f.delay)
	f.delay = min(2*f.delay, c.cfg.BackoffMax)
	if retryAfter > 0 {
		// Honour the daemon: never earlier than it asked, plus up to a
		// quarter more so producers it turned away do not return at
		// the same instant.
		ra := min(retryAfter, c.cfg.RetryAfterMax)
		wait = ra + rand.N(ra/4+1)
	}
	c.log.Debug("wlmclient: retrying", "method", f.method, "id", j.id, "err", problem, "in", wait)
	c.park(j, wait)
	return false
}

// park hands j back to the workers after wait, from a timer. Once Close
// stopped, j is abandoned instead (Close counts its frames).
func (c *Client) park(j *Job, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	// The timer's function takes c.mu, so it cannot look before j is in
	// parked, even with a wait of 0.
	c.parked[j] = c.afterFunc(wait, func() {
		c.mu.Lock()
		_, ok := c.parked[j] // gone when Close stopped
		delete(c.parked, j)
		c.mu.Unlock()
		if ok {
			c.wake(j)
		}
	})
}

// mayTry reports whether j may send now: when the gate is open, or j is
// the gate's probe (or becomes it). Otherwise j joins the gated jobs.
func (c *Client) mayTry(j *Job) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.gateShut || c.probe == j:
		return true
	case c.probeFree:
		c.probe, c.probeFree = j, false
		return true
	}
	if !c.stopped {
		c.gated = append(c.gated, j)
	}
	return false
}

// unanswered shuts the gate after a request of j's got no answer, or arms
// it again when j was its probe (the wait doubling); with wait, j joins
// the gated jobs (once Close stopped, j is abandoned instead).
func (c *Client) unanswered(j *Job, wait bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	if !c.gateShut || c.probe == j || (c.probe == nil && c.probeFree) {
		// Nothing else will open the gate: no timer is armed and no
		// probe is out.
		if !c.gateShut {
			c.gateShut, c.gateDelay = true, c.cfg.BackoffMin
		}
		d := jitter(c.gateDelay)
		c.gateDelay = min(2*c.gateDelay, c.cfg.BackoffMax)
		c.probe, c.probeFree = nil, false
		c.gateGen++
		gen := c.gateGen
		c.gateTimer = c.afterFunc(d, func() { c.gateDue(gen) })
		c.log.Debug("wlmclient: the daemon does not answer, waiting", "in", d)
	}
	if wait {
		c.gated = append(c.gated, j)
	}
}

// gateDue lets one gated job through as the gate's probe, or, with none
// gated, lets the next job a worker takes be it.
func (c *Client) gateDue(gen uint64) {
	c.mu.Lock()
	if c.stopped || gen != c.gateGen {
		c.mu.Unlock()
		return
	}
	c.gateTimer = nil
	var j *Job
	if len(c.gated) > 0 {
		j = c.gated[0]
		c.gated = c.gated[1:]
		c.probe = j
	} else {
		c.probeFree = true
	}
	c.mu.Unlock()
	if j != nil {
		c.wake(j)
	}
}

// answered opens the gate after any answer from the daemon, and hands
// every gated job back to the workers.
func (c *Client) answered() {
	c.mu.Lock()
	if !c.gateShut {
		c.mu.Unlock()
		return
	}
	c.gateShut, c.probe, c.probeFree = false, nil, false
	c.gateGen++
	if c.gateTimer != nil {
		c.gateTimer.Stop()
		c.gateTimer = nil
	}
	gated := c.gated
	c.gated = nil
	stopped := c.stopped
	c.mu.Unlock()
	if stopped {
		return
	}
	for _, j := range gated {
		c.wake(j)
	}
}

// retryable reports whether a status may succeed when sent again: a 5xx,
// a 408 (the body came too slowly) or a 429. Every other 4xx means the
// producer must change, and sending the same frame again cannot help; a
// 3xx means something other than the daemon answers on its address.
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
	if isRedirect(resp.StatusCode) {
		return resp.StatusCode, redirectReason(resp), 0, nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	reason, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return resp.StatusCode, reason, parseRetryAfter(resp.Header.Get("Retry-After")), nil
}

// noRedirects returns a copy of hc (a new client when nil) that follows no
// redirect. Go's default policy would follow a 307 with the frame's body
// to wherever Location points, another host included, and turn a POST
// answered 302 into a GET whose 200 would count a frame the daemon never
// got as sent. Whatever answers on the ingress's address is either the
// daemon or not; a redirect from it is an answer, never an address.
func noRedirects(hc *http.Client) *http.Client {
	var own http.Client
	if hc != nil {
		own = *hc
	}
	own.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &own
}

// isRedirect reports whether status is a 3xx, which the client reports as
// the answer it is: the frame was not taken, and is not sent elsewhere.
func isRedirect(status int) bool { return status >= 300 && status < 400 }

// redirectReason names a redirect the client did not follow, and where it
// pointed, clipped: it is the reason of the frame's StatusError.
func redirectReason(resp *http.Response) string {
	loc := resp.Header.Get("Location")
	if len(loc) > 256 {
		loc = loc[:256] + "..."
	}
	return fmt.Sprintf("a redirect to %q, not followed: the client sends only to its node's ingress (is something other than the daemon listening there?)", loc)
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
