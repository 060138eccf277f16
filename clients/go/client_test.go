package wlmclient

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// got is one request the fake ingress received.
type got struct {
	method, path string
	lease        []string
	frame        struct {
		Method string `json:"method"`
		Params struct {
			WorkloadID   string         `json:"workloadId"`
			WorkloadInfo map[string]any `json:"workloadInfo"`
		} `json:"params"`
	}
}

func (g got) id() string {
	if g.frame.Params.WorkloadID != "" {
		return g.frame.Params.WorkloadID
	}
	s, _ := g.frame.Params.WorkloadInfo["id"].(string)
	return s
}

func (g got) seq() int64 {
	f, _ := g.frame.Params.WorkloadInfo["seq"].(float64)
	return int64(f)
}

// fakeIngress stands in for the daemon's ingress: answer decides each
// answer (nil: 200), and it records what it got and whether two frames of
// one job were ever in flight at once.
type fakeIngress struct {
	answer func(g got, n int) (status int, header http.Header)
	hold   chan struct{} // when set, every request waits for it to close

	mu       sync.Mutex
	reqs     []got
	inFlight map[string]int
	overlap  []string // ids that had two frames in flight at once
}

func (f *fakeIngress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var g got
	g.method, g.path, g.lease = r.Method, r.URL.Path, r.Header.Values("Workload-Lease")
	b, _ := io.ReadAll(r.Body)
	json.Unmarshal(b, &g.frame)
	id := g.id()
	f.mu.Lock()
	if f.inFlight == nil {
		f.inFlight = map[string]int{}
	}
	f.inFlight[id]++
	if f.inFlight[id] > 1 {
		f.overlap = append(f.overlap, id)
	}
	f.reqs = append(f.reqs, g)
	n := len(f.reqs)
	f.mu.Unlock()
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-r.Context().Done():
		}
	}
	status, header := http.StatusOK, http.Header(nil)
	if f.answer != nil {
		status, header = f.answer(g, n)
	}
	// The frame leaves flight before the answer is written: the client may
	// send the job's next frame the moment it reads the answer.
	f.mu.Lock()
	f.inFlight[id]--
	f.mu.Unlock()
	for k, v := range header {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
	if status != http.StatusOK {
		io.WriteString(w, "the reason\n")
	}
}

func (f *fakeIngress) requests() []got {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]got(nil), f.reqs...)
}

// testNodeID is the node id the fake nodes answer GET /v1/node with.
const testNodeID = "0b5e7c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5b"

// serve starts f and returns its HOST:PORT.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// newClient is New for a test: quiet, closed at cleanup.
func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

// closeWithin closes c and fails the test on an error.
func closeWithin(t *testing.T, c *Client, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// eventually waits for cond, failing after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// holdsWithin fails the test if cond stops holding within d.
func holdsWithin(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if !cond() {
			t.Fatalf("%s stopped holding", what)
		}
	}
}

var wantMethod = map[string]string{"queued": "workload:submitted", "running": "workload:started",
	"completed": "workload:completed", "failed": "workload:errored", "cancelled": "workload:errored"}

