package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"nvpair-workload-manager/internal/cliflags"
	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/procstat"
)

// `devcluster scale` is issue 37's scale benchmark, held in the repo: for
// each member count N it runs a dev cluster of N real daemons on this
// machine, each node's broker holding a job of its own, and feeds node 1's
// broker a stream of changes to its job while every node heartbeats. It
// measures what grows with the members: the mesh's formation, one change's
// propagation to every member, node 1's CPU and journal records per change,
// and the heartbeat's CPU and bytes per interval. Its figures are in
// cmd/wlmbench/RESULTS.md ("Scale").

// scaleConfig is the parsed command line of `devcluster scale`.
type scaleConfig struct {
	members     []int
	rate        float64
	changesFor  time.Duration
	quietFor    time.Duration
	resync      time.Duration
	meshTimeout time.Duration
	settle      time.Duration
	bin         string
	daemonArgs  []string
	keep        bool
}

const scaleUsage = `usage: devcluster scale [flags]

For each member count N: starts N daemons with real mTLS and PAIR's file
layouts, each node's broker holding a job of its own, gives every node the
whole directory in one discovery snapshot, and times the mesh (every node's
job at every other node's broker). Then node 1's broker changes its job
--rate times a second for --changes-for while every node heartbeats:
propagation of each change until the last member's broker read it (p50, p99,
max), node 1's CPU per change (utime+stime of /proc) and per member, its
journal records per change (the daemons' metrics). Then a quiet window of
--quiet-for: every daemon's CPU and bytes written (/proc/<pid>/io wchar:
sockets and files) per heartbeat interval. One markdown row per N.

`

// scaleSettle bounds the wait, after the last change, for every member to
// hear it; stopping a point's daemons is bounded by pairbroker.StopGrace.
const scaleSettle = 10 * time.Second

func parseScaleFlags(args []string, stderr io.Writer) (scaleConfig, error) {
	c := scaleConfig{members: []int{2, 8, 16, 32, 64, 128}, settle: scaleSettle}
	fs := flag.NewFlagSet("devcluster scale", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	members := fs.String("members", "2,8,16,32,64,128", fmt.Sprintf("member counts N, a comma-separated list, each 2 to %d", maxNodes))
	fs.Float64Var(&c.rate, "rate", 20, "changes per second fed to node 1's broker")
	fs.DurationVar(&c.changesFor, "changes-for", 30*time.Second, "how long the changes are fed (at least one heartbeat interval, so every node heartbeats meanwhile)")
	fs.DurationVar(&c.quietFor, "quiet-for", 0, "the quiet window after the changes, for the heartbeat's figures (default: one --resync-interval)")
	fs.DurationVar(&c.resync, "resync-interval", 30*time.Second, "the daemons' --resync-interval (heartbeat)")
	fs.DurationVar(&c.meshTimeout, "mesh-timeout", 120*time.Second, "give up on a point whose mesh has not formed this long after the snapshot")
	fs.StringVar(&c.bin, "bin", "", "the daemon's binary (default: go build the module root)")
	daemonArgs := fs.String("daemon-args", "", "extra daemon flags, split at spaces (e.g. \"--peer-max-conns-per-source 256\")")
	fs.BoolVar(&c.keep, "keep", false, "keep each point's working directory (daemon logs, journals)")
	explain := cliflags.Explain(fs, map[string]string{"members": "N,N", "rate": "R", "changes-for": "D", "quiet-for": "D", "resync-interval": "D", "mesh-timeout": "D", "bin": "PATH", "daemon-args": "FLAGS"})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, scaleUsage)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
		}
		return c, explain(err)
	}
	if c.quietFor == 0 {
		c.quietFor = c.resync
	}
	c.daemonArgs = strings.Fields(*daemonArgs)
	var err error
	switch c.members, err = parseMembers(*members); {
	case err != nil:
		return c, fmt.Errorf("--members %s: %v", *members, err)
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case !(c.rate > 0 && c.rate <= 1000):
		return c, fmt.Errorf("--rate %g: must be above 0 and at most 1000", c.rate)
	case c.changesFor < time.Second:
		return c, fmt.Errorf("--changes-for %s: must be at least 1s", c.changesFor)
	case c.quietFor < 0:
		return c, fmt.Errorf("--quiet-for %s: must not be negative", c.quietFor)
	case c.resync < 100*time.Millisecond:
		return c, fmt.Errorf("--resync-interval %s: must be at least 100ms", c.resync)
	case c.meshTimeout < time.Second:
		return c, fmt.Errorf("--mesh-timeout %s: must be at least 1s", c.meshTimeout)
	}
	return c, nil
}

