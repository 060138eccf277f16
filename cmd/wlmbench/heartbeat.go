package main

// The heartbeat section (issue 11, "Benchmarks"): the daemon's per-peer
// heartbeat passes over a re-sync set of L live workloads, measured from
// outside on the real binary, side by side in one run:
//
//   - coverage: the share of the set each of K peers (batching or
//     single-frame sinks) received per --resync-interval, with the passes
//     the daemon's metrics counted;
//   - fresh frames offered on stdin meanwhile: lost, and their p99 latency
//     against the same peers with no set (L=0);
//   - lock hold: the round trip of a stdin request (-32601) and of an
//     ingress post while the passes run, against the same daemon before it
//     had peers;
//   - fan-out to batching peers against the one-POST-per-frame ceiling;
//   - RSS at large L with the passes running.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
)

// hbTargetInterval is the interval the coverage targets are stated
// at: the daemon's default --resync-interval.
const hbTargetInterval = 30 * time.Second

// Coverage targets at hbTargetInterval: every live workload reaches every
// peer once per interval up to this many workloads.
const (
	hbTargetSingle   = 10_000
	hbTargetBatching = 100_000
)

// hbMode is what kind of peers a run has.
type hbMode struct {
	name     string
	batching bool
}

var (
	modeBatching = hbMode{"batching", true}
	modeSingle   = hbMode{"single", false}
)

// parseCounts reads a comma-separated list of counts; a k suffix
// multiplies by 1000 (100k).
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		mult := 1
		if strings.HasSuffix(f, "k") {
			mult, f = 1000, strings.TrimSuffix(f, "k")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a count", f)
		}
		out = append(out, n*mult)
	}
	return out, nil
}

// fmtCount prints a workload count the way the flags take it.
func fmtCount(n int) string {
	if n >= 1_000_000 && n%100_000 == 0 {
		return strconv.FormatFloat(float64(n)/1e6, 'f', -1, 64) + "M"
	}
	if n >= 1000 && n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

// fmtDurs prints durations as a list.
func fmtDurs(ds []time.Duration) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = fmtDur(d)
	}
	return strings.Join(out, ", ")
}

func fmtPct(x float64) string { return strconv.FormatFloat(100*x, 'f', 1, 64) + "%" }

// hbSink is a peer for the heartbeat runs: a pinned mTLS server that tells
// the set's re-assertions from fresh frames by the members the harness puts
// in each workload (hbCfg, hbSet or hbFresh), and keeps per set workload
// the windows it was seen in and the gaps between its receipts.
type hbSink struct {
	ident    devpki.Identity
	port     int
	srv      *http.Server
	batching atomic.Bool
	requests atomic.Int64
	progress chan struct{} // poked after each new fresh frame

	mu       sync.Mutex // guards everything below
	cfg      int64      // the run whose frames count
	t0, end  int64      // sinceEpoch: the peers attached; the measurement ends
	interval int64      // ns
	setN     int
	seen     []bool  // per set workload: received at least once
	lastWin  []int32 // per set workload: the last window it was received in
	lastAt   []int64 // per set workload: its last receipt (t0 before any)
	winCount []int   // distinct set workloads received per window
	covered  int     // set workloads received at least once
	fullAt   int64   // when covered reached setN; 0 before
	maxGap   int64
	reassert int64 // set re-assertions received before end
	fresh    []bool
	freshN   atomic.Int64
	freshLat []time.Duration
	freshDup int64
	freshRe  int64 // re-assertions of fresh workloads (not counted as fresh)
	other    int64 // frames of another run, or not the harness's
}

func newHBSink(clientDER []byte) (*hbSink, error) {
	s := &hbSink{progress: make(chan struct{}, 1)}
	var err error
	if s.ident, s.port, s.srv, err = serveSink(clientDER, http.HandlerFunc(s.serve), nil); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *hbSink) close() { s.srv.Close() }

func (s *hbSink) serve(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	serveFrames(w, r, s.batching.Load(), s.record)
}

var resyncMarker = []byte(`"params":{"resync":true`)

func (s *hbSink) record(frame []byte, now int64) {
	cfg, ok := scanInt(frame, `"hbCfg":`)
	resync := bytes.Contains(frame, resyncMarker)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok || cfg != s.cfg {
		s.other++
		return
	}
	if i, ok := scanInt(frame, `"hbSet":`); ok && i >= 0 && i < int64(s.setN) {
		s.recordSet(int(i), now)
		return
	}
	i, ok := scanInt(frame, `"hbFresh":`)
	sent, ok2 := scanInt(frame, `"sentAtNs":`)
	switch {
	case !ok || !ok2 || i < 0 || i >= int64(len(s.fresh)):
		s.other++
	case resync:
		s.freshRe++
	case s.fresh[i]:
		s.freshDup++
	default:
		s.fresh[i] = true
		s.freshLat = append(s.freshLat, time.Duration(now-sent))
		s.freshN.Add(1)
		select {
		case s.progress <- struct{}{}:
		default:
		}
	}
}

// recordSet counts a receipt of set workload i, up to the end of the
// measurement.
func (s *hbSink) recordSet(i int, now int64) {
	if now > s.end || now < s.t0 {
		return
	}
	s.reassert++
	if w := int32((now - s.t0) / s.interval); w < int32(len(s.winCount)) && s.lastWin[i] != w {
		s.lastWin[i] = w
		s.winCount[w]++
	}
	s.maxGap = max(s.maxGap, now-s.lastAt[i])
	s.lastAt[i] = now
	if !s.seen[i] {
		s.seen[i] = true
		if s.covered++; s.covered == s.setN {
			s.fullAt = now
		}
	}
}

// reset starts run cfg: a set of setN workloads, fresh frames numbered
// below freshCap, measured from t0 over windows intervals.
func (s *hbSink) reset(cfg int64, setN, freshCap int, t0 int64, interval time.Duration, windows int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg, s.t0, s.interval, s.setN = cfg, t0, int64(interval), setN
	s.end = t0 + int64(windows)*int64(interval)
	s.seen, s.lastWin, s.lastAt = make([]bool, setN), make([]int32, setN), make([]int64, setN)
	for i := range setN {
		s.lastWin[i], s.lastAt[i] = -1, t0
	}
	s.winCount = make([]int, windows)
	s.covered, s.fullAt, s.maxGap, s.reassert = 0, 0, 0, 0
	s.fresh, s.freshLat = make([]bool, freshCap), make([]time.Duration, 0, freshCap)
	s.freshN.Store(0)
	s.freshDup, s.freshRe, s.other = 0, 0, 0
}

