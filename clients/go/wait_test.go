package wlmclient

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// flakyListener hangs up on every connection while down, the way a daemon
// that is restarting answers nothing, and counts the connections it took.
type flakyListener struct {
	net.Listener
	down     atomic.Bool
	accepted atomic.Int64
}

func (l *flakyListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.accepted.Add(1)
		if !l.down.Load() {
			return conn, nil
		}
		conn.Close()
	}
}

// manualTimers stands in for time.AfterFunc: the test fires each timer.
type manualTimers struct {
	mu    sync.Mutex
	waits []time.Duration
	funcs []func()
}

func (m *manualTimers) afterFunc(d time.Duration, f func()) *time.Timer {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.waits, m.funcs = append(m.waits, d), append(m.funcs, f)
	return time.AfterFunc(time.Hour, func() {}) // only ever stopped
}

func (m *manualTimers) armed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.funcs)
}

func (m *manualTimers) fire(i int) (wait time.Duration) {
	m.mu.Lock()
	f, d := m.funcs[i], m.waits[i]
	m.mu.Unlock()
	f()
	return d
}

func (c *Client) gatedJobs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.gated)
}

func TestADaemonThatDoesNotAnswerGatesTheWholeClientOneProbeAtATime(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln}
	fl.down.Store(true)
	in := &fakeIngress{}
	srv := &http.Server{Handler: in}
	go srv.Serve(fl)
	t.Cleanup(func() { srv.Close() })

	c := newClient(t, Config{Addr: ln.Addr().String(), Workers: 1, Lease: -1, BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second})
	timers := &manualTimers{}
	c.afterFunc = timers.afterFunc
	const jobs = 10
	ids := make([]string, jobs)
	for i := range jobs {
		job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = job.ID()
	}
	// One request found the daemon down and shut the gate: every job waits
	// behind it without a request of its own.
	eventually(t, "every job gated", func() bool { return c.gatedJobs() == jobs })
	if n, armed := fl.accepted.Load(), timers.armed(); n != 1 || armed != 1 {
		t.Fatalf("%d connections and %d timers while the daemon is down, want 1 request and the gate's timer", n, armed)
	}
	if w := timers.fire(0); w < 50*time.Millisecond || w > 100*time.Millisecond {
		t.Errorf("the gate's first wait is %s, want BackoffMin (100ms) jittered down by up to half", w)
	}
	// The gate's probe finds the daemon still down: one more request, and
	// the gate waits twice as long.
	eventually(t, "the probe's request and the gate armed again", func() bool { return timers.armed() == 2 && c.gatedJobs() == jobs })
	if n := fl.accepted.Load(); n != 2 {
		t.Fatalf("%d connections after one probe, want 2", n)
	}
	fl.down.Store(false)
	if w := timers.fire(1); w < 100*time.Millisecond || w > 200*time.Millisecond {
		t.Errorf("the gate's second wait is %s, want 200ms jittered down by up to half", w)
	}
	// The next probe is answered: every gated job is sent.
	closeWithin(t, c, 10*time.Second)
	if s := c.Stats(); s.Sent != jobs || s.Retried != 2 || s.Dropped != 0 {
		t.Errorf("stats %+v, want %d sent, 2 retried (the first job's two tries that found the daemon down), nothing dropped", s, jobs)
	}
	got := map[string]bool{}
	for _, g := range in.requests() {
		got[g.id()] = true
	}
	for _, id := range ids {
		if !got[id] {
			t.Errorf("job %s never reached the ingress", id)
		}
	}
	if timers.armed() != 2 {
		t.Errorf("%d timers armed, want the gate's 2", timers.armed())
	}
}

func TestAJobParkedForItsRetryHoldsNoWorkerAndCloseAbandonsItCounted(t *testing.T) {
	// The first job's frames are turned away for an hour; the second's go
	// through at once, on the client's only worker.
	var first atomic.Value
	in := &fakeIngress{answer: func(g got, n int) (int, http.Header) {
		if g.id() == first.Load() {
			return http.StatusServiceUnavailable, http.Header{"Retry-After": {"3600"}}
		}
		return http.StatusOK, nil
	}}
	path := filepath.Join(t.TempDir(), "outbox.jsonl")
	c := newClient(t, Config{Addr: serve(t, in), Workers: 1, Lease: -1, OutboxPath: path})
	timers := &manualTimers{}
	c.afterFunc = timers.afterFunc
	first.Store("turned-away")
	a, err := c.Submit(context.Background(), JobSpec{ID: "turned-away", Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first job's frame turned away", func() bool { return len(in.requests()) == 1 })
	if err := a.Fail("the GPU fell off the bus"); err != nil { // waits behind the parked frame
		t.Fatal(err)
	}
	b, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	b.Complete()
	eventually(t, "the second job's frames sent while the first waits", func() bool { return c.Stats().Sent == 2 })

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Close(ctx); err == nil || !strings.Contains(err.Error(), "2 frames not sent") {
		t.Fatalf("Close: %v, want the parked job's 2 frames not sent", err)
	}
	if s := c.Stats(); s.Sent != 2 || s.Dropped != 2 || s.Queued != 0 || s.OutboxPending != 1 {
		t.Errorf("stats %+v, want 2 sent, the parked job's 2 frames dropped, its failed frame kept in the outbox", s)
	}
	// A timer that fires after Close (it was due as Close stopped) hands
	// nothing back: the workers are gone.
	if timers.armed() != 1 {
		t.Fatalf("%d timers armed, want the parked job's", timers.armed())
	}
	if w := timers.fire(0); w < DefaultRetryAfterMax || w > DefaultRetryAfterMax*5/4 {
		t.Errorf("the parked job waited %s, want the Retry-After of an hour capped at RetryAfterMax (5m) and up to a quarter more", w)
	}
	if n := len(c.ready); n != 0 {
		t.Errorf("a timer firing after Close handed %d jobs to the exited workers", n)
	}
	holdsWithin(t, "no request after Close", 50*time.Millisecond, func() bool { return len(in.requests()) == 3 })
}