// parseMembers reads a comma-separated list of member counts, each 2 to
// maxNodes.
func parseMembers(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number", f)
		}
		if n < 2 || n > maxNodes {
			return nil, fmt.Errorf("%d: each count must be between 2 and %d", n, maxNodes)
		}
		out = append(out, n)
	}
	return out, nil
}

// fdsNeeded is how many file descriptors one process of an N-member run
// needs: the dev cluster holds each daemon's stdin and stdout and a scrape
// connection to its metrics (3N), a daemon a connection to and from every
// other member (2N); 256 covers listeners, logs, journals and the runtime.
func fdsNeeded(n int) uint64 { return 4*uint64(n) + 256 }

// checkFDs refuses a point whose processes would run out of file
// descriptors: the run would fail midway, its figures skewed by refused
// connections rather than measured. known is false where the limit is not
// knowable (no RLIMIT_NOFILE): the run goes ahead.
func checkFDs(n int, limit uint64, known bool) error {
	if !known || limit >= fdsNeeded(n) {
		return nil
	}
	return fmt.Errorf("--members %d needs %d file descriptors per process, the limit is %d (raise it: ulimit -n %d)", n, fdsNeeded(n), limit, fdsNeeded(n))
}

// runScale is `devcluster scale`: 0 when every point ran, 1 when one
// failed, 2 for a bad flag.
func runScale(args []string, stdout, stderr io.Writer, sigs <-chan os.Signal) int {
	cfg, err := parseScaleFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "devcluster scale: %v\n", err)
		return 2
	}
	limit, known := openFileLimit()
	if err := checkFDs(slices.Max(cfg.members), limit, known); err != nil {
		fmt.Fprintf(stderr, "devcluster scale: %v\n", err)
		return 1
	}
	base, err := os.MkdirTemp("", "devcluster-scale-")
	if err != nil {
		fmt.Fprintf(stderr, "devcluster scale: %v\n", err)
		return 1
	}
	if !cfg.keep {
		defer os.RemoveAll(base)
	}
	bin := cfg.bin
	if bin == "" {
		root, err := moduleRoot()
		if err == nil {
			fmt.Fprintf(stdout, "devcluster scale: building the daemon from %s\n", root)
			bin, err = buildDaemon(root, filepath.Join(base, "bin"))
		}
		if err != nil {
			fmt.Fprintf(stderr, "devcluster scale: %v (or pass --bin PATH)\n", err)
			return 1
		}
	} else if bin, err = filepath.Abs(bin); err != nil {
		fmt.Fprintf(stderr, "devcluster scale: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(stderr, "devcluster scale: %v: stopping\n", s)
			cancel()
		case <-ctx.Done():
		}
	}()
	fmt.Fprintf(stdout, "devcluster scale: heartbeat %s, %g changes/s for %s, quiet window %s, daemon flags %q\n",
		cfg.resync, cfg.rate, cfg.changesFor, cfg.quietFor, strings.Join(cfg.daemonArgs, " "))
	fmt.Fprintln(stdout, scaleHeader)
	status := 0
	for _, n := range cfg.members {
		if ctx.Err() != nil {
			return 1
		}
		p := runScalePoint(ctx, cfg, bin, filepath.Join(base, fmt.Sprintf("n%d", n)), n, stderr)
		fmt.Fprintln(stdout, p.row(cfg))
		if p.err != "" {
			fmt.Fprintf(stdout, "  N=%d: %s\n", n, p.err)
			status = 1
		}
	}
	if cfg.keep {
		fmt.Fprintf(stdout, "devcluster scale: kept %s\n", base)
	}
	return status
}