// sinkCoverage is what one peer received of the set in one run.
type sinkCoverage struct {
	shares   []float64 // distinct set workloads per window, of the set
	fullIn   time.Duration
	full     bool
	maxGap   time.Duration // longest time a set workload went unseen, censored at the end
	reassert int64
	freshGot int64
	freshLat []time.Duration
	freshDup int64
	other    int64
}

func (s *hbSink) coverage() sinkCoverage {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := sinkCoverage{reassert: s.reassert, freshGot: s.freshN.Load(), freshDup: s.freshDup, other: s.other,
		freshLat: slices.Clone(s.freshLat), full: s.fullAt > 0 || s.setN == 0}
	for _, n := range s.winCount {
		c.shares = append(c.shares, float64(n)/float64(max(s.setN, 1)))
	}
	if s.fullAt > 0 {
		c.fullIn = time.Duration(s.fullAt - s.t0)
	}
	gap := s.maxGap
	for _, at := range s.lastAt {
		gap = max(gap, s.end-at)
	}
	c.maxGap = time.Duration(gap)
	return c
}

// Probe kinds: what a timed request on the daemon's stdin is.
const (
	probePing  = iota // an unknown method: the read loop answers -32601 at once, taking no lock
	probeFrame        // a lifecycle frame sent as a request: committed to the table (its lock), answered null
	probeKinds
)

// pingTracker times the harness's requests on the daemon's stdin, which
// the read loop answers in order.
type pingTracker struct {
	mu       sync.Mutex
	next     int64
	sent     map[int64]sentProbe
	rtts     [probeKinds][]time.Duration
	answered atomic.Int64 // the highest id answered
}

type sentProbe struct {
	at   time.Time
	kind int
}

func newPingTracker() *pingTracker { return &pingTracker{sent: map[int64]sentProbe{}} }

// ping sends an unknown-method request and returns its id.
func (p *pingTracker) ping(d *daemon) (int64, error) {
	return p.request(d, probePing, func(buf []byte, id int64) []byte {
		buf = append(buf, `{"jsonrpc":"2.0","id":`...)
		buf = strconv.AppendInt(buf, id, 10)
		return append(buf, `,"method":"wlmbench/ping"}`+"\n"...)
	})
}

// frame sends a lifecycle request: an update of one workload (probe-cfg),
// with the request's id as its seq.
func (p *pingTracker) frame(d *daemon, cfg int64) (int64, error) {
	return p.request(d, probeFrame, func(buf []byte, id int64) []byte {
		buf = append(buf, `{"jsonrpc":"2.0","id":`...)
		buf = strconv.AppendInt(buf, id, 10)
		buf = append(buf, `,"method":"workload:started","params":{"workloadInfo":{"id":"probe-`...)
		buf = strconv.AppendInt(buf, cfg, 10)
		buf = append(buf, `","runId":"probe","seq":`...)
		buf = strconv.AppendInt(buf, id, 10)
		buf = append(buf, `,"model":"qwen3.5-9b","engine":"llamacpp","state":"running","originatedFrom":"`...)
		buf = append(buf, d.nodeID...)
		return append(buf, `","createdAt":1789661457000,"startedAt":1789661457000,"requesterId":"wlmbench"}}}`+"\n"...)
	})
}

func (p *pingTracker) request(d *daemon, kind int, build func(buf []byte, id int64) []byte) (int64, error) {
	p.mu.Lock()
	p.next++
	id := p.next
	p.mu.Unlock()
	line := build(nil, id)
	p.mu.Lock()
	p.sent[id] = sentProbe{time.Now(), kind}
	p.mu.Unlock()
	return id, d.send(line)
}

// answeredLine records the answer line of a request.
func (p *pingTracker) answeredLine(line []byte, at time.Time) {
	id, ok := scanInt(line, `"id":`)
	if !ok {
		return
	}
	p.mu.Lock()
	if s, ok := p.sent[id]; ok {
		p.rtts[s.kind] = append(p.rtts[s.kind], at.Sub(s.at))
		delete(p.sent, id)
	}
	p.mu.Unlock()
	for {
		cur := p.answered.Load()
		if id <= cur || p.answered.CompareAndSwap(cur, id) {
			return
		}
	}
}

// take returns the round trips recorded since the last take, by kind.
func (p *pingTracker) take() [probeKinds][]time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.rtts
	p.rtts = [probeKinds][]time.Duration{}
	return out
}

// sync sends a request and waits for its answer: every line written before
// it has then been handled.
func (p *pingTracker) sync(d *daemon, timeout time.Duration) error {
	id, err := p.ping(d)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for p.answered.Load() < id {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no answer to a stdin request within %s", d.name, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// paced calls fn(i, due) at rate per second until stop is closed or dur
// has passed, on a goroutine of its own; the returned func waits for it.
func paced(rate float64, dur time.Duration, fn func(i int, due time.Time)) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if rate <= 0 {
			return
		}
		interval := time.Duration(float64(time.Second) / rate)
		start := time.Now()
		for i := 0; ; i++ {
			due := start.Add(time.Duration(i) * interval)
			if due.Sub(start) >= dur {
				return
			}
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
			}
			fn(i, due)
		}
	}()
	return func() { <-done }
}