func TestAJobsFramesGoInOrderWithRisingSeqTheirStatesMethodMillisecondsAndALeaseUntilTheEnd(t *testing.T) {
	in := &fakeIngress{}
	c := newClient(t, Config{Addr: serve(t, in), Producer: "myharness"})
	job, err := c.Submit(context.Background(), JobSpec{Model: "qwen3-8b", Engine: "vllm", Extra: map[string]any{"slot": 3}})
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	if err := job.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := job.Fail("late"); !errors.Is(err, ErrJobEnded) {
		t.Errorf("a frame after the terminal one: %v, want ErrJobEnded", err)
	}
	closeWithin(t, c, 10*time.Second)
	reqs := in.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests, want 3", len(reqs))
	}
	for i, g := range reqs {
		wi := g.frame.Params.WorkloadInfo
		state := wi["state"].(string)
		if g.method != http.MethodPost || g.path != "/v1/workloads/events" {
			t.Errorf("request %d: %s %s", i, g.method, g.path)
		}
		if g.seq() != int64(i+1) || g.frame.Method != wantMethod[state] || state != []string{"queued", "running", "completed"}[i] {
			t.Errorf("request %d: seq %d method %s state %s", i, g.seq(), g.frame.Method, state)
		}
		if wi["id"] != job.ID() || !strings.HasPrefix(job.ID(), "myharness-") || wi["requesterId"] != "myharness" || wi["slot"] != 3.0 {
			t.Errorf("request %d: %v", i, wi)
		}
		if _, has := wi["originatedFrom"]; has {
			t.Errorf("request %d sends originatedFrom; the daemon stamps it", i)
		}
		for _, k := range []string{"createdAt", "startedAt", "completedAt"} {
			if v, ok := wi[k].(float64); ok && v < 1e12 {
				t.Errorf("request %d: %s %v is not epoch milliseconds", i, k, v)
			}
		}
		wantLease := []string{"30"}
		if state == "completed" {
			wantLease = nil
		}
		if strings.Join(g.lease, ",") != strings.Join(wantLease, ",") {
			t.Errorf("request %d (%s): Workload-Lease %q, want %q", i, state, g.lease, wantLease)
		}
	}
	if s := c.Stats(); s.Sent != 3 || s.Queued != 0 || s.Dropped != 0 || s.Retried != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestFramesRequestedFromManyGoroutinesGoOneAtATimePerJobInSeqOrder(t *testing.T) {
	in := &fakeIngress{answer: func(g got, n int) (int, http.Header) {
		time.Sleep(time.Millisecond) // widen the window two frames of a job would share
		return http.StatusOK, nil
	}}
	c := newClient(t, Config{Addr: serve(t, in), Workers: 8})
	const jobs, callers = 20, 5
	var wg sync.WaitGroup
	for range jobs {
		job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
		if err != nil {
			t.Fatal(err)
		}
		var inner sync.WaitGroup
		for range callers {
			inner.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer inner.Done()
				if err := job.Start(); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			inner.Wait()
			if err := job.Complete(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	closeWithin(t, c, 30*time.Second)
	reqs := in.requests()
	if len(reqs) != jobs*(callers+2) {
		t.Fatalf("%d requests, want %d", len(reqs), jobs*(callers+2))
	}
	in.mu.Lock()
	if len(in.overlap) > 0 {
		t.Errorf("two frames of one job in flight at once: %v", in.overlap)
	}
	in.mu.Unlock()
	last := map[string]int64{}
	for _, g := range reqs {
		state := g.frame.Params.WorkloadInfo["state"].(string)
		if g.frame.Method != wantMethod[state] {
			t.Errorf("%s: method %s with state %s", g.id(), g.frame.Method, state)
		}
		if g.seq() != last[g.id()]+1 {
			t.Errorf("%s: seq %d after %d", g.id(), g.seq(), last[g.id()])
		}
		last[g.id()] = g.seq()
		if (state == "completed") != (g.seq() == callers+2) {
			t.Errorf("%s: state %s at seq %d", g.id(), state, g.seq())
		}
	}
}

// recordWaits makes c record its waits between tries and end them at once.
func recordWaits(c *Client) func() []time.Duration {
	var mu sync.Mutex
	var waits []time.Duration
	c.afterFunc = func(d time.Duration, f func()) *time.Timer {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		return time.AfterFunc(0, f)
	}
	return func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Duration(nil), waits...)
	}
}

func TestRetriesBackOffDoublingToTheCapJitteredAndHonourRetryAfter(t *testing.T) {
	in := &fakeIngress{answer: func(g got, n int) (int, http.Header) {
		switch {
		case n <= 6:
			return http.StatusInternalServerError, nil
		case n == 7:
			return http.StatusServiceUnavailable, http.Header{"Retry-After": {"7"}}
		case n == 8:
			return http.StatusTooManyRequests, http.Header{"Retry-After": {"100000"}}
		}
		return http.StatusOK, nil
	}}
	c := newClient(t, Config{Addr: serve(t, in), BackoffMin: 100 * time.Millisecond, BackoffMax: 400 * time.Millisecond, RetryAfterMax: time.Minute})
	waits := recordWaits(c)
	if _, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"}); err != nil {
		t.Fatal(err)
	}
	closeWithin(t, c, 10*time.Second)
	w := waits()
	caps := []time.Duration{100, 200, 400, 400, 400, 400}
	if len(w) != 8 {
		t.Fatalf("waits %v, want 8", w)
	}
	jittered := false
	for i, d := range caps {
		d *= time.Millisecond
		if w[i] < d/2 || w[i] > d {
			t.Errorf("wait %d is %s, want within [%s, %s]", i, w[i], d/2, d)
		}
		jittered = jittered || w[i] != d
	}
	if !jittered { // each wait is its cap by a chance of 1 in 50,000,000 or less
		t.Errorf("waits %v are not jittered", w[:len(caps)])
	}
	if w[6] < 7*time.Second || w[6] > 7*time.Second*5/4 {
		t.Errorf("after Retry-After: 7 the client waited %s, want 7 s and up to a quarter more", w[6])
	}
	if w[7] < time.Minute || w[7] > time.Minute*5/4 {
		t.Errorf("after Retry-After: 100000 the client waited %s, want RetryAfterMax (1 m) and up to a quarter more", w[7])
	}
	if s := c.Stats(); s.Sent != 1 || s.Retried != 8 {
		t.Errorf("stats %+v, want 1 sent, 8 retried", s)
	}
}