// scalePoint is what one member count measured.
type scalePoint struct {
	n   int
	err string // why the point stopped short; its later figures are zero

	up     time.Duration // from the first launch to every daemon subscribed
	mesh   time.Duration // from the one snapshot to every job at every other broker
	meshed bool
	pairs  int // (receiver, origin) pairs heard when the mesh wait ended, of n(n-1)

	failures float64 // delivery failures, every node, until the mesh formed
	refused  float64 // connections refused, every node, until the mesh formed

	changes    int
	lat        []time.Duration // per change: until the last member's broker read it
	missing    int             // changes some member had not heard at the settle's end
	cpuOrigin  time.Duration   // node 1 over the changes
	recOrigin  float64         // node 1's journal records over the changes
	recAll     float64         // every node's journal records over the changes
	quiet      time.Duration   // the quiet window as it ran
	hbCPU      time.Duration   // every daemon over the quiet window
	hbBytes    uint64          // every daemon's wchar over the quiet window
	reasserted float64         // re-assertions delivered, every node, over the quiet window
}

const scaleHeader = "| N | up | mesh | pairs | fails/refused | changes | p50 | p99 | max | origin CPU/change | per member | journal rec/change origin (all) | hb CPU/interval all (per node) | hb bytes/interval all (per node) | re-asserted/interval |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