// appendHBFrame appends a workload:started frame of run cfg as the broker
// sends it: set workload i (kind "hbSet") or fresh workload i (kind
// "hbFresh", with sentAtNs), about the size of a real workload object.
func appendHBFrame(buf []byte, nodeID string, cfg int64, kind string, i int, sentAt int64) []byte {
	id := func(buf []byte) []byte {
		buf = append(buf, "hb-"...)
		buf = strconv.AppendInt(buf, cfg, 10)
		buf = append(buf, '-')
		buf = append(buf, kind[2])
		return strconv.AppendInt(buf, int64(i), 10)
	}
	buf = append(buf, `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"`...)
	buf = id(buf)
	buf = append(buf, `","runId":"`...)
	buf = id(buf)
	buf = append(buf, `","seq":1,"model":"qwen3.5-9b","engine":"llamacpp","state":"running","originatedFrom":"`...)
	buf = append(buf, nodeID...)
	buf = append(buf, `","createdAt":1789661457000,"startedAt":1789661457000,"completedAt":null,"error":null,"requesterId":"wlmbench","hbCfg":`...)
	buf = strconv.AppendInt(buf, cfg, 10)
	buf = append(buf, `,"`...)
	buf = append(buf, kind...)
	buf = append(buf, `":`...)
	buf = strconv.AppendInt(buf, int64(i), 10)
	if kind == "hbFresh" {
		buf = append(buf, `,"sentAtNs":`...)
		buf = strconv.AppendInt(buf, sentAt, 10)
	}
	return append(buf, `}}}`...)
}