func TestA4xxOtherThan408And429IsNeverRetriedAnd409DropsTheJobsRest(t *testing.T) {
	for _, status := range []int{400, 403, 404, 405, 409, 413, 415, 421} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			in := &fakeIngress{answer: func(g got, n int) (int, http.Header) {
				if n == 1 {
					return status, nil
				}
				return http.StatusOK, nil
			}}
			c := newClient(t, Config{Addr: serve(t, in), Workers: 1})
			waits := recordWaits(c)
			job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the answer", func() bool { return job.Err() != nil })
			var se *StatusError
			if !errors.As(job.Err(), &se) || se.Status != status || se.Reason != "the reason" {
				t.Fatalf("job.Err() = %v", job.Err())
			}
			err = job.Start()
			if status == http.StatusConflict {
				if !errors.Is(err, ErrOwned) {
					t.Errorf("Start after a 409: %v, want ErrOwned", err)
				}
			} else if err != nil {
				t.Errorf("Start after a %d: %v", status, err)
			}
			closeWithin(t, c, 10*time.Second)
			want := 2
			if status == http.StatusConflict {
				want = 1
			}
			if n := len(in.requests()); n != want || len(waits()) != 0 {
				t.Errorf("%d requests and waits %v, want %d requests and no retry", n, waits(), want)
			}
			if s := c.Stats(); s.Refused != 1 || s.Retried != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
	for _, status := range []int{408, 429, 500, 502, 503} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			in := &fakeIngress{answer: func(g got, n int) (int, http.Header) {
				if n == 1 {
					return status, nil
				}
				return http.StatusOK, nil
			}}
			c := newClient(t, Config{Addr: serve(t, in)})
			recordWaits(c)
			if _, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"}); err != nil {
				t.Fatal(err)
			}
			closeWithin(t, c, 10*time.Second)
			if s := c.Stats(); s.Sent != 1 || s.Retried != 1 || s.Refused != 0 {
				t.Errorf("stats %+v, want the frame retried once and sent", s)
			}
		})
	}
}

