package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Traffic shape of --simulate, per path (node 1's ingress, and each other
// node's broker): one event every minStep..maxStep, at most maxLive jobs
// queued or running, at most keepTerminal finished jobs kept before the
// oldest is removed, and a share of the finished jobs removed a little later.
const (
	minStep        = 200 * time.Millisecond
	maxStep        = 700 * time.Millisecond
	maxLive        = 4
	keepTerminal   = 6
	keepAtLeast    = 2 // a path never removes its last jobs, so every view shows both paths
	removeShare    = 0.3
	ingressTries   = 4
	ingressBackoff = 100 * time.Millisecond
)

var (
	simModels  = []string{"qwen3-8b", "llama3.1-8b", "gemma3-12b", "mistral-7b", "qwen2.5-coder"}
	simEngines = []string{"llamacpp", "vllm", "sglang", "mlx"}
)

// workloadInfo is the workload object the simulator reports (spec.md
// 3.2), in the field order of the README's workload object table.
type workloadInfo struct {
	ID             string  `json:"id"`
	Model          string  `json:"model"`
	Engine         string  `json:"engine"`
	State          string  `json:"state"`
	OriginatedFrom string  `json:"originatedFrom,omitempty"` // left out on the ingress: the daemon stamps it
	ScheduledOn    string  `json:"scheduledOn,omitempty"`
	RunID          string  `json:"runId,omitempty"`
	Seq            int     `json:"seq"`
	CreatedAt      int64   `json:"createdAt"`
	StartedAt      *int64  `json:"startedAt"`
	CompletedAt    *int64  `json:"completedAt"`
	Error          *string `json:"error"`
	RequesterID    string  `json:"requesterId"`
}

type simJob struct {
	info     workloadInfo // as last accepted
	removeAt time.Time    // when a finished job is to be removed; zero: kept
	doneAt   time.Time
	sentAt   time.Time // the ingress path's last accepted frame for it, which armed its lease (simlease.go)
	crashed  bool      // the ingress producer stopped reporting it: its lease retires it
}

func (j *simJob) terminal() bool { return j.doneAt != time.Time{} }

// simStats counts what the simulator did, for the view's header.
type simStats struct {
	mu            sync.Mutex
	ingressOK     int
	ingressRetry  int
	ingressRefuse int
	lastProblem   string
	brokerEvents  int
	leases        simLeaseStats
}

func (s *simStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	line := fmt.Sprintf("traffic: ingress %d accepted, %d retried, %d refused; broker paths %d events",
		s.ingressOK, s.ingressRetry, s.ingressRefuse, s.brokerEvents)
	line += s.leases.String()
	if s.lastProblem != "" {
		line += "; last problem: " + s.lastProblem
	}
	return line
}

func (s *simStats) add(f func(*simStats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// simulator drives realistic traffic: jobs reported through node 1's
// ingress over HTTP, and jobs entered through the other nodes' brokers.
type simulator struct {
	c      *cluster
	client *http.Client
	url    string // node 1's ingress endpoint
	runID  string // this producer's nonce
	stats  simStats
	step   [2]time.Duration // the pause between two events of a path: from, to
	// crashShare and renewEvery shape the ingress producer's leases
	// (simlease.go): simCrashShare and simRenewEvery but in tests.
	crashShare float64
	renewEvery time.Duration
	// crashNext makes the ingress producer crash on the next job it would
	// move on; endsHeld stops every path from ending a job (chaos.go).
	crashNext atomic.Bool
	endsHeld  atomic.Bool

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	paths     []*simPath // set by start; each path's own goroutine owns its jobs until stop
	drainOnce sync.Once

	// removalMu is held for reading by a path while it removes a job, so
	// holdRemovals returns only once no removal is in flight.
	removalMu    sync.RWMutex
	removalsHeld bool
	removedMu    sync.Mutex
	removed      []jobKey // every workload removed, in order
}

// holdRemovals stops the removals and returns once none is in flight.
// Removals are never replayed nor re-asserted (spec.md 5: a removal leaves the
// re-sync set, so no heartbeat repairs one): a test
// that kills a node holds them, so that none can miss the dead node.
func (s *simulator) holdRemovals() {
	s.removalMu.Lock()
	defer s.removalMu.Unlock()
	s.removalsHeld = true
}

// resumeRemovals lets the removals go again after holdRemovals.
func (s *simulator) resumeRemovals() {
	s.removalMu.Lock()
	defer s.removalMu.Unlock()
	s.removalsHeld = false
}

// intended returns, once the traffic has stopped, the state each path last
// meant for each job it has not removed, and whether the job is leased
// through node 1's ingress (a lease-expired job is failed).
func (s *simulator) intended() map[jobKey]simIntent {
	out := map[jobKey]simIntent{}
	for _, p := range s.paths {
		origin := s.c.nodes[0].id
		if p.node != nil {
			origin = p.node.id
		}
		for _, j := range p.jobs {
			out[jobKey{origin, j.info.ID}] = simIntent{state: j.info.State, leased: p.node == nil, crashed: j.crashed}
		}
	}
	return out
}

// simIntent is what a path last meant for a job.
type simIntent struct {
	state   string
	leased  bool // reported through the ingress with a lease
	crashed bool // its producer stopped reporting it
}

// accepts reports whether a Jobs list showing state honours the intent: the
// state last reported, or failed for a leased job still live when its
// producer stopped (crashed, or at the end of the traffic).
func (i simIntent) accepts(state string) bool {
	live := i.state == "queued" || i.state == "running"
	return state == i.state || (state == "failed" && i.leased && (live || i.crashed))
}

// removedJobs returns every workload the simulator removed.
func (s *simulator) removedJobs() []jobKey {
	s.removedMu.Lock()
	defer s.removedMu.Unlock()
	return append([]jobKey(nil), s.removed...)
}

// simPath is one way work enters the cluster.
type simPath struct {
	s      *simulator
	prefix string // id prefix
	node   *node  // the broker path's node; nil for the ingress
	rng    *rand.Rand
	jobs   []*simJob
	next   int
}

func newSimulator(c *cluster) *simulator {
	s := &simulator{c: c, client: &http.Client{Timeout: 5 * time.Second}, step: [2]time.Duration{minStep, maxStep},
		crashShare: simCrashShare, renewEvery: simRenewEvery}
	s.runID = fmt.Sprintf("%08x", rand.Uint32())
	if addr := c.nodes[0].ingressAddr(); addr != "" {
		s.url = "http://" + addr + "/v1/workloads/events"
	}
	return s
}

// start launches one goroutine per path: node 1's ingress, and the broker
// of every other node (node 1's broker when it is alone).
func (s *simulator) start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	var paths []*simPath
	if s.url != "" {
		paths = append(paths, &simPath{s: s, prefix: "ing"})
	}
	brokers := s.c.nodes[1:]
	if len(brokers) == 0 {
		brokers = s.c.nodes
	}
	for _, n := range brokers {
		paths = append(paths, &simPath{s: s, prefix: n.short, node: n})
	}
	s.paths = paths
	for _, p := range paths {
		p.rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
		s.wg.Go(func() { p.run(ctx) })
	}
}

// stop ends the traffic and waits until no event is in flight, then
// finishes the stock nodes' live jobs (drainStock). It may be called more
// than once.
func (s *simulator) stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	s.drainOnce.Do(s.drainStock)
}

func (p *simPath) run(ctx context.Context) {
	for {
		d := p.s.step[0] + time.Duration(p.rng.Int64N(int64(p.s.step[1]-p.s.step[0])+1))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		p.step(ctx)
	}
}

// step sends one event: a due removal, a new job, or the next state of a
// live one.
func (p *simPath) step(ctx context.Context) {
	now := time.Now()
	if p.node == nil {
		p.tendLeases(ctx, now) // renew what runs, learn what expired (simlease.go)
	}
	if p.removeDue(ctx, now) {
		return
	}
	var live []*simJob
	for _, j := range p.jobs {
		if !j.terminal() && !j.crashed {
			live = append(live, j)
		}
	}
	if j := p.silentStockJob(live, now); j != nil {
		if p.s.endsHeld.Load() && j.info.State == "running" {
			// It may not end now (chaos.go): report it again as it is.
			if p.send(ctx, "workload:started", j.info) {
				j.sentAt = now
			}
			return
		}
		p.advance(ctx, j, now)
		return
	}
	if len(live) < maxLive && (len(live) == 0 || p.rng.Float64() < 0.4) {
		p.submit(ctx, now)
		return
	}
	p.advance(ctx, live[p.rng.IntN(len(live))], now)
}

// silentStockJob returns a live job of a stock node's path whose last frame
// is a third of the staleness budget old, or nil. The stock daemon
// re-asserts live jobs every 30 s, whatever --resync-interval says, so with
// a demo's short budget the other brokers would fail such a job by
// inference while its own broker shows it live; the path moves it on
// before that, as a producer reports progress.
func (p *simPath) silentStockJob(live []*simJob, now time.Time) *simJob {
	budget := p.s.c.cfg.staleAfter
	if p.node == nil || !p.node.stock || budget <= 0 {
		return nil
	}
	for _, j := range live {
		if now.Sub(j.sentAt) >= budget/3 {
			return j
		}
	}
	return nil
}

// drainStock finishes every live job of the stock nodes' paths, once the
// traffic has stopped, for the same reason (silentStockJob): with no more
// frames, their only re-assertion would be the stock heartbeat's.
func (s *simulator) drainStock() {
	for _, p := range s.paths {
		if p.node == nil || !p.node.stock {
			continue
		}
		for _, j := range p.jobs {
			if j.terminal() {
				continue
			}
			next := j.info
			next.Seq++
			ms := time.Now().UnixMilli()
			next.State, next.CompletedAt = "completed", &ms
			if next.StartedAt == nil {
				next.StartedAt = &ms
			}
			if p.send(context.Background(), "workload:completed", next) {
				j.info, j.doneAt = next, time.Now()
			}
		}
	}
}

func (p *simPath) submit(ctx context.Context, now time.Time) {
	p.next++
	info := workloadInfo{
		ID:          fmt.Sprintf("%s-%04d", p.prefix, p.next),
		Model:       simModels[p.rng.IntN(len(simModels))],
		Engine:      simEngines[p.rng.IntN(len(simEngines))],
		State:       "queued",
		Seq:         1,
		CreatedAt:   now.UnixMilli(),
		RequesterID: "devcluster-sim",
	}
	if p.node != nil {
		info.OriginatedFrom, info.ScheduledOn = p.node.id, p.node.id
	} else {
		info.RunID = p.s.runID
	}
	if p.send(ctx, "workload:submitted", info) {
		p.jobs = append(p.jobs, &simJob{info: info, sentAt: now})
	}
}

// advance moves a live job on: queued -> running (sometimes cancelled),
// running -> completed (sometimes failed or cancelled).
func (p *simPath) advance(ctx context.Context, j *simJob, now time.Time) {
	if p.node == nil && (p.rng.Float64() < p.s.crashShare || p.s.crashNext.CompareAndSwap(true, false)) {
		p.crash(j)
		return
	}
	if p.s.endsHeld.Load() && j.info.State != "queued" {
		return // no job ends while a fault could lose its end (chaos.go)
	}
	next := j.info
	next.Seq++
	ms := now.UnixMilli()
	r := p.rng.Float64()
	if p.s.endsHeld.Load() {
		r = 0 // queued -> running, never cancelled
	}
	method := "workload:errored"
	switch {
	case j.info.State == "queued" && r < 0.9:
		method, next.State, next.StartedAt = "workload:started", "running", &ms
	case j.info.State == "queued":
		next.State, next.CompletedAt, next.Error = "cancelled", &ms, ptr("cancelled before it started")
	case r < 0.75:
		method, next.State, next.CompletedAt = "workload:completed", "completed", &ms
	case r < 0.9:
		next.State, next.CompletedAt, next.Error = "failed", &ms, ptr("engine exited: CUDA out of memory")
	default:
		next.State, next.CompletedAt, next.Error = "cancelled", &ms, ptr("cancelled by the requester")
	}
	if !p.send(ctx, method, next) {
		return
	}
	j.info, j.sentAt = next, now
	if next.State != "running" {
		j.doneAt = now
		if p.rng.Float64() < removeShare {
			// removed a few steps later: 1.4 to 4.2 s at the default pace
			j.removeAt = now.Add(2*p.s.step[1] + time.Duration(p.rng.Int64N(int64(4*p.s.step[1]))))
		}
	}
}

func ptr(s string) *string { return &s }

// removeDue removes a finished job that is due, or the oldest finished one
// when the path keeps too many, and reports whether it sent a removal.
func (p *simPath) removeDue(ctx context.Context, now time.Time) bool {
	p.s.removalMu.RLock()
	defer p.s.removalMu.RUnlock()
	if p.s.removalsHeld || len(p.jobs) <= keepAtLeast {
		return false
	}
	var oldest *simJob
	finished := 0
	for _, j := range p.jobs {
		if !j.terminal() {
			continue
		}
		finished++
		if oldest == nil || j.doneAt.Before(oldest.doneAt) {
			oldest = j
		}
		if !j.removeAt.IsZero() && now.After(j.removeAt) {
			p.remove(ctx, j)
			return true
		}
	}
	if finished > keepTerminal {
		p.remove(ctx, oldest)
		return true
	}
	return false
}

func (p *simPath) remove(ctx context.Context, j *simJob) {
	var ok bool
	if p.node != nil {
		p.node.broker.localRemove(j.info.ID)
		p.s.stats.add(func(s *simStats) { s.brokerEvents++ })
		ok = true
	} else {
		params, _ := json.Marshal(map[string]string{"workloadId": j.info.ID})
		ok = p.s.post(ctx, "workloads:remove", params)
	}
	if ok {
		p.jobs = deleteJob(p.jobs, j)
		origin := p.s.c.nodes[0].id // the ingress stamps node 1's id
		if p.node != nil {
			origin = p.node.id
		}
		p.s.removedMu.Lock()
		p.s.removed = append(p.s.removed, jobKey{origin, j.info.ID})
		p.s.removedMu.Unlock()
	}
}

func deleteJob(js []*simJob, j *simJob) []*simJob {
	for i, x := range js {
		if x == j {
			return append(js[:i], js[i+1:]...)
		}
	}
	return js
}

// send reports one lifecycle event on the path and reports whether it was
// accepted.
func (p *simPath) send(ctx context.Context, method string, info workloadInfo) bool {
	raw, err := json.Marshal(info)
	if err != nil {
		return false
	}
	if p.node != nil {
		if err := p.node.broker.local(method, raw); err != nil {
			p.s.stats.add(func(s *simStats) { s.lastProblem = err.Error() })
			return false
		}
		p.s.stats.add(func(s *simStats) { s.brokerEvents++ })
		return true
	}
	return p.s.post(ctx, method, workloadParams(raw))
}

// post sends one frame to node 1's ingress as a third-party producer would:
// application/json, no Origin, retrying a 5xx or a refused connection with
// backoff until ctx ends; a 4xx is a bug and is counted as refused.
func (s *simulator) post(ctx context.Context, method string, params json.RawMessage) bool {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
	backoff := ingressBackoff
	for try := 1; ; try++ {
		status, reason, err := s.postOnce(body, leased(method))
		switch {
		case err == nil && status == http.StatusOK:
			s.stats.add(func(st *simStats) { st.ingressOK++ })
			return true
		case err == nil && status >= 400 && status < 500:
			s.stats.add(func(st *simStats) {
				st.ingressRefuse++
				st.lastProblem = fmt.Sprintf("ingress refused %s: %d %s", method, status, reason)
			})
			return false
		}
		problem := fmt.Sprintf("ingress %s: %d %s", method, status, reason)
		if err != nil {
			problem = fmt.Sprintf("ingress %s: %v", method, err)
		}
		s.stats.add(func(st *simStats) { st.ingressRetry++; st.lastProblem = problem })
		if try == ingressTries {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff *= 2
	}
}

func (s *simulator) postOnce(body []byte, lease bool) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if lease {
		req.Header.Set(leaseHeader, strconv.Itoa(simLeaseSeconds))
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	reason, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return resp.StatusCode, strings.TrimSpace(string(reason)), nil
}