// loadSet writes n set workloads of run cfg to the daemon's stdin, in
// writes of about 256 KiB, and waits until the daemon has read them all.
func loadSet(d *daemon, cfg int64, n int) (time.Duration, error) {
	start := time.Now()
	var buf []byte
	for i := range n {
		buf = append(appendHBFrame(buf, d.nodeID, cfg, "hbSet", i, 0), '\n')
		if len(buf) >= 256<<10 || i == n-1 {
			if err := d.send(buf); err != nil {
				return 0, err
			}
			buf = buf[:0]
		}
	}
	if err := d.pings.sync(d, 2*time.Minute); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// promByLabel returns every sample of a labelled metric by the value of
// its first label.
func promByLabel(text []byte, name string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(string(text), "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		rest := line[len(name)+1:]
		_, v, ok := strings.Cut(rest, `="`)
		if !ok {
			continue
		}
		label, after, ok := strings.Cut(v, `"`)
		if !ok {
			continue
		}
		i := strings.LastIndexByte(after, '}')
		if i < 0 {
			continue
		}
		if f := strings.Fields(after[i+1:]); len(f) > 0 {
			if x, err := strconv.ParseFloat(f[0], 64); err == nil {
				out[label] = x
			}
		}
	}
	return out
}

// hbPeerMetrics are one peer's heartbeat figures from the daemon's metrics.
type hbPeerMetrics struct {
	started, completed, overrun, reasserted, failures, batches, batchFrames, queueDropped, dropped float64
}

func hbMetrics(text []byte) map[string]hbPeerMetrics {
	get := func(name string) map[string]float64 { return promByLabel(text, name) }
	started := get("nvpair_wlm_heartbeat_passes_started_total")
	completed := get("nvpair_wlm_heartbeat_passes_completed_total")
	overrun := get("nvpair_wlm_heartbeat_passes_overrun_total")
	reasserted := get("nvpair_wlm_heartbeat_reasserted_total")
	failures := get("nvpair_wlm_heartbeat_reassert_failures_total")
	batches := get("nvpair_wlm_peer_batches_sent_total")
	frames := get("nvpair_wlm_peer_batch_frames_sent_total")
	qd := get("nvpair_wlm_peer_queue_dropped_total")
	dd := get("nvpair_wlm_peer_deliveries_dropped_total")
	out := map[string]hbPeerMetrics{}
	for p := range started {
		out[p] = hbPeerMetrics{started[p], completed[p], overrun[p], reasserted[p], failures[p], batches[p], frames[p], qd[p], dd[p]}
	}
	return out
}

// hbRun is one heartbeat run: a daemon holding L set workloads, K peers.
type hbRun struct {
	mode      hbMode
	k, live   int
	trialLost int64 // fresh frames lost in the further trials of a target row
	interval  time.Duration
	windows   int
	load      time.Duration
	setSize   float64 // nvpair_wlm_resync_set_entries once loaded
	peers     []sinkCoverage
	metrics   map[string]hbPeerMetrics // by peer, at the end of the windows
	metricErr error
	offered   int
	idle      probeSet // round trips with the set loaded, before the peers attached
	hb        probeSet // while the passes ran
	ingFailed int
	ingErr    string
	rssKB     int64
	hwmKB     int64
	errLines  int64
}

// worst is the lowest share of the set a peer received in a window.
func (r *hbRun) worst() float64 {
	lo := 1.0
	for _, p := range r.peers {
		for _, s := range p.shares {
			lo = min(lo, s)
		}
	}
	return lo
}

func (r *hbRun) meanShare() float64 {
	var sum float64
	var n int
	for _, p := range r.peers {
		for _, s := range p.shares {
			sum += s
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// slowestFull is the longest a peer took to first hold the whole set (its
// backfill pass), and whether every peer got there.
func (r *hbRun) slowestFull() (time.Duration, bool) {
	var slow time.Duration
	for _, p := range r.peers {
		if !p.full {
			return 0, false
		}
		slow = max(slow, p.fullIn)
	}
	return slow, true
}

// capacityAt30s is the largest set the slowest peer would get once per
// hbTargetInterval at the rate it was sent this one: the set over its first
// full pass, or when no pass finished, the re-assertions it received over
// the windows.
func (r *hbRun) capacityAt30s() float64 {
	if r.live == 0 {
		return 0
	}
	if full, ok := r.slowestFull(); ok && full > 0 {
		return float64(r.live) * hbTargetInterval.Seconds() / full.Seconds()
	}
	lo := math.Inf(1)
	for _, p := range r.peers {
		lo = min(lo, float64(p.reassert))
	}
	return lo / (float64(r.windows) * r.interval.Seconds()) * hbTargetInterval.Seconds()
}

func (r *hbRun) maxGap() time.Duration {
	var g time.Duration
	for _, p := range r.peers {
		g = max(g, p.maxGap)
	}
	return g
}

// lost is the fresh frames offered that the peers did not receive, summed
// over peers, and the most one peer lost.
func (r *hbRun) lost() (sum, worst int64) {
	for _, p := range r.peers {
		l := int64(r.offered) - p.freshGot
		sum += l
		worst = max(worst, l)
	}
	return sum, worst
}

func (r *hbRun) freshLats() latencySummary {
	var all []time.Duration
	for _, p := range r.peers {
		all = append(all, p.freshLat...)
	}
	return summarize(all)
}

func (r *hbRun) passes() (started, completed, overrun, reasserted, failures, batches, frames, drops float64) {
	for _, m := range r.metrics {
		started += m.started
		completed += m.completed
		overrun += m.overrun
		reasserted += m.reasserted
		failures += m.failures
		batches += m.batches
		frames += m.batchFrames
		drops += m.queueDropped + m.dropped
	}
	return
}

func (r *hbRun) name() string {
	return fmt.Sprintf("%s K=%d L=%s", r.mode.name, r.k, fmtCount(r.live))
}

// heartbeat is the heartbeat section.
func (b *bench) heartbeat() error {
	cfg := b.cfg
	parts := cfg.hbPartList()
	if slices.Contains(parts, "coverage") {
		if err := b.hbCoverage(); err != nil {
			return fmt.Errorf("coverage: %w", err)
		}
	}
	if slices.Contains(parts, "fanout") {
		if err := b.hbFanout(); err != nil {
			return fmt.Errorf("fan-out: %w", err)
		}
	}
	if slices.Contains(parts, "rss") {
		if err := b.hbRSS(); err != nil {
			return fmt.Errorf("rss: %w", err)
		}
	}
	return nil
}

// hbCfgSeq numbers the heartbeat runs, so a sink counts only its run's frames.
var hbCfgSeq atomic.Int64

// scaledTarget is the set that, re-asserted once per interval, costs a
// peer what target workloads cost once per hbTargetInterval.
func scaledTarget(target int, interval time.Duration) int {
	return int(math.Round(float64(target) * interval.Seconds() / hbTargetInterval.Seconds()))
}

func (b *bench) hbCoverage() error {
	cfg := b.cfg
	kMax := slices.Max(cfg.hbPeers)
	sinks := make([]*hbSink, kMax)
	for i := range sinks {
		s, err := newHBSink(b.node.DER)
		if err != nil {
			return err
		}
		defer s.close()
		sinks[i] = s
	}
	type key struct {
		mode hbMode
		k    int
	}
	baselines := map[key]*hbRun{}
	var runs []*hbRun
	var targets []*hbRun
	for _, mode := range cfg.hbModeList() {
		target := scaledTarget(hbTargetSingle, cfg.hbInterval)
		if mode.batching {
			target = scaledTarget(hbTargetBatching, cfg.hbInterval)
		}
		for _, k := range cfg.hbPeers {
			lives := append([]int{0}, cfg.hbLive...)
			if cfg.hbTargets {
				lives = append(lives, target)
			}
			for j, live := range lives {
				r, err := b.hbOne(sinks[:k], mode, k, live)
				if err != nil {
					return fmt.Errorf("%s K=%d L=%d: %w", mode.name, k, live, err)
				}
				switch {
				case j == 0:
					baselines[key{mode, k}] = r
				case cfg.hbTargets && j == len(lives)-1:
					targets = append(targets, r)
				default:
					runs = append(runs, r)
				}
			}
		}
	}
	// More trials of each target row and its baseline, interleaved, so the
	// fresh-frame comparison of the targets is between medians, not between
	// two single runs on a shared machine.
	trialP99 := map[*hbRun][]time.Duration{}
	baseP99 := map[key][]time.Duration{}
	for _, r := range targets {
		kk := key{r.mode, r.k}
		trialP99[r] = []time.Duration{r.freshLats().p99}
		baseP99[kk] = []time.Duration{baselines[kk].freshLats().p99}
		for range cfg.hbTrials - 1 {
			for _, live := range []int{0, r.live} {
				x, err := b.hbOne(sinks[:r.k], r.mode, r.k, live)
				if err != nil {
					return fmt.Errorf("%s K=%d L=%d (trial): %w", r.mode.name, r.k, live, err)
				}
				if sum, _ := x.lost(); sum > 0 {
					r.trialLost += sum
				}
				if live == 0 {
					baseP99[kk] = append(baseP99[kk], x.freshLats().p99)
				} else {
					trialP99[r] = append(trialP99[r], x.freshLats().p99)
				}
			}
		}
	}
	// Coverage.
	for _, r := range append(slices.Clone(runs), targets...) {
		isTarget := slices.Contains(targets, r)
		full, ok := r.slowestFull()
		first := "not within the run"
		if ok {
			first = fmtDur(full)
		}
		started, completed, overrun, _, failures, _, _, _ := r.passes()
		passes := "passes n/a"
		if r.metricErr == nil {
			passes = fmt.Sprintf("passes %.0f started, %.0f done, %.0f overran", started, completed, overrun)
			if failures > 0 {
				passes += fmt.Sprintf(", %.0f re-assertions failed", failures)
			}
		}
		row := row{section: "hb coverage",
			figure: fmt.Sprintf("%s: share of the set per %s window, worst / mean (peers x %d windows)",
				r.name(), fmtSecs(r.interval), r.windows),
			measured: fmtPct(r.worst()) + " / " + fmtPct(r.meanShare()),
			baseline: fmt.Sprintf("1st full pass %s; longest unseen %s; %s", first, fmtDur(r.maxGap()), passes),
			ratio:    fmt.Sprintf("cap ~%s/30s", fmtCount(roundTo(r.capacityAt30s()))),
		}
		if isTarget {
			row.figure = fmt.Sprintf("%s (= %s at 30s): share of the set per %s window, worst / mean",
				r.name(), fmtCount(map[bool]int{true: hbTargetBatching, false: hbTargetSingle}[r.mode.batching]), fmtSecs(r.interval))
			row.target = ">= 100% every window"
			row.result = check(r.worst() >= 1 && len(r.peers) > 0)
		}
		b.tbl.add(row)
	}
	// Fresh frames.
	for _, bl := range orderedBaselines(baselines, cfg) {
		l := bl.freshLats()
		sum, _ := bl.lost()
		b.tbl.add(row{section: "hb fresh", figure: fmt.Sprintf("%s (baseline): fresh frames lost / offered to each peer, p99", bl.name()),
			measured: fmt.Sprintf("%d / %d, p99 %s", sum, bl.offered*bl.k, fmtDur(l.p99)), target: "0 lost", result: check(sum == 0 && bl.offered > 0)})
	}
	for _, r := range append(slices.Clone(runs), targets...) {
		bl := baselines[key{r.mode, r.k}]
		l, lb := r.freshLats(), bl.freshLats()
		sum, _ := r.lost()
		p99, bp99 := l.p99, lb.p99
		figure := fmt.Sprintf("%s: fresh frames lost / offered to each peer, p99 (p50 / max)", r.name())
		baseline := "p99 " + fmtDur(lb.p99) + " at L=0"
		if ps, ok := trialP99[r]; ok && len(ps) > 1 {
			p99, bp99 = medianDuration(ps), medianDuration(baseP99[key{r.mode, r.k}])
			sum += r.trialLost
			figure = fmt.Sprintf("%s: fresh frames lost / offered in %d trials, median p99 (first trial: p99, p50 / max)", r.name(), len(ps))
			baseline = fmt.Sprintf("median p99 %s at L=0 (%s)", fmtDur(bp99), fmtDurs(baseP99[key{r.mode, r.k}]))
			b.tbl.add(row{section: "hb fresh", figure: figure,
				measured: fmt.Sprintf("%d / %d, p99 %s (%s; %s, %s / %s)", sum, r.offered*r.k*len(ps), fmtDur(p99), fmtDurs(ps), fmtDur(l.p99), fmtDur(l.p50), fmtDur(l.max)),
				baseline: baseline,
				ratio:    fmtRatio(float64(p99), float64(bp99)),
				target:   "0 lost, <= 1.50x", result: check(sum == 0 && bp99 > 0 && float64(p99) <= 1.5*float64(bp99))})
			continue
		}
		ok := sum == 0 && bp99 > 0 && float64(p99) <= 1.5*float64(bp99)
		b.tbl.add(row{section: "hb fresh", figure: figure,
			measured: fmt.Sprintf("%d / %d, p99 %s (%s / %s)", sum, r.offered*r.k, fmtDur(l.p99), fmtDur(l.p50), fmtDur(l.max)),
			baseline: baseline,
			ratio:    fmtRatio(float64(p99), float64(bp99)),
			target:   "0 lost, <= 1.50x", result: check(ok)})
	}
	// Lock hold, at the largest L of the grid: each probe that takes the
	// heartbeat's locks against a probe on the same path that takes none,
	// in the same window.
	top := slices.Max(cfg.hbLive)
	for _, r := range runs {
		if r.live != top {
			continue
		}
		bl := baselines[key{r.mode, r.k}]
		for _, x := range []struct{ probe, control int }{{pStdinFrame, pStdinPing}, {pIngressPost, pIngressBad}} {
			hb, ctl := r.hb.summary(x.probe), r.hb.summary(x.control)
			idle, l0 := r.idle.summary(x.probe), bl.hb.summary(x.probe)
			ex99, exMax := hb.p99-ctl.p99, hb.max-ctl.max
			b.tbl.add(row{section: "hb lock",
				figure:   fmt.Sprintf("%s: %s p99 / max, passes running (n=%d)", r.name(), probeNames[x.probe], hb.n),
				measured: fmtDur(hb.p99) + " / " + fmtDur(hb.max),
				baseline: fmt.Sprintf("%s %s / %s; idle %s / %s; L=0 %s / %s", probeNames[x.control], fmtDur(ctl.p99), fmtDur(ctl.max),
					fmtDur(idle.p99), fmtDur(idle.max), fmtDur(l0.p99), fmtDur(l0.max)),
				ratio:  fmt.Sprintf("%s / %s", fmtSigned(ex99), fmtSigned(exMax)),
				target: "excess <= 1ms",
				result: check(hb.n > 0 && ctl.n > 0 && ex99 <= time.Millisecond && exMax <= time.Millisecond && r.ingFailed == 0)})
		}
		if r.ingFailed > 0 {
			b.tbl.note("hb lock %s: %d ingress posts not answered as expected, first: %s", r.name(), r.ingFailed, r.ingErr)
		}
	}
	// Context: RSS and errors of every run.
	for _, r := range append(append(slices.Clone(runs), targets...), orderedBaselines(baselines, cfg)...) {
		if r.errLines > 0 {
			b.tbl.note("hb %s: the daemon logged %d errors", r.name(), r.errLines)
		}
		if _, _, _, _, _, _, _, drops := r.passes(); drops > 0 {
			b.tbl.note("hb %s: the daemon dropped %.0f fresh frames for its peers (queue full or delivery failed), from its metrics", r.name(), drops)
		}
		if r.metricErr != nil {
			b.tbl.note("hb %s: metrics not read: %v", r.name(), r.metricErr)
		}
	}
	var rss []string
	for _, r := range runs {
		if r.live == top {
			rss = append(rss, fmt.Sprintf("%s %s (peak %s)", r.name(), mib(r.rssKB), mib(r.hwmKB)))
		}
	}
	if len(rss) > 0 {
		b.tbl.note("hb coverage: daemon RSS at the end of the windows: %s", strings.Join(rss, "; "))
	}
	b.tbl.note("hb coverage: each run is a fresh daemon (--resync-interval %s, --max-live-workloads raised to L + the fresh frames + 1000, at least the default) "+
		"holding L running workloads fed on stdin before its K peers attach; the windows start when the discovery snapshot naming the peers is written; "+
		"the share is the distinct set workloads a peer received in a window; longest unseen: the longest any set workload went without reaching a peer, from the attach to the end of the windows; ratio: the set the slowest peer would get once per 30s at the rate it was sent (L over its first full pass, "+
		"or the re-assertions it received over the windows when no pass finished)", cfg.hbInterval)
	b.tbl.note("hb coverage target rows scale the set with the interval (the issue's targets are at 30s: %s single-frame, %s batching); the grid rows at larger L have no target",
		fmtCount(hbTargetSingle), fmtCount(hbTargetBatching))
	b.tbl.note("hb fresh: %.0f new workloads/s written on stdin over the windows (open loop; latency from each frame's due time to the sink), "+
		"the baseline is the same mode and K with no set (L=0) in this run; a target row and its baseline are each run %d times, interleaved, and compared by their median p99", cfg.hbFresh, cfg.hbTrials)
	b.tbl.note("hb lock: four probes at %.0f/s each, timed from the write to the answer: on stdin a lifecycle request (an update of one workload: committed to the state table under its lock, answered null) "+
		"and, as its control, a request the read loop answers -32601 without a lock; on the ingress a valid post (ingestMu, broker write, the table's lock) "+
		"and, as its control, a post refused 400 before any lock. ratio: the probe's excess over its control, p99 / max, in the same window; "+
		"idle: the same daemon, set loaded, before its peers attached (%s); L=0: the same mode and K with no set. "+
		"Every figure includes CPU contention with the senders and the sinks (all on %d cores), which the control shares",
		cfg.hbPing, cfg.hbIdle, runtime.NumCPU())
	return nil
}

func orderedBaselines[K comparable](m map[K]*hbRun, cfg config) []*hbRun {
	var out []*hbRun
	for _, mode := range cfg.hbModeList() {
		for _, k := range cfg.hbPeers {
			for _, r := range m {
				if r.mode == mode && r.k == k {
					out = append(out, r)
				}
			}
		}
	}
	return out
}

func roundTo(x float64) int {
	switch {
	case x >= 1e6:
		return int(math.Round(x/1e5)) * 100_000
	case x >= 10000:
		return int(math.Round(x/1000)) * 1000
	case x >= 1000:
		return int(math.Round(x/100)) * 100
	}
	return int(math.Round(x))
}

func fmtSecs(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// hbOne runs one daemon holding live set workloads with k peers of mode.
func (b *bench) hbOne(sinks []*hbSink, mode hbMode, k, live int) (*hbRun, error) {
	cfg := b.cfg
	run := &hbRun{mode: mode, k: k, live: live, interval: cfg.hbInterval, windows: cfg.hbWindows}
	dur := time.Duration(cfg.hbWindows) * cfg.hbInterval
	freshCap := int(cfg.hbFresh*dur.Seconds()) + 16
	id := hbCfgSeq.Add(1)
	var pins []devpki.Identity
	var ports []int
	for _, s := range sinks {
		s.batching.Store(mode.batching)
		pins, ports = append(pins, s.ident), append(ports, s.port)
	}
	d, err := startDaemon(b.bin, b.root, b.this.opts(daemonOpts{
		name: fmt.Sprintf("hb-%s-k%d-l%d", mode.name, k, live), ident: b.node, pins: pins,
		ingress: true, metrics: b.hasMetrics, resyncInterval: cfg.hbInterval,
		maxLive: max(100_000, live+freshCap+1000),
	}))
	if err != nil {
		return nil, err
	}
	defer b.stopDaemon(d)
	if run.load, err = loadSet(d, id, live); err != nil {
		return nil, err
	}
	if text, err := d.scrape(cfg.metricsPath); err == nil {
		run.setSize, _ = promSum(text, "nvpair_wlm_resync_set_entries")
	}
	// The same daemon with its set and no peers: the idle baseline.
	client, closeIdle := producerClient(4)
	defer closeIdle()
	probes := &prober{d: d, run: run, id: id, client: client, url: "http://" + d.ingressAddr + ingressPath}
	if run.idle, err = probes.during(cfg.hbPing, cfg.hbIdle, nil); err != nil {
		return nil, err
	}

	// Attach the peers; the windows start now.
	t0 := sinceEpoch()
	for _, s := range sinks {
		s.reset(id, live, freshCap, t0, cfg.hbInterval, cfg.hbWindows)
	}
	if err := d.send(discoveryLine(pins, ports)); err != nil {
		return nil, err
	}
	progress("heartbeat %s: set of %d loaded in %s, peers attached", run.name(), live, run.load.Round(time.Millisecond))
	var offered atomic.Int64
	var line []byte // only the pacing goroutine uses it
	fresh := func() func() {
		return paced(cfg.hbFresh, dur, func(i int, due time.Time) {
			line = append(appendHBFrame(line[:0], d.nodeID, id, "hbFresh", i, int64(due.Sub(epoch))), '\n')
			if d.send(line) == nil {
				offered.Add(1)
			}
		})
	}
	if run.hb, err = probes.during(cfg.hbPing, dur, fresh); err != nil {
		return nil, err
	}
	if text, err := d.scrape(cfg.metricsPath); err == nil {
		run.metrics = hbMetrics(text)
		if len(run.metrics) == 0 {
			run.metricErr = errors.New("no heartbeat metrics (an older daemon?)")
		}
	} else {
		run.metricErr = err
	}
	run.offered = int(offered.Load())
	// Let the fresh frames in flight arrive.
	lastGot, lastAt := int64(-1), time.Now()
	for {
		got := int64(math.MaxInt64)
		for _, s := range sinks {
			got = min(got, s.freshN.Load())
		}
		if got >= int64(run.offered) || time.Since(lastAt) > 5*time.Second {
			break
		}
		if got != lastGot {
			lastGot, lastAt = got, time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, s := range sinks {
		run.peers = append(run.peers, s.coverage())
	}
	if st, err := d.procStatus(); err == nil {
		run.rssKB, run.hwmKB = st["VmRSS"], st["VmHWM"]
	}
	run.errLines = d.errorLines.Load()
	sum, _ := run.lost()
	progress("heartbeat %s: worst window %s, mean %s, first full pass %s, fresh lost %d of %d, p99 %s; max round trips (idle): %s; RSS %s",
		run.name(), fmtPct(run.worst()), fmtPct(run.meanShare()), fmtFull(run), sum, run.offered*k, fmtDur(run.freshLats().p99),
		run.hb.maxes(run.idle), mib(run.rssKB))
	return run, nil
}

// Probes of the lock-hold figures: a probe that takes the heartbeat's
// locks and its control, which takes none, on each path.
const (
	pStdinPing   = iota // -32601 request: the read loop, no lock
	pStdinFrame         // lifecycle request: the table's lock
	pIngressBad         // a post refused 400 before any lock
	pIngressPost        // a valid post: ingestMu, broker write, the table's lock
	nProbes
)

var probeNames = [nProbes]string{"stdin -32601 request", "stdin lifecycle request", "ingress 400 post", "ingress post"}

// probeSet holds the round trips of each probe.
type probeSet [nProbes][]time.Duration

func (p *probeSet) summary(i int) latencySummary { return summarize(slices.Clone(p[i])) }

// maxes prints each probe's max, and the idle one's, for the progress log.
func (p *probeSet) maxes(idle probeSet) string {
	var parts []string
	for i := range nProbes {
		parts = append(parts, fmt.Sprintf("%s %s (%s)", probeNames[i], fmtDur(p.summary(i).max), fmtDur(idle.summary(i).max)))
	}
	return strings.Join(parts, ", ")
}

// prober sends the four probes to one daemon.
type prober struct {
	d      *daemon
	run    *hbRun
	id     int64
	client *http.Client
	url    string
	seq    int // the ingress post's seq; only its pacing goroutine uses it
}

// during runs the probes at rate each for dur, with also (when not nil)
// started alongside, and returns their round trips.
func (p *prober) during(rate float64, dur time.Duration, also func() func()) (probeSet, error) {
	var out probeSet
	var mu sync.Mutex
	p.d.pings.take()
	ingress := func(slot int, body func() []byte, want int) func(int, time.Time) {
		return func(int, time.Time) {
			t0 := time.Now()
			status, why := postStatus(p.client, p.url, body())
			lat := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if status != want {
				p.run.ingFailed++
				if p.run.ingErr == "" {
					p.run.ingErr = fmt.Sprintf("%s: status %d, want %d: %s", probeNames[slot], status, want, why)
				}
				return
			}
			out[slot] = append(out[slot], lat)
		}
	}
	waits := []func(){
		paced(rate, dur, func(int, time.Time) { _, _ = p.d.pings.ping(p.d) }),
		paced(rate, dur, func(int, time.Time) { _, _ = p.d.pings.frame(p.d, p.id) }),
		paced(rate, dur, ingress(pIngressPost, func() []byte {
			p.seq++
			return appendLifecycle(nil, "workload:started", "running", "hbprobe", int(p.id), 0, p.seq)
		}, http.StatusOK)),
		paced(rate, dur, ingress(pIngressBad, func() []byte {
			return appendLifecycle(nil, "workload:started", "", "hbprobe", int(p.id), 1, 1) // an empty state: 400
		}, http.StatusBadRequest)),
	}
	if also != nil {
		waits = append(waits, also())
	}
	for _, w := range waits {
		w()
	}
	if err := p.d.pings.sync(p.d, 30*time.Second); err != nil {
		return out, err
	}
	stdin := p.d.pings.take()
	out[pStdinPing], out[pStdinFrame] = stdin[probePing], stdin[probeFrame]
	// The sync request itself is a ping; it waited for nothing but the
	// probes before it, so it stays in.
	return out, nil
}

// postStatus posts one frame and returns the answer's status and body.
func postStatus(client *http.Client, url string, body []byte) (int, string) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(bytes.TrimSpace(b))
}

func fmtSigned(d time.Duration) string {
	if d < 0 {
		return "-" + fmtDur(-d)
	}
	return "+" + fmtDur(d)
}

func fmtFull(r *hbRun) string {
	if f, ok := r.slowestFull(); ok {
		return fmtDur(f)
	}
	return "none"
}

// hbFanout is fan-out with batching peers against the one-POST-per-frame
// ceiling, at each N of -hb-fan-n; the daemon with single-frame peers is
// shown for context.
func (b *bench) hbFanout() error {
	cfg := b.cfg
	for _, n := range cfg.hbFanN {
		if err := b.hbFanoutN(n); err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
	}
	b.tbl.note("hb fan-out: %d frames per trial fed on the daemon's stdin closed-loop, at most %d ahead of the slowest peer; "+
		"the ceiling is the fan-out section's bare pooled mTLS loop, one POST per frame per peer; the same sinks serve all three, switched between batching and single-frame", cfg.hbFanFrames, hbFanWindow)
	return nil
}

// hbFanWindow is how far the fan-out feed runs ahead of the slowest peer:
// as far as the 1024-frame queues allow, so a batching sender can fill its
// batches.
const hbFanWindow = 1000

func (b *bench) hbFanoutN(n int) error {
	cfg := b.cfg
	progressCh := make(chan struct{}, 1)
	sinks := make([]*sink, n)
	var ids []devpki.Identity
	var ports []int
	for i := range sinks {
		s, err := newSink(b.node.DER, progressCh)
		if err != nil {
			return err
		}
		defer s.close()
		sinks[i] = s
		ids, ports = append(ids, s.ident), append(ports, s.port)
	}
	ceiling, err := startCeilingFanout(b.node, sinks)
	if err != nil {
		return err
	}
	defer ceiling.close()
	d, err := startDaemon(b.bin, b.root, b.this.opts(daemonOpts{name: fmt.Sprintf("hb-fanout-%d", n), ident: b.node, pins: ids, metrics: b.hasMetrics, resyncInterval: time.Hour}))
	if err != nil {
		return err
	}
	defer b.stopDaemon(d)
	if err := d.send(discoveryLine(ids, ports)); err != nil {
		return err
	}
	if err := d.waitTargets(n, 10*time.Second); err != nil {
		return err
	}
	setMode := func(batching bool) {
		for _, s := range sinks {
			s.batching.Store(batching)
		}
	}
	run := int64(1 << 40) // apart from the fan-out section's runs
	// warm delivers a few frames so the senders learn the sinks' mode.
	warm := func(batching bool) {
		setMode(batching)
		run++
		feedDaemon(d, sinks, progressCh, run, 20, 20)
	}
	var batchR, singleR, ceilR []fanResult
	for i := range cfg.trials {
		steps := []func(){
			func() {
				setMode(false)
				run++
				r := ceiling.run(sinks, run, cfg.hbFanFrames)
				progress("hb fan-out N=%d trial %d/%d: ceiling %s", n, i+1, cfg.trials, r)
				ceilR = append(ceilR, r)
			},
			func() {
				warm(true)
				run++
				r := feedDaemon(d, sinks, progressCh, run, cfg.hbFanFrames, hbFanWindow)
				progress("hb fan-out N=%d trial %d/%d: daemon, batching peers %s", n, i+1, cfg.trials, r)
				batchR = append(batchR, r)
			},
			func() {
				warm(false)
				run++
				r := feedDaemon(d, sinks, progressCh, run, cfg.hbFanFrames, hbFanWindow)
				progress("hb fan-out N=%d trial %d/%d: daemon, single-frame peers %s", n, i+1, cfg.trials, r)
				singleR = append(singleR, r)
			},
		}
		for j := range steps {
			steps[(i+j)%len(steps)]()
		}
	}
	rates := func(rs []fanResult) (float64, bool) {
		var xs []float64
		ok := len(rs) > 0
		for _, r := range rs {
			xs = append(xs, r.rate())
			ok = ok && r.complete
		}
		return median(xs), ok
	}
	br, bok := rates(batchR)
	sr, sok := rates(singleR)
	cr, cok := rates(ceilR)
	r := row{section: "hb fan-out",
		figure:   fmt.Sprintf("N=%d: frames/s delivered to all peers, batching peers, median of %d", n, cfg.trials),
		measured: fmtRate(br), baseline: fmtRate(cr) + " ceiling, 1 POST/frame", ratio: fmtRatio(br, cr)}
	if n == 8 {
		r.target, r.result = ">= 3.00x", check(cr > 0 && br/cr >= 3 && bok && cok)
	}
	b.tbl.add(r)
	b.tbl.add(row{section: "hb fan-out", figure: fmt.Sprintf("  N=%d: the daemon with single-frame peers (context)", n),
		measured: fmtRate(sr), baseline: fmtRate(cr) + " ceiling", ratio: fmtRatio(sr, cr)})
	for who, ok := range map[string]bool{"batching": bok, "single-frame": sok, "ceiling": cok} {
		if !ok {
			b.tbl.note("hb fan-out N=%d: a %s trial was incomplete", n, who)
		}
	}
	if text, err := d.scrape(cfg.metricsPath); err == nil {
		bs, _ := promSum(text, "nvpair_wlm_peer_batches_sent_total")
		fs, _ := promSum(text, "nvpair_wlm_peer_batch_frames_sent_total")
		if bs > 0 {
			b.tbl.add(row{section: "hb fan-out", figure: fmt.Sprintf("  N=%d: frames per batch sent (mean, all trials)", n),
				measured: strconv.FormatFloat(fs/bs, 'f', 1, 64)})
		}
		if o, p, how := b.drops(d); o+p > 0 {
			b.tbl.note("hb fan-out N=%d: the daemon dropped frames (%s): enqueue point %d, peer queues %d", n, how, o, p)
		}
	}
	return nil
}

// hbRSS is the daemon's RSS holding L workloads with its heartbeat passes
// running to batching peers, for each L of -hb-rss.
func (b *bench) hbRSS() error {
	cfg := b.cfg
	k := min(4, slices.Max(cfg.hbPeers))
	sinks := make([]*hbSink, k)
	var pins []devpki.Identity
	var ports []int
	for i := range sinks {
		s, err := newHBSink(b.node.DER)
		if err != nil {
			return err
		}
		defer s.close()
		s.batching.Store(true)
		sinks[i] = s
		pins, ports = append(pins, s.ident), append(ports, s.port)
	}
	for _, live := range cfg.hbRSS {
		id := hbCfgSeq.Add(1)
		d, err := startDaemon(b.bin, b.root, b.this.opts(daemonOpts{name: fmt.Sprintf("hb-rss-%d", live), ident: b.node, pins: pins,
			metrics: b.hasMetrics, resyncInterval: cfg.hbInterval, maxLive: max(100_000, live)}))
		if err != nil {
			return err
		}
		st0, _ := d.procStatus()
		load, err := loadSet(d, id, live)
		if err != nil {
			b.stopDaemon(d)
			return err
		}
		st1, _ := d.procStatus()
		t0 := sinceEpoch()
		for _, s := range sinks {
			s.reset(id, live, 0, t0, cfg.hbInterval, cfg.hbRSSFor)
		}
		if err := d.send(discoveryLine(pins, ports)); err != nil {
			b.stopDaemon(d)
			return err
		}
		var st2 map[string]int64
		for i := range cfg.hbRSSFor {
			time.Sleep(cfg.hbInterval)
			if st2, err = d.procStatus(); err != nil {
				b.stopDaemon(d)
				return err
			}
			progress("hb rss L=%d: RSS %s after %d intervals of passes (peak %s)", live, mib(st2["VmRSS"]), i+1, mib(st2["VmHWM"]))
		}
		var setSize float64
		if text, err := d.scrape(cfg.metricsPath); err == nil {
			setSize, _ = promSum(text, "nvpair_wlm_resync_set_entries")
		}
		var cov []string
		for _, s := range sinks {
			c := s.coverage()
			cov = append(cov, fmtPct(slices.Min(c.shares)))
		}
		b.stopDaemon(d)
		limitKB := int64(64<<10) + int64(live)
		progress("hb rss L=%d: loaded in %s; RSS %s at start, %s loaded, %s after %d intervals with %d batching peers (peak %s); worst window per peer %v",
			live, load.Round(time.Millisecond), mib(st0["VmRSS"]), mib(st1["VmRSS"]), mib(st2["VmRSS"]), cfg.hbRSSFor, k, mib(st2["VmHWM"]), cov)
		b.tbl.add(row{section: "hb memory",
			figure:   fmt.Sprintf("RSS, L=%s live workloads (set %.0f), %d intervals of passes to %d batching peers", fmtCount(live), setSize, cfg.hbRSSFor, k),
			measured: mib(st2["VmRSS"]),
			baseline: fmt.Sprintf("peak %s; %s loaded, before passes", mib(st2["VmHWM"]), mib(st1["VmRSS"])),
			ratio:    fmt.Sprintf("%.0f B/wl", float64(st2["VmRSS"]-st0["VmRSS"])*1024/float64(max(live, 1))),
			target:   "<= " + mib(limitKB), result: check(st2["VmRSS"] > 0 && st2["VmRSS"] <= limitKB)})
	}
	b.tbl.note("hb memory: target 64 MiB + 1 KiB per live workload; ratio: RSS growth from the daemon's start per workload; the set's frames are about %d bytes each",
		len(appendHBFrame(nil, b.node.Principal, 1, "hbSet", 12345, 0)))
	return nil
}