func TestAFrameThatIsAlreadyOwnedByABrokerDropsItsQueuedFrames(t *testing.T) {
	release := make(chan struct{})
	in := &fakeIngress{answer: func(g got, n int) (int, http.Header) {
		<-release
		return http.StatusConflict, nil
	}}
	c := newClient(t, Config{Addr: serve(t, in)})
	job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	job.Start()
	job.Complete()
	close(release)
	closeWithin(t, c, 10*time.Second)
	if n := len(in.requests()); n != 1 {
		t.Errorf("%d requests after a 409, want 1", n)
	}
	if s := c.Stats(); s.Refused != 1 || s.Dropped != 2 {
		t.Errorf("stats %+v, want 1 refused and the 2 queued behind it dropped", s)
	}
}

func TestTheQueueIsBoundedAndWhatItDropsIsCounted(t *testing.T) {
	in := &fakeIngress{hold: make(chan struct{})}
	c := newClient(t, Config{Addr: serve(t, in), QueueSize: 3})
	var jobs []*Job
	for range 3 {
		job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, job)
	}
	if _, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("a fourth frame: %v, want ErrQueueFull", err)
	}
	if err := jobs[0].Complete(); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("a fifth frame: %v, want ErrQueueFull", err)
	}
	if s := c.Stats(); s.Queued != 3 || s.Dropped != 2 {
		t.Errorf("stats %+v, want 3 queued, 2 dropped", s)
	}
	close(in.hold)
	eventually(t, "the queue to drain", func() bool { return c.Stats().Queued == 0 })
	// The refused Complete left the job as it was: sent again, it is the
	// job's second frame.
	if err := jobs[0].Complete(); err != nil {
		t.Fatal(err)
	}
	closeWithin(t, c, 10*time.Second)
	reqs := in.requests()
	if last := reqs[len(reqs)-1]; last.seq() != 2 || last.frame.Method != "workload:completed" {
		t.Errorf("the retried Complete went as seq %d %s, want seq 2 workload:completed", last.seq(), last.frame.Method)
	}
}

func TestCloseReturnsAtItsDeadlineWhenTheDaemonDoesNotAnswer(t *testing.T) {
	in := &fakeIngress{hold: make(chan struct{})}
	defer close(in.hold)
	c := newClient(t, Config{Addr: serve(t, in)})
	if _, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the frame in flight", func() bool { return len(in.requests()) == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Close(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 frames not sent") {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return at its deadline")
	}
	if _, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"}); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit after Close: %v", err)
	}
}

func TestLeasesAreRenewedWhileTheJobLivesAndEndWithItsTerminalFrame(t *testing.T) {
	in := &fakeIngress{}
	c := newClient(t, Config{Addr: serve(t, in), Lease: 6 * time.Second})
	c.renewEvery = 10 * time.Millisecond
	job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	job.Start()
	eventually(t, "two renewals of the running frame", func() bool {
		n := 0
		for _, g := range in.requests() {
			if g.frame.Method == "workload:started" {
				n++
			}
		}
		return n >= 3
	})
	job.Complete()
	lastIsCompleted := func() bool {
		reqs := in.requests()
		return reqs[len(reqs)-1].frame.Method == "workload:completed"
	}
	eventually(t, "the completed frame", lastIsCompleted)
	holdsWithin(t, "nothing renewed after the completed frame", 20*c.renewEvery, lastIsCompleted)
	closeWithin(t, c, 10*time.Second)
	reqs := in.requests()
	for _, g := range reqs[:len(reqs)-1] {
		if strings.Join(g.lease, ",") != "6" || g.frame.Method == "workload:completed" {
			t.Errorf("%s seq %d: lease %q", g.frame.Method, g.seq(), g.lease)
		}
	}
	if last := reqs[len(reqs)-1]; last.frame.Method != "workload:completed" || len(last.lease) != 0 {
		t.Errorf("the last frame is %s with lease %q, want the completed frame without one", last.frame.Method, last.lease)
	}
}