// row is the point's markdown row.
func (p scalePoint) row(cfg scaleConfig) string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	sec := func(d time.Duration) string {
		if d < time.Second {
			return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
		}
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	mesh := sec(p.mesh)
	if !p.meshed {
		mesh = "not formed"
	}
	cells := []string{strconv.Itoa(p.n), sec(p.up), mesh, fmt.Sprintf("%d/%d", p.pairs, p.n*(p.n-1)), fmt.Sprintf("%.0f/%.0f", p.failures, p.refused)}
	if p.changes == 0 {
		cells = append(cells, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-")
		return "| " + strings.Join(cells, " | ") + " |"
	}
	sorted := slices.Clone(p.lat)
	slices.Sort(sorted)
	changes := strconv.Itoa(p.changes)
	if p.missing > 0 {
		changes += fmt.Sprintf(" (%d unheard)", p.missing)
	}
	cpu, _ := perChange(float64(p.cpuOrigin), p.changes)
	perMember, _ := perChange(cpu, p.n-1)
	recO, _ := perChange(p.recOrigin, p.changes)
	recA, _ := perChange(p.recAll, p.changes)
	scale := perInterval(p.quiet, cfg.resync)
	cells = append(cells, changes, ms(percentile(sorted, 50)), ms(percentile(sorted, 99)), ms(percentile(sorted, 100)),
		fmt.Sprintf("%.2f ms", cpu/float64(time.Millisecond)), fmt.Sprintf("%.0f µs", perMember/float64(time.Microsecond)),
		fmt.Sprintf("%.2f (%.1f)", recO, recA),
		fmt.Sprintf("%.0f ms (%.1f)", float64(p.hbCPU)*scale/float64(time.Millisecond), float64(p.hbCPU)*scale/float64(time.Millisecond)/float64(p.n)),
		fmt.Sprintf("%.0f KiB (%.1f)", float64(p.hbBytes)*scale/1024, float64(p.hbBytes)*scale/1024/float64(p.n)),
		fmt.Sprintf("%.0f", p.reasserted*scale))
	return "| " + strings.Join(cells, " | ") + " |"
}

// percentile is the nearest-rank p-th percentile of sorted (ascending): the
// least value at or above which p per cent of the values lie; 0 for none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// perChange divides a total over the changes that caused it; false when
// there were none (no figure, rather than an infinity in the table).
func perChange(total float64, changes int) (float64, bool) {
	if changes <= 0 {
		return 0, false
	}
	return total / float64(changes), true
}

// perInterval is the factor that turns a figure over window into one per
// heartbeat interval.
func perInterval(window, interval time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return float64(interval) / float64(window)
}

// receipts is what one node's broker heard: when each other origin's job
// first arrived (the mesh), and when it first heard each change of node 1's
// job. A daemon may send a later state in place of the ones it had not
// sent yet (its table holds one version per job), so hearing seq s is
// hearing every change up to s.
type receipts struct {
	mu      sync.Mutex
	origins map[string]time.Time
	top     int         // the highest change heard
	at      []time.Time // at[s]: the first read of seq s or later
}

func (r *receipts) hear(info json.RawMessage, at time.Time, changeOrigin, changeID string) {
	var w struct {
		ID             string `json:"id"`
		OriginatedFrom string `json:"originatedFrom"`
		Seq            int    `json:"seq"`
	}
	if json.Unmarshal(info, &w) != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.origins[w.OriginatedFrom]; !ok {
		r.origins[w.OriginatedFrom] = at
	}
	if w.OriginatedFrom != changeOrigin || w.ID != changeID || w.Seq <= r.top {
		return
	}
	for len(r.at) <= w.Seq {
		r.at = append(r.at, time.Time{})
	}
	for s := r.top + 1; s <= w.Seq; s++ {
		r.at[s] = at
	}
	r.top = w.Seq
}

// meshState is how many (receiver, origin) pairs have been heard, and when
// the last of them was.
func meshState(rs []*receipts) (pairs int, last time.Time) {
	for _, r := range rs {
		r.mu.Lock()
		for _, t := range r.origins {
			pairs++
			if t.After(last) {
				last = t
			}
		}
		r.mu.Unlock()
	}
	return pairs, last
}

// allHeard reports whether every receiver heard change seq.
func allHeard(rs []*receipts, seq int) bool {
	for _, r := range rs {
		r.mu.Lock()
		top := r.top
		r.mu.Unlock()
		if top < seq {
			return false
		}
	}
	return true
}

// propagation is, for each change from first to last, the time from its
// send until the last receiver read it; missing counts the changes some
// receiver never heard.
func propagation(sent []time.Time, first, last int, rs []*receipts) (lat []time.Duration, missing int) {
	for s := first; s <= last; s++ {
		var worst time.Time
		heard := true
		for _, r := range rs {
			r.mu.Lock()
			if s < len(r.at) && !r.at[s].IsZero() {
				if r.at[s].After(worst) {
					worst = r.at[s]
				}
			} else {
				heard = false
			}
			r.mu.Unlock()
		}
		if !heard {
			missing++
			continue
		}
		lat = append(lat, worst.Sub(sent[s]))
	}
	return lat, missing
}

// scaleJobID is node i's own job.
func scaleJobID(n *node) string { return "scale-" + n.short }

// scaleJob is node n's job at seq.
func scaleJob(n *node, seq int, created int64) json.RawMessage {
	raw, _ := json.Marshal(workloadInfo{ID: scaleJobID(n), Model: simModels[0], Engine: simEngines[1], State: "running",
		OriginatedFrom: n.id, ScheduledOn: n.id, Seq: seq, CreatedAt: created, StartedAt: &created, RequesterID: "devcluster-scale"})
	return raw
}

// runScalePoint runs one member count in dir and measures it. Its daemons
// are stopped on every path, and any left are killed with their process
// group.
func runScalePoint(ctx context.Context, cfg scaleConfig, bin, dir string, n int, stderr io.Writer) (p scalePoint) {
	p.n = n
	fail := func(format string, args ...any) scalePoint {
		p.err = fmt.Sprintf(format, args...)
		return p
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail("%v", err)
	}
	members, err := devpki.WriteCluster(dir, n)
	if err != nil {
		return fail("mint the cluster: %v", err)
	}
	logf := func(format string, args ...any) {
		if line := fmt.Sprintf(format, args...); !strings.Contains(line, "broker replayed") { // every first start replays its job: not news
			fmt.Fprintf(stderr, "devcluster scale: N=%d: %s\n", n, line)
		}
	}
	// Each daemon's wait for its subscription: the dev cluster's 20 s, and
	// 250 ms more per member, since N start at once on a few cores.
	c := newCluster(clusterConfig{bin: bin, metrics: true, resyncInterval: cfg.resync, staleAfter: 0, logLevel: "info",
		logf: logf, holdDiscovery: true, readyTimeout: 20*time.Second + time.Duration(n)*250*time.Millisecond}, members, dir)
	defer killGroups(c) // after stop: whatever did not exit
	defer c.stop()
	origin := c.nodes[0]
	rs := make([]*receipts, 0, n-1) // the other members': the changes' receivers
	all := make([]*receipts, 0, n)  // every node's: the mesh
	created := time.Now().UnixMilli()
	for _, nd := range c.nodes {
		nd.extraArgs = cfg.daemonArgs
		r := &receipts{origins: map[string]time.Time{}}
		nd.broker.heard = func(info json.RawMessage, at time.Time) { r.hear(info, at, origin.id, scaleJobID(origin)) }
		all = append(all, r)
		if nd != origin {
			rs = append(rs, r)
		}
		// Stored now, replayed to the daemon as it starts (broker.attach).
		if err := nd.broker.local("workload:started", scaleJob(nd, 1, created)); err != nil {
			return fail("%v", err)
		}
	}

	start := time.Now()
	if err := c.startAll(); err != nil {
		return fail("start: %v", err)
	}
	p.up = time.Since(start)
	released := time.Now()
	c.releaseDiscovery()
	client := &http.Client{Timeout: scrapeTimeout}
	defer client.CloseIdleConnections()

	want := n * (n - 1)
	deadline := released.Add(cfg.meshTimeout)
	for {
		pairs, last := meshState(all)
		p.pairs = pairs
		if pairs == want {
			p.mesh, p.meshed = last.Sub(released), true
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	meshFams := scrapeAll(client, c.nodes, "nvpair_wlm_peer_delivery_failures_total", "nvpair_wlm_connections_refused_total")
	p.failures, p.refused = meshFams.sum("nvpair_wlm_peer_delivery_failures_total"), meshFams.sum("nvpair_wlm_connections_refused_total")
	if !p.meshed {
		return fail("the mesh did not form within %s of the snapshot: %d of %d (receiver, origin) pairs", cfg.meshTimeout, p.pairs, want)
	}

	// The changes, at --rate, each node heartbeating meanwhile.
	before := scrapeAll(client, c.nodes, "nvpair_wlm_journal_records_total")
	cpu0, err := procstat.CPU(origin.current().pid)
	if err != nil {
		return fail("node 1's CPU: %v", err)
	}
	total := int(cfg.rate * cfg.changesFor.Seconds())
	sent := make([]time.Time, total+2)
	first, last := 2, 1
	t0 := time.Now()
	for k := range total {
		if !sleepUntil(ctx, t0.Add(time.Duration(float64(k)*float64(time.Second)/cfg.rate))) {
			return fail("interrupted")
		}
		seq := first + k
		sent[seq] = time.Now()
		if err := origin.broker.local("workload:started", scaleJob(origin, seq, created)); err != nil {
			return fail("change %d: %v", seq, err)
		}
		last = seq
	}
	settleEnd := time.Now().Add(cfg.settle)
	for !allHeard(rs, last) && time.Now().Before(settleEnd) && ctx.Err() == nil {
		sleepCtx(ctx, 10*time.Millisecond)
	}
	cpu1, err := procstat.CPU(origin.current().pid)
	if err != nil {
		return fail("node 1's CPU: %v", err)
	}
	after := scrapeAll(client, c.nodes, "nvpair_wlm_journal_records_total")
	p.changes = last - first + 1
	p.lat, p.missing = propagation(sent, first, last, rs)
	p.cpuOrigin = cpu1 - cpu0
	p.recOrigin = after.of(0, "nvpair_wlm_journal_records_total") - before.of(0, "nvpair_wlm_journal_records_total")
	p.recAll = after.sum("nvpair_wlm_journal_records_total") - before.sum("nvpair_wlm_journal_records_total")
	if after.failed > 0 || before.failed > 0 {
		return fail("%d metrics scrapes failed", after.failed+before.failed)
	}

	// The quiet window: the heartbeat alone.
	if cfg.quietFor > 0 {
		q0, err := clusterUsage(c)
		if err != nil {
			return fail("%v", err)
		}
		r0 := scrapeAll(client, c.nodes, "nvpair_wlm_heartbeat_reasserted_total")
		qStart := time.Now()
		if !sleepUntil(ctx, qStart.Add(cfg.quietFor)) {
			return fail("interrupted")
		}
		q1, err := clusterUsage(c)
		if err != nil {
			return fail("%v", err)
		}
		r1 := scrapeAll(client, c.nodes, "nvpair_wlm_heartbeat_reasserted_total")
		p.quiet = time.Since(qStart)
		p.hbCPU, p.hbBytes = q1.cpu-q0.cpu, q1.written-q0.written
		p.reasserted = r1.sum("nvpair_wlm_heartbeat_reasserted_total") - r0.sum("nvpair_wlm_heartbeat_reasserted_total")
	}
	if problems := c.stop(); len(problems) > 0 {
		return fail("stop: %s", strings.Join(problems[:min(len(problems), 3)], "; "))
	}
	return p
}

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// sleepUntil sleeps until at; false when ctx ended first.
func sleepUntil(ctx context.Context, at time.Time) bool {
	if d := time.Until(at); d > 0 {
		sleepCtx(ctx, d)
	}
	return ctx.Err() == nil
}

// scrape is the sums of some metric families, per node.
type scrape struct {
	nodes  []map[string]float64
	failed int
}

func (s scrape) of(i int, family string) float64 { return s.nodes[i][family] }

func (s scrape) sum(family string) float64 {
	var t float64
	for _, m := range s.nodes {
		t += m[family]
	}
	return t
}

// scrapeAll scrapes every node's metrics at once, each family summed over
// its labels; a node whose scrape fails counts in failed.
func scrapeAll(client *http.Client, nodes []*node, families ...string) scrape {
	out := scrape{nodes: make([]map[string]float64, len(nodes))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16) // a bounded fan of scrapes, not 128 at once
	for i, n := range nodes {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			m, err := scrapeFamilies(client, n.metricsAddr(), families)
			if err != nil {
				mu.Lock()
				out.failed++
				mu.Unlock()
			}
			out.nodes[i] = m
		})
	}
	wg.Wait()
	return out
}

// scrapeFamilies GETs http://addr/metrics and sums each of families over
// its samples.
func scrapeFamilies(client *http.Client, addr string, families []string) (map[string]float64, error) {
	out := map[string]float64{}
	if addr == "" {
		return out, errors.New("no metrics endpoint")
	}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxScrapeBytes))
	if err != nil {
		return out, err
	}
	return sumFamilies(body, families)
}