func TestNoLeaseWhenTheCallerSaysSoAndABadLeaseIsRefused(t *testing.T) {
	in := &fakeIngress{}
	c := newClient(t, Config{Addr: serve(t, in), Lease: -1})
	if _, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"}); err != nil {
		t.Fatal(err)
	}
	closeWithin(t, c, 10*time.Second)
	if l := in.requests()[0].lease; len(l) != 0 {
		t.Errorf("Workload-Lease %q with Lease -1", l)
	}
	for _, l := range []time.Duration{time.Second, 4 * time.Second, 5500 * time.Millisecond, 25 * time.Hour} {
		if _, err := New(Config{Lease: l}); err == nil || !strings.Contains(err.Error(), "Lease") {
			t.Errorf("Lease %s: %v", l, err)
		}
	}
}

func TestIDsDoNotCollideAndStayWithinTheDaemonsBound(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewID("p")
		if seen[id] {
			t.Fatalf("%s minted twice", id)
		}
		seen[id] = true
		if !strings.HasPrefix(id, "p-") || !strings.Contains(id, "-"+strconv.Itoa(os.Getpid())+"-") {
			t.Fatalf("%s lacks the prefix or the pid", id)
		}
	}
	if id := NewID(strings.Repeat("x", 300)); len(id) > 256 {
		t.Errorf("a long prefix makes a %d-byte id", len(id))
	}
}

func TestExtraFieldsThatFoldToTheWorkloadsOwnAreRefused(t *testing.T) {
	c := newClient(t, Config{Addr: "127.0.0.1:1"})
	for _, k := range []string{"State", "SEQ", "originatedfrom", "Resync"} {
		if _, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e", Extra: map[string]any{k: 1}}); err == nil {
			t.Errorf("Extra %q accepted", k)
		}
	}
}

func TestScheduledOnByMemberNameFromTheNode(t *testing.T) {
	in := &fakeIngress{}
	mux := http.NewServeMux()
	mux.Handle("/v1/workloads/events", in)
	mux.HandleFunc("/v1/node", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"nodeId":"`+testNodeID+`","nodeIdSource":"node-id.json","version":"dev","members":[{"name":"gpu-2","nodeId":"n-2","delivering":true}],"limits":{"bodyMaxBytes":32768}}`)
	})
	c := newClient(t, Config{Addr: serve(t, mux)})
	n, err := c.Node(context.Background())
	if err != nil || n.NodeID != testNodeID || len(n.Members) != 1 || !n.Members[0].Delivering || n.Limits.BodyMaxBytes != 32768 {
		t.Fatalf("Node: %+v, %v", n, err)
	}
	if _, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e", ScheduledOnMember: "gpu-2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e", ScheduledOnMember: "gpu-9"}); err == nil || !strings.Contains(err.Error(), `"gpu-9"`) {
		t.Errorf("an unknown member: %v", err)
	}
	closeWithin(t, c, 10*time.Second)
	if got := in.requests()[0].frame.Params.WorkloadInfo["scheduledOn"]; got != "n-2" {
		t.Errorf("scheduledOn %v, want n-2", got)
	}
}

// A member's name, once learned, is answered while the node cannot answer
// GET /v1/node (its daemon restarting): a Submit naming a member then
// queues like any other, instead of failing for a node id that does not
// change. A name never learned still needs the node.
func TestAMemberNameLearnedOnceIsResolvedWhileTheNodeDoesNotAnswer(t *testing.T) {
	in := &fakeIngress{}
	var nodeDown atomic.Bool
	var nodeAsked atomic.Int64
	var members atomic.Value
	members.Store(`[{"name":"gpu-2","nodeId":"n-2"}]`)
	mux := http.NewServeMux()
	mux.Handle("/v1/workloads/events", in)
	mux.HandleFunc("/v1/node", func(w http.ResponseWriter, r *http.Request) {
		nodeAsked.Add(1)
		if nodeDown.Load() {
			http.Error(w, "restarting", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"nodeId":"`+testNodeID+`","members":`+members.Load().(string)+`,"limits":{}}`)
	})
	c := newClient(t, Config{Addr: serve(t, mux)})
	submit := func(member string) error {
		_, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e", ScheduledOnMember: member})
		return err
	}
	if err := submit("gpu-2"); err != nil {
		t.Fatal(err)
	}
	nodeDown.Store(true)
	asked := nodeAsked.Load()
	if err := submit("gpu-2"); err != nil || nodeAsked.Load() != asked {
		t.Fatalf("a member learned just now: %v, after %d more GET /v1/node; want it answered from what was learned", err, nodeAsked.Load()-asked)
	}
	c.members.mu.Lock()
	c.members.learned = time.Now().Add(-2 * memberFresh)
	c.members.mu.Unlock()
	if err := submit("gpu-2"); err != nil || nodeAsked.Load() != asked+1 {
		t.Fatalf("a member learned long ago, the node down: %v after %d more GET /v1/node; want the node asked once, then what was learned", err, nodeAsked.Load()-asked)
	}
	if err := submit("gpu-9"); err == nil {
		t.Fatal("a member never learned was resolved while the node does not answer")
	}
	// A restarted daemon answers no members until its first discovery
	// snapshot: that teaches nothing.
	nodeDown.Store(false)
	members.Store(`[]`)
	c.members.mu.Lock()
	c.members.learned = time.Now().Add(-2 * memberFresh)
	c.members.mu.Unlock()
	if err := submit("gpu-2"); err != nil {
		t.Fatalf("a member learned long ago, the node answering no members yet: %v", err)
	}
	// Of two members of one name the first listed wins, asked or cached.
	members.Store(`[{"name":"gpu-3","nodeId":"n-3a"},{"name":"gpu-3","nodeId":"n-3b"}]`)
	for range 2 {
		if id, err := c.MemberID(context.Background(), "gpu-3"); err != nil || id != "n-3a" {
			t.Fatalf("a name listed twice: %q %v, want the first listed, n-3a", id, err)
		}
	}
	closeWithin(t, c, 10*time.Second)
	for i, r := range in.requests() {
		if got := r.frame.Params.WorkloadInfo["scheduledOn"]; got != "n-2" {
			t.Errorf("frame %d: scheduledOn %v, want n-2", i, got)
		}
	}
}