// sumFamilies sums each of families over its samples in a Prometheus text
// exposition.
func sumFamilies(body []byte, families []string) (map[string]float64, error) {
	out := map[string]float64{}
	for l := range bytes.Lines(body) {
		line := strings.TrimSpace(string(l))
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, value, err := parseSample(line)
		if err != nil {
			return out, fmt.Errorf("%v: %q", err, clip(line, 120))
		}
		if slices.Contains(families, name) {
			out[name] += value
		}
	}
	return out, nil
}

// cpuWrites is CPU time and bytes written, summed over processes.
type cpuWrites struct {
	cpu     time.Duration
	written uint64
}

// clusterUsage sums every running daemon's CPU and bytes written.
func clusterUsage(c *cluster) (cpuWrites, error) {
	var u cpuWrites
	for _, n := range c.nodes {
		p := n.current()
		cpu, err := procstat.CPU(p.pid)
		if err != nil {
			return u, fmt.Errorf("%s's CPU: %w", n.name, err)
		}
		w, err := procWritten(p.pid)
		if err != nil {
			return u, fmt.Errorf("%s's bytes written: %w", n.name, err)
		}
		u.cpu += cpu
		u.written += w
	}
	return u, nil
}

// procWritten is the bytes pid has passed to write calls (wchar of
// /proc/<pid>/io): its sockets', its journal's and its log's.
func procWritten(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "wchar:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errors.New("/proc io: no wchar line")
}