func TestTheOutboxKeepsTerminalFramesAcrossARestartAndSurvivesATornFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.jsonl")
	down := &fakeIngress{answer: func(g got, n int) (int, http.Header) {
		if g.frame.Method == "workload:completed" {
			return http.StatusInternalServerError, nil
		}
		return http.StatusOK, nil
	}}
	c1 := newClient(t, Config{Addr: serve(t, down), OutboxPath: path})
	recordWaits(c1)
	job, err := c1.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	job.Complete()
	if s := c1.Stats(); s.OutboxPending != 1 {
		t.Fatalf("stats %+v, want the completed frame in the outbox", s)
	}
	eventually(t, "a retry of the completed frame", func() bool { return c1.Stats().Retried > 0 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c1.Close(ctx); err == nil {
		t.Fatal("Close with the completed frame unsent returned nil")
	}

	// The restarted producer, its file cut short by a crash of another
	// writer: the whole line is replayed, the torn one skipped.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"key":"x\u0000","id":"x","method":"workload:compl`)
	f.Close()
	up := &fakeIngress{}
	c2 := newClient(t, Config{Addr: serve(t, up), OutboxPath: path})
	closeWithin(t, c2, 10*time.Second)
	reqs := up.requests()
	if len(reqs) != 1 || reqs[0].id() != job.ID() || reqs[0].frame.Method != "workload:completed" || reqs[0].seq() != 2 {
		t.Fatalf("after the restart the daemon got %+v, want the completed frame of %s", reqs, job.ID())
	}
	if s := c2.Stats(); s.OutboxTorn != 1 || s.OutboxPending != 0 || s.Sent != 1 {
		t.Errorf("stats %+v, want 1 torn line, the outbox empty, 1 sent", s)
	}
	if _, left, err := openOutbox(path, 10); err != nil || len(left) != 0 {
		t.Errorf("the outbox, read again, holds %v (%v)", left, err)
	}
}

func TestTheOutboxIsBounded(t *testing.T) {
	in := &fakeIngress{hold: make(chan struct{})}
	path := filepath.Join(t.TempDir(), "outbox.jsonl")
	c := newClient(t, Config{Addr: serve(t, in), OutboxPath: path, OutboxMax: 2})
	for range 3 {
		job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
		if err != nil {
			t.Fatal(err)
		}
		if err := job.Fail("boom"); err != nil {
			t.Fatal(err)
		}
	}
	if s := c.Stats(); s.OutboxPending != 2 || s.OutboxFull != 1 {
		t.Errorf("stats %+v, want 2 in the outbox and 1 not kept", s)
	}
	close(in.hold)
	closeWithin(t, c, 10*time.Second)
	if s := c.Stats(); s.OutboxPending != 0 || s.Sent != 6 {
		t.Errorf("stats %+v, want every frame sent and the outbox empty", s)
	}
}

func TestRenewalsDoNotPileUpBehindAFrameThatWaits(t *testing.T) {
	in := &fakeIngress{hold: make(chan struct{})}
	defer close(in.hold)
	c := newClient(t, Config{Addr: serve(t, in)})
	c.renewEvery = 5 * time.Millisecond
	job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	job.Start()
	holdsWithin(t, "two frames queued while the daemon does not answer", 40*c.renewEvery, func() bool { return c.Stats().Queued <= 2 })
}

func TestARemovalIsTheJobsLastFrameAndNamesItsWorkload(t *testing.T) {
	in := &fakeIngress{}
	c := newClient(t, Config{Addr: serve(t, in)})
	job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := job.Complete(); !errors.Is(err, ErrJobEnded) {
		t.Errorf("Complete after Remove: %v, want ErrJobEnded", err)
	}
	closeWithin(t, c, 10*time.Second)
	reqs := in.requests()
	if len(reqs) != 2 || reqs[1].frame.Method != "workloads:remove" || reqs[1].frame.Params.WorkloadID != job.ID() || len(reqs[1].lease) != 0 {
		t.Fatalf("requests %+v, want the submitted frame, then a removal of %s without a lease", reqs, job.ID())
	}
}

func TestRetryAfterIsReadAsSecondsOrAnHTTPDate(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 0, "7": 7 * time.Second, " 2 ": 2 * time.Second, "0": 0, "-3": 0, "soon": 0} {
		if got := parseRetryAfter(v); got != want {
			t.Errorf("Retry-After %q: %s, want %s", v, got, want)
		}
	}
	if got := parseRetryAfter(time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)); got < 58*time.Minute || got > time.Hour {
		t.Errorf("a date an hour ahead: %s", got)
	}
	if got := parseRetryAfter(time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)); got != 0 {
		t.Errorf("a date in the past: %s", got)
	}
}

func TestTheOutboxJournalIsCompactedAsFramesAreTaken(t *testing.T) {
	in := &fakeIngress{}
	path := filepath.Join(t.TempDir(), "outbox.jsonl")
	c := newClient(t, Config{Addr: serve(t, in), OutboxPath: path, Lease: -1})
	for range 100 {
		job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
		if err != nil {
			t.Fatal(err)
		}
		job.Complete()
	}
	closeWithin(t, c, 10*time.Second)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing is held: at most the 2 x 0 + 16 lines a compaction allows.
	if n := strings.Count(string(b), "\n"); n > 16 {
		t.Errorf("the outbox has %d lines after 100 frames were taken, want at most 16", n)
	}
	if s := c.Stats(); s.OutboxPending != 0 || s.Sent != 200 {
		t.Errorf("stats %+v", s)
	}
}
