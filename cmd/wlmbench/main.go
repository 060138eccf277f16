// Command wlmbench measures the nvpair-workload-manager daemon against the
// best this machine can do, side by side in the same run, and prints one
// table (issue 6):
//
//   - ingress (issue 14, sweep.go): for each C of the concurrency sweep, C
//     keep-alive producers post valid lifecycle frames for T seconds to the
//     daemon's loopback ingress and to a ceiling server (a bare net/http
//     handler that decodes the body into a map); then the p99 latency in an
//     open loop at half the daemon's rate, against the ceiling's at the
//     same offered rate;
//   - inbound (issue 14, inbound.go): P pinned peers, each one keep-alive
//     mTLS stream, post frames to the daemon's peer port and to a bare mTLS
//     server that checks the pins and writes each body as a line to its
//     stdout, as the daemon writes to its broker;
//   - fan-out: frames fed on the daemon's stdin (the broker path), delivered
//     to K pinned-mTLS sinks, against a bare pooled TLS POST loop to the same
//     sinks; TLS handshakes per peer;
//   - isolation: the same with one of the K peers black-holed;
//   - renewals (issue 30, renewals.go): N leased ingress jobs held, a few
//     of them renewed in a closed loop (the same frame again with its
//     Workload-Lease header): daemon CPU per renewal and renewals/s at each
//     N, and the CPU's growth from the least N to the most;
//   - memory: a long ingress run over many workloads, each driven to a
//     terminal state and most removed: peak RSS and goroutines; then the
//     RSS per live workload beyond its frame's bytes at -mem-rss-live live
//     ingress jobs (memory.go);
//   - heartbeat (issue 11): per-peer heartbeat passes over L live workloads
//     to K batching or single-frame sinks: coverage per interval, fresh
//     frames lost and their p99 against L=0, the stdin and ingress round
//     trips while passes run, fan-out to batching peers against the
//     one-POST-per-frame ceiling, RSS at large L (heartbeat.go).
//
// The ingress section runs two modes (-ingress-modes): producers cycling
// over a few jobs of their own, and a new job with every frame.
//
// -baseline BIN runs a previous build beside this one in every section
// that supports it (ingress, inbound, fan-out, renewals, memory), its trials
// interleaved with this build's and the ceiling's (baseline.go), and adds
// two columns: the baseline build's figure and this build over it. -stock
// (or -stock-bin BIN) does the same with the stock upstream daemon on the
// ingress and inbound paths, against issue 30's targets. A build that does
// not take a flag a section needs is skipped for that section, in one line.
// See README.md beside this file.
//
// It builds the daemon from the module root (or runs --bin) and drives the
// real binary: the harness is its broker (stdin/stdout pipes, drained), its
// cluster directory is minted with internal/dev/devpki. Run it from the module
// root:
//
//	go run ./cmd/wlmbench
//	go run ./cmd/wlmbench -t 2s -trials 1 -mem-frames 100000   # quick
//	go run ./cmd/wlmbench -only ingress,inbound -t 2s -trials 1   # quick issue 14 figures
//	go run ./cmd/wlmbench -baseline /tmp/wlm-0e0ee04 -only ingress,inbound,renewals,memory -sweep 32,128 -inbound-peers 4 -mem-frames 0 -t 2s -trials 4
//	go run ./cmd/wlmbench -only heartbeat -hb-live 1k,10k -hb-peers 4 -hb-fan-n 8 -hb-rss 100k -hb-fresh-trials 1 -trials 1   # quick heartbeat
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
)

// config holds the flags.
type config struct {
	bin         string
	c           int
	t           time.Duration
	trials      int
	k           int
	fanFrames   int
	window      int
	memFrames   int
	memLive     int
	metricsPath string
	only        string
	keep        bool

	// Issue 14: the ingress concurrency sweep and the inbound section.
	sweep   []int
	inPeers []int

	// Issue 30: the builds beside this one, the ingress modes, the leased
	// renewals and the RSS per live workload.
	baseline       string   // -baseline: a previous build's binary
	stock          bool     // -stock: build the stock upstream daemon and run it too
	stockBin       string   // -stock-bin: the stock daemon's binary, built elsewhere
	stockLogLevel  string   // the stock daemon's --log-level
	ingressModes   []string // cycling and/or new
	ingressMaxLive int      // the ingress daemons' --max-live-workloads
	renewHeld      []int    // leased jobs held, one figure each
	renewJobs      int      // of them renewed in the loop
	renewLease     int      // the lease, in seconds
	memRSSLive     int      // live workloads for the RSS figure; 0 skips it

	// Issue 39: this build's extra daemon flags, and the fsync modes its
	// ingress runs in, each against the durable ceiling in the same mode.
	daemonArgs  []string // -daemon-args, less any --journal-fsync
	daemonFsync string   // the --journal-fsync of -daemon-args, if it has one
	fsyncModes  []string // -journal-fsync: always and/or durations
	minimalHTTP bool     // -minimal-http: the minimal HTTP/1.1 server beside the ceilings

	// The heartbeat section.
	hbInterval  time.Duration
	hbLive      []int
	hbPeers     []int
	hbModes     string
	hbWindows   int
	hbTargets   bool
	hbFresh     float64
	hbTrials    int
	hbPing      float64
	hbIdle      time.Duration
	hbFanN      []int
	hbFanFrames int
	hbRSS       []int
	hbRSSFor    int
	hbParts     string
}

// sectionNames are the harness's sections, in the order they run.
var sectionNames = []string{"ingress", "inbound", "fanout", "isolation", "renewals", "memory", "heartbeat"}

// The ingress section's modes: each producer cycling over a few jobs of its
// own with a rising seq, or opening a new job with every frame.
const (
	modeCycling = "cycling"
	modeNew     = "new"
)

// countsFlag is a flag holding a comma-separated list of counts (1k = 1000).
type countsFlag struct{ dst *[]int }

func (f countsFlag) String() string {
	if f.dst == nil {
		return ""
	}
	var parts []string
	for _, n := range *f.dst {
		parts = append(parts, fmtCount(n))
	}
	return strings.Join(parts, ",")
}

func (f countsFlag) Set(s string) error {
	ns, err := parseCounts(s)
	if err != nil {
		return err
	}
	if len(ns) == 0 {
		return errors.New("empty list")
	}
	*f.dst = ns
	return nil
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("wlmbench", flag.ContinueOnError)
	// A mistake is one line naming the flag, which main prints; the usage
	// text is printed for -h only, where it was asked for.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&c.bin, "bin", "", "daemon binary to run (default: go build the module root)")
	fs.IntVar(&c.c, "c", 32, "concurrent keep-alive producers")
	fs.DurationVar(&c.t, "t", 5*time.Second, "duration of one ingress trial")
	fs.IntVar(&c.trials, "trials", 3, "trials per figure; the table shows medians")
	fs.IntVar(&c.k, "k", 8, "peers (mTLS sinks) for fan-out and isolation")
	fs.IntVar(&c.fanFrames, "frames", 10000, "frames per fan-out trial")
	fs.IntVar(&c.window, "window", 256, "fan-out feed: most frames ahead of the slowest healthy peer (queues hold 1024)")
	fs.IntVar(&c.memFrames, "mem-frames", 1_000_000, "memory run: ingress frames (5 per workload)")
	fs.IntVar(&c.memLive, "mem-live", 10_000, "memory run: workloads open at once")
	fs.StringVar(&c.metricsPath, "metrics-path", "/metrics", "path of the daemon's --metrics endpoint")
	fs.StringVar(&c.only, "only", "", "comma-separated sections to run: "+strings.Join(sectionNames, ",")+" (default all)")
	fs.BoolVar(&c.keep, "keep", false, "keep the temp directory (daemon logs, cluster dirs)")
	c.sweep, c.inPeers = []int{1, 8, 32, 128}, []int{1, 4, 16}
	fs.Var(countsFlag{&c.sweep}, "sweep", "ingress: producer counts C of the concurrency sweep (-c is added when missing; the half-rate run uses -c)")
	fs.Var(countsFlag{&c.inPeers}, "inbound-peers", "inbound: pinned peer counts P, each peer one keep-alive mTLS stream")
	c.hbLive, c.hbPeers, c.hbFanN, c.hbRSS = []int{1000, 10000, 100000}, []int{4, 8}, []int{1, 8, 32}, []int{100000, 300000}
	fs.DurationVar(&c.hbInterval, "hb-interval", 5*time.Second, "heartbeat: the daemons' --resync-interval")
	fs.Var(countsFlag{&c.hbLive}, "hb-live", "heartbeat: live workloads L in the re-sync set, a comma-separated list (1k = 1000)")
	fs.Var(countsFlag{&c.hbPeers}, "hb-peers", "heartbeat: peers K, a comma-separated list")
	fs.StringVar(&c.hbModes, "hb-modes", "batching,single", "heartbeat: peer kinds, batching and/or single (one frame per POST)")
	fs.IntVar(&c.hbWindows, "hb-windows", 3, "heartbeat: intervals measured per run")
	fs.BoolVar(&c.hbTargets, "hb-targets", true, "heartbeat: also run the issue's coverage targets, scaled to -hb-interval (10k single-frame, 100k batching at 30s)")
	fs.Float64Var(&c.hbFresh, "hb-fresh", 200, "heartbeat: fresh frames per second on stdin during the windows")
	fs.IntVar(&c.hbTrials, "hb-fresh-trials", 3, "heartbeat: runs of each target row and of its baseline, interleaved, for the fresh-frame p99 (medians)")
	fs.Float64Var(&c.hbPing, "hb-ping", 50, "heartbeat: stdin requests and ingress posts per second, each, for the lock-hold figures")
	fs.DurationVar(&c.hbIdle, "hb-idle", 3*time.Second, "heartbeat: how long the idle baseline of the round trips runs, before the peers attach")
	fs.Var(countsFlag{&c.hbFanN}, "hb-fan-n", "heartbeat: peers N for fan-out with batching peers against the ceiling")
	fs.IntVar(&c.hbFanFrames, "hb-fan-frames", 10000, "heartbeat: frames per fan-out trial")
	fs.Var(countsFlag{&c.hbRSS}, "hb-rss", "heartbeat: live workloads for the RSS figures")
	fs.IntVar(&c.hbRSSFor, "hb-rss-intervals", 2, "heartbeat: intervals of passes before the RSS is read (logged after each)")
	fs.StringVar(&c.hbParts, "hb-parts", "coverage,fanout,rss", "heartbeat: parts to run: coverage (with fresh frames and lock hold), fanout, rss")
	fs.StringVar(&c.baseline, "baseline", "", "a previous build's daemon binary, run beside this one with interleaved trials; each path gets its figure and this/baseline ratio")
	fs.BoolVar(&c.stock, "stock", false, "also build and run the stock upstream daemon (../shared/upstream, with its local ingress) on ingress and inbound, against issue 30's targets")
	fs.StringVar(&c.stockBin, "stock-bin", "", "the stock daemon's binary (implies -stock; default: build it)")
	fs.StringVar(&c.stockLogLevel, "stock-log-level", "warn", "the stock daemon's --log-level: it logs every frame at info, which this daemon does not")
	c.ingressModes = []string{modeCycling, modeNew}
	fs.Func("ingress-modes", "ingress: producers' frames, cycling (8 jobs each, rising seq) and/or new (a new job per frame) (default cycling,new)", func(v string) error {
		c.ingressModes = nil
		for _, m := range strings.Split(v, ",") {
			if m != modeCycling && m != modeNew {
				return fmt.Errorf("unknown mode %q (cycling, new)", m)
			}
			c.ingressModes = append(c.ingressModes, m)
		}
		return nil
	})
	fs.IntVar(&c.ingressMaxLive, "ingress-max-live", 1_000_000, "ingress: the daemons' --max-live-workloads, above what a point fills with new jobs, so the bound's 503s are not what is measured")
	c.renewHeld = []int{1000, 100000}
	fs.Var(countsFlag{&c.renewHeld}, "renew-held", "renewals: leased ingress jobs held, one figure each (1k = 1000); the first and the last are compared")
	fs.IntVar(&c.renewJobs, "renew-jobs", 64, "renewals: of the held jobs, how many are renewed in the loop")
	fs.IntVar(&c.renewLease, "renew-lease", 600, "renewals: the Workload-Lease, in seconds (5 to 86400)")
	c.memRSSLive = 100_000
	fs.Func("mem-rss-live", "memory: live ingress jobs for the RSS per live workload figure, a count (1k = 1000; 0 skips it) (default 100k)", func(v string) error {
		ns, err := parseCounts(v)
		if err != nil || len(ns) != 1 {
			return errors.New("want one count")
		}
		c.memRSSLive = ns[0]
		return nil
	})
	fs.BoolVar(&c.minimalHTTP, "minimal-http", false, "ingress: also run a minimal HTTP/1.1 server (Content-Length bodies, no timeouts) beside the bare net/http ceiling, to show what net/http's server costs a frame")
	var daemonArgs string
	fs.StringVar(&daemonArgs, "daemon-args", "", "extra flags for this build's daemons in every section, split at spaces (e.g. \"--journal-fsync 100ms\"); a --journal-fsync here is the ingress's one fsync mode unless -journal-fsync is given")
	var fsyncModes string
	fs.StringVar(&fsyncModes, "journal-fsync", "", "ingress: this build's --journal-fsync modes, comma-separated (always, or a duration from 10ms to 10s), each against the durable ceiling fsyncing alike (default always,100ms)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintln(stderr, "Usage of wlmbench:")
			fs.PrintDefaults()
		}
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	if c.stockBin != "" {
		c.stock = true
	}
	if err := c.setFsyncModes(daemonArgs, fsyncModes); err != nil {
		return c, err
	}
	switch {
	case c.c < 1, c.trials < 1, c.k < 2, c.fanFrames < 1, c.t <= 0:
		return c, errors.New("-c, -trials, -frames must be >= 1, -k >= 2, -t > 0")
	case c.window < 1 || c.window > 1000:
		return c, errors.New("-window must be between 1 and 1000 (the peer queues hold 1024)")
	case c.memFrames != 0 && c.memFrames < memFramesPerWorkload:
		return c, fmt.Errorf("-mem-frames must be 0 (no churn run) or >= %d", memFramesPerWorkload)
	case c.ingressMaxLive < 1:
		return c, errors.New("-ingress-max-live must be >= 1")
	case slices.Min(c.renewHeld) < 1 || c.renewJobs < 1 || c.renewJobs > slices.Min(c.renewHeld):
		return c, errors.New("-renew-jobs must be between 1 and the least of -renew-held")
	case c.renewLease < 5 || c.renewLease > 86400:
		return c, errors.New("-renew-lease must be from 5 to 86400 seconds")
	case c.baseline != "" && !isFile(c.baseline):
		return c, fmt.Errorf("-baseline %s: not a file", c.baseline)
	case c.stockBin != "" && !isFile(c.stockBin):
		return c, fmt.Errorf("-stock-bin %s: not a file", c.stockBin)
	case c.hbInterval < 100*time.Millisecond || c.hbWindows < 1 || c.hbFresh <= 0 || c.hbPing <= 0 || c.hbIdle <= 0 || c.hbFanFrames < 1 || c.hbRSSFor < 1 || c.hbTrials < 1:
		return c, errors.New("-hb-interval must be >= 100ms, -hb-windows, -hb-fan-frames and -hb-rss-intervals >= 1, -hb-fresh, -hb-ping and -hb-idle > 0")
	case slices.Min(c.sweep) < 1 || slices.Min(c.inPeers) < 1:
		return c, errors.New("-sweep and -inbound-peers take counts >= 1")
	case slices.Min(c.hbPeers) < 1 || slices.Min(c.hbFanN) < 1 || slices.Min(c.hbLive) < 1 || slices.Min(c.hbRSS) < 1:
		return c, errors.New("-hb-peers, -hb-fan-n, -hb-live and -hb-rss take counts >= 1")
	}
	for _, s := range c.sections() {
		if !slices.Contains(sectionNames, s) {
			return c, fmt.Errorf("-only: unknown section %q", s)
		}
	}
	for _, m := range strings.Split(c.hbModes, ",") {
		if m != "batching" && m != "single" {
			return c, fmt.Errorf("-hb-modes: unknown peer kind %q", m)
		}
	}
	for _, p := range c.hbPartList() {
		if !slices.Contains([]string{"coverage", "fanout", "rss"}, p) {
			return c, fmt.Errorf("-hb-parts: unknown part %q", p)
		}
	}
	return c, nil
}

// isFile reports whether path names a regular file.
func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

func (c config) sections() []string {
	if c.only == "" {
		return sectionNames
	}
	return strings.Split(c.only, ",")
}

func (c config) hbPartList() []string { return strings.Split(c.hbParts, ",") }

func (c config) hbModeList() []hbMode {
	var out []hbMode
	for _, m := range strings.Split(c.hbModes, ",") {
		if m == "batching" {
			out = append(out, modeBatching)
		} else {
			out = append(out, modeSingle)
		}
	}
	return out
}

func (c config) runs(section string) bool { return slices.Contains(c.sections(), section) }

func main() {
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "ceiling-") {
		os.Exit(ceilingMain(os.Args[1]))
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "wlmbench:", err)
		os.Exit(2)
	}
	if err := run(cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "wlmbench:", err)
		os.Exit(1)
	}
}

// ceilingMain runs one of the ceilings' own processes, which the harness
// starts from its own executable.
func ceilingMain(role string) int {
	var err error
	switch role {
	case "ceiling-ingress":
		err = serveCeilingMain()
	case "ceiling-fanout":
		err = ceilingFanoutMain()
	case "ceiling-inbound":
		err = ceilingInboundMain()
	case "ceiling-durable":
		err = serveDurableMain()
	case "ceiling-minimal":
		err = serveMinimalMain()
	default:
		err = errors.New("unknown role")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "wlmbench %s: %v\n", role, err)
		return 1
	}
	return 0
}

// bench is one harness run.
type bench struct {
	cfg        config
	bin        string
	root       string
	node       devpki.Identity // the daemons' identity, pinned by the sinks
	hasMetrics bool
	tbl        *table
	goals      *goalList // issue 14's targets, for the summary block
	goals30    *goalList // issue 30's targets, for a second block
	goals39    *goalList // issue 39's: the durable ceiling and the fsync modes

	// The builds each section runs: this one always, the -baseline build
	// and the stock daemon when asked for.
	this, base, stock *contestant
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(cfg config, out io.Writer) error {
	root, err := os.MkdirTemp("", "wlmbench-")
	if err != nil {
		return err
	}
	if cfg.keep {
		progress("keeping %s", root)
	} else {
		defer os.RemoveAll(root)
	}
	b := &bench{cfg: cfg, bin: cfg.bin, root: root, tbl: &table{}, goals: issue14Goals(cfg), goals30: issue30Goals(cfg), goals39: issue39Goals(cfg)}
	if b.bin == "" {
		if b.bin, err = buildDaemon(root); err != nil {
			return err
		}
	}
	if b.node, err = devpki.Mint(devpki.NewUUID()); err != nil {
		return err
	}
	b.this = newContestant(roleThis, b.bin, "info")
	b.this.fsync, b.this.args = cfg.daemonFsync, cfg.daemonArgs
	b.hasMetrics = b.this.known["--metrics"]
	if cfg.baseline != "" {
		b.base = newContestant(roleBaseline, cfg.baseline, "info")
	}
	if cfg.stock {
		bin := cfg.stockBin
		if bin == "" {
			if bin, err = buildStock(root); err != nil {
				return fmt.Errorf("stock daemon: %w", err)
			}
		}
		b.stock = newContestant(roleStock, bin, cfg.stockLogLevel)
	}
	load0 := loadAvg()
	started := time.Now()
	if cfg.runs("ingress") {
		if err := b.ingress(); err != nil {
			return fmt.Errorf("ingress: %w", err)
		}
	}
	if cfg.runs("inbound") {
		if err := b.inbound(); err != nil {
			return fmt.Errorf("inbound: %w", err)
		}
	}
	if cfg.runs("fanout") || cfg.runs("isolation") {
		if err := b.fanout(); err != nil {
			return fmt.Errorf("fan-out: %w", err)
		}
	}
	if cfg.runs("renewals") {
		if err := b.renewals(); err != nil {
			return fmt.Errorf("renewals: %w", err)
		}
	}
	if cfg.runs("memory") {
		if err := b.memory(); err != nil {
			return fmt.Errorf("memory: %w", err)
		}
	}
	if cfg.runs("heartbeat") {
		if b.base != nil || b.stock != nil {
			b.tbl.note("heartbeat: runs this build only; -baseline and -stock are not run in this section")
		}
		if err := b.heartbeat(); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
	}
	fmt.Fprintf(out, "wlmbench %s: daemon %s, %d CPUs, %s, load average %s at start, %s at end, %s in all\n",
		time.Now().Format("2006-01-02 15:04"), filepath.Base(b.bin), runtime.NumCPU(), runtime.Version(),
		load0, loadAvg(), time.Since(started).Round(time.Second))
	if b.base != nil {
		fmt.Fprintf(out, "baseline build: %s (trials interleaved with this build's; this/baseline: throughput above 1 is faster, CPU per frame below 1 is cheaper)\n", b.base.bin)
	}
	if b.stock != nil {
		fmt.Fprintf(out, "stock daemon: %s, --log-level %s\n", b.stock.bin, b.stock.logLevel)
	}
	fmt.Fprintln(out)
	b.tbl.render(out)
	fmt.Fprintf(out, "\n%d of %d targets missed\n", b.tbl.misses(), countTargets(b.tbl))
	if cfg.runs("ingress") || cfg.runs("inbound") {
		fmt.Fprintln(out)
		b.goals.render(out)
	}
	for _, g := range []*goalList{b.goals30, b.goals39} {
		if len(g.goals) > 0 {
			fmt.Fprintln(out)
			g.render(out)
		}
	}
	return nil
}

func countTargets(t *table) int {
	n := 0
	for _, r := range t.rows {
		if r.result == pass || r.result == miss {
			n++
		}
	}
	return n
}

// buildDaemon builds the module root's main package into dir.
func buildDaemon(dir string) (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	modRoot := filepath.Dir(strings.TrimSpace(string(gomod)))
	if strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		return "", errors.New("not inside the module: run from the repository or pass --bin")
	}
	bin := filepath.Join(dir, "nvpair-workload-manager")
	progress("building the daemon from %s", modRoot)
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = modRoot
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build: %w", err)
	}
	return bin, nil
}

// loadAvg returns the 1-minute load average, or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func appendFailure(fs []string, who string, r loadResult) []string {
	if r.failed == 0 {
		return fs
	}
	return append(fs, fmt.Sprintf("%s: %d of %d frames not accepted, first: %s", who, r.failed, r.ok+r.failed, r.firstError))
}

// drops returns a daemon's frames dropped at the enqueue point and at the
// peer queues: exact from its metrics when it serves them, else as logged
// (a lower bound: the daemon logs drops at most once per 10s).
func (b *bench) drops(d *daemon) (outbound, peer int64, how string) {
	if text, err := d.scrape(b.cfg.metricsPath); err == nil {
		o, n1 := promSum(text, "nvpair_wlm_outbound_frames_dropped_total")
		p, n2 := promSum(text, "nvpair_wlm_peer_queue_dropped_total")
		if n1 > 0 && n2 > 0 {
			return int64(o), int64(p), "metrics"
		}
	}
	return d.outboundDrops.Load(), d.peerDrops.Load(), "logged, a lower bound"
}

func (b *bench) stopDaemon(d *daemon) {
	if err := d.stop(); err != nil {
		b.tbl.note("%s daemon: unclean exit: %v", d.name, err)
	}
}

// fanout is the fan-out and isolation sections: the same sinks serve the
// ceiling, a daemon broadcasting to all K and a daemon broadcasting to K-1
// of them plus a black hole; the trials interleave the three.
func (b *bench) fanout() error {
	cfg := b.cfg
	progressCh := make(chan struct{}, 1)
	sinks := make([]*sink, cfg.k)
	for i := range sinks {
		s, err := newSink(b.node.DER, progressCh)
		if err != nil {
			return err
		}
		defer s.close()
		sinks[i] = s
	}
	idents := func(ss []*sink) ([]devpki.Identity, []int) {
		var ids []devpki.Identity
		var ports []int
		for _, s := range ss {
			ids, ports = append(ids, s.ident), append(ports, s.port)
		}
		return ids, ports
	}
	ceiling, err := startCeilingFanout(b.node, sinks)
	if err != nil {
		return err
	}
	defer ceiling.close()

	ids, ports := idents(sinks)
	full, err := startDaemon(b.bin, b.root, b.this.opts(daemonOpts{name: "fanout", ident: b.node, pins: ids, metrics: b.hasMetrics, resyncInterval: time.Hour}))
	if err != nil {
		return err
	}
	defer b.stopDaemon(full)
	if err := full.send(discoveryLine(ids, ports)); err != nil {
		return err
	}
	if err := full.waitTargets(cfg.k, 10*time.Second); err != nil {
		return err
	}

	// The -baseline build broadcasts to the same K sinks, its trials
	// interleaved with the others'; a build without a peer port to pin is
	// not one this harness can run, so nothing is probed.
	var base *daemon
	if b.base != nil && cfg.runs("fanout") {
		base, err = startDaemon(b.base.bin, b.root, b.base.opts(daemonOpts{name: "fanout", ident: b.node, pins: ids, resyncInterval: time.Hour}))
		if err == nil {
			defer b.stopDaemon(base)
			if err = base.send(discoveryLine(ids, ports)); err == nil {
				err = base.waitTargets(cfg.k, 10*time.Second)
			}
		}
		if err != nil {
			_ = b.buildFailed("fan-out", b.base, err)
			base = nil
		}
	}

	if b.stock != nil {
		b.tbl.note("fan-out and isolation: the stock daemon is not run (its 1024-frame outbound queue drops rather than waits, so the closed-loop feed measures something else)")
	}
	if b.base != nil && cfg.runs("isolation") {
		b.tbl.note("isolation: runs this build only; the baseline build is compared on fan-out")
	}

	var iso *daemon
	var hole *blackHole
	healthy := sinks[:cfg.k-1]
	if cfg.runs("isolation") {
		if hole, err = newBlackHole(); err != nil {
			return err
		}
		defer hole.close()
		hids, hports := idents(healthy)
		hids, hports = append(hids, hole.ident), append(hports, hole.port)
		if iso, err = startDaemon(b.bin, b.root, b.this.opts(daemonOpts{name: "isolation", ident: b.node, pins: hids, metrics: b.hasMetrics, resyncInterval: time.Hour})); err != nil {
			return err
		}
		defer b.stopDaemon(iso)
		if err := iso.send(discoveryLine(hids, hports)); err != nil {
			return err
		}
		if err := iso.waitTargets(cfg.k, 10*time.Second); err != nil {
			return err
		}
	}

	var fullR, ceilR, isoR, baseR []fanResult
	var fullCPU, ceilCPU, baseCPU []time.Duration
	run := int64(0)
	for i := range cfg.trials {
		steps := []func(){
			func() {
				run++
				m := startCPU(ceiling.cmd.Process.Pid)
				r := ceiling.run(sinks, run, cfg.fanFrames)
				ceilCPU = append(ceilCPU, m.perFrame(int64(cfg.fanFrames)))
				progress("fan-out trial %d/%d: ceiling %s", i+1, cfg.trials, r)
				ceilR = append(ceilR, r)
			},
			func() {
				run++
				m := startCPU(full.cmd.Process.Pid)
				r := feedDaemon(full, sinks, progressCh, run, cfg.fanFrames, cfg.window)
				fullCPU = append(fullCPU, m.perFrame(int64(cfg.fanFrames)))
				progress("fan-out trial %d/%d: daemon %s", i+1, cfg.trials, r)
				fullR = append(fullR, r)
			},
		}
		if base != nil {
			steps = append(steps, func() {
				run++
				m := startCPU(base.cmd.Process.Pid)
				r := feedDaemon(base, sinks, progressCh, run, cfg.fanFrames, cfg.window)
				baseCPU = append(baseCPU, m.perFrame(int64(cfg.fanFrames)))
				progress("fan-out trial %d/%d: baseline build %s", i+1, cfg.trials, r)
				baseR = append(baseR, r)
			})
		}
		if iso != nil {
			steps = append(steps, func() {
				run++
				r := feedDaemon(iso, healthy, progressCh, run, cfg.fanFrames, cfg.window)
				progress("isolation trial %d/%d: daemon, 1 of %d black-holed, at the %d healthy: %s", i+1, cfg.trials, cfg.k, len(healthy), r)
				isoR = append(isoR, r)
			})
		}
		for j := range steps { // rotate the order so drift hits each alike
			steps[(i+j)%len(steps)]()
		}
	}

	rates := func(rs []fanResult) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = r.rate()
		}
		return out
	}
	incomplete := func(who string, rs []fanResult) {
		for i, r := range rs {
			if !r.complete {
				b.tbl.note("%s trial %d incomplete: the slowest healthy peer held %d of %d frames", who, i+1, r.delivered, r.frames)
			}
		}
	}
	allDone := func(rs []fanResult) bool {
		for _, r := range rs {
			if !r.complete {
				return false
			}
		}
		return len(rs) > 0
	}
	fr, cr := median(rates(fullR)), median(rates(ceilR))
	if cfg.runs("fanout") {
		var worst, ceilWorst int64
		for _, r := range fullR {
			worst = max(worst, r.maxHandshakes())
		}
		for _, r := range ceilR {
			ceilWorst = max(ceilWorst, r.maxHandshakes())
		}
		rr := row{section: "fan-out",
			figure:   fmt.Sprintf("frames/s delivered to all %d peers, %d frames, median of %d", cfg.k, cfg.fanFrames, cfg.trials),
			measured: fmtRate(fr), baseline: fmtRate(cr), ratio: fmtRatio(fr, cr),
			target: ">= 0.50x", result: check(cr > 0 && fr/cr >= 0.5 && allDone(fullR))}
		cr := cpuRow("fan-out", fmt.Sprintf("  CPU per frame sent to %d peers (ratio: ceiling/daemon)", cfg.k), fullCPU, ceilCPU)
		if base != nil {
			compareSeries(&series{rate: rates(fullR), cpu: fullCPU}, &series{rate: rates(baseR), cpu: baseCPU},
				&series{rate: rates(ceilR)}).baseCells(&rr, &cr)
			incomplete("fan-out (baseline build)", baseR)
		}
		b.tbl.add(rr)
		b.tbl.add(row{section: "fan-out", figure: fmt.Sprintf("TLS handshakes per peer over %d frames (worst peer, worst trial)", cfg.fanFrames),
			measured: strconv.FormatInt(worst, 10), baseline: strconv.FormatInt(ceilWorst, 10),
			target: "<= 2", result: check(worst <= 2 && len(fullR) > 0)})
		b.tbl.add(cr)
		incomplete("fan-out (daemon)", fullR)
		incomplete("fan-out (ceiling)", ceilR)
		if o, p, how := b.drops(full); o+p > 0 {
			b.tbl.note("fan-out daemon dropped frames (%s): enqueue point %d, peer queues %d", how, o, p)
		}
	}
	if iso == nil {
		b.tbl.note("fan-out feeds the daemon's stdin closed-loop, at most %d frames ahead of the slowest peer (the peer queues hold 1024), so delivery is measured rather than drops", cfg.window)
		return nil
	}

	// Latency at the healthy peers, paced at half the rate the daemon
	// sustained without a black hole: how far behind a member's view is in
	// real use, with and without a dead member.
	paceRate := fr / 2
	paceFrames := max(1, int(paceRate*cfg.t.Seconds()))
	var fullP, isoP []fanResult
	for i := range cfg.trials {
		steps := []func(){
			func() {
				run++
				r := feedDaemonPaced(full, sinks, progressCh, run, paceFrames, paceRate)
				progress("paced trial %d/%d at %s: daemon, none black-holed: %s", i+1, cfg.trials, fmtRate(paceRate), r)
				fullP = append(fullP, r)
			},
			func() {
				run++
				r := feedDaemonPaced(iso, healthy, progressCh, run, paceFrames, paceRate)
				progress("paced trial %d/%d at %s: daemon, 1 of %d black-holed, at the %d healthy: %s", i+1, cfg.trials, fmtRate(paceRate), cfg.k, len(healthy), r)
				isoP = append(isoP, r)
			},
		}
		steps[i%2]()
		steps[(i+1)%2]()
	}
	ir := median(rates(isoR))
	iso99, full99 := medianSummary(isoP), medianSummary(fullP)
	b.tbl.add(row{section: "isolation",
		figure:   fmt.Sprintf("frames/s at the %d healthy peers, 1 of %d black-holed (closed loop)", len(healthy), cfg.k),
		measured: fmtRate(ir), baseline: fmtRate(fr) + " none black-holed", ratio: fmtRatio(ir, fr),
		target: ">= 0.90x", result: check(fr > 0 && ir/fr >= 0.9 && allDone(isoR))})
	b.tbl.add(row{section: "isolation",
		figure:   fmt.Sprintf("p99 delivery latency at the healthy peers, paced at %s", fmtRate(paceRate)),
		measured: fmtDur(iso99.p99), baseline: fmtDur(full99.p99) + " none black-holed",
		target: "< 1s", result: check(iso99.p99 > 0 && iso99.p99 < time.Second && allDone(isoP))})
	b.tbl.add(row{section: "isolation", figure: "  p50 / p99 / max paced (medians)",
		measured: iso99.String(), baseline: full99.String()})
	o, p, how := b.drops(iso)
	b.tbl.add(row{section: "isolation", figure: "drops: enqueue point / peer queues (" + how + ")",
		measured: fmt.Sprintf("%d / %d", o, p),
		baseline: fmt.Sprintf("of %d fed; %d conns held", cfg.trials*(cfg.fanFrames+paceFrames), hole.accepted.Load())})
	incomplete("isolation (closed loop)", isoR)
	incomplete("isolation (paced)", isoP)
	incomplete("fan-out (paced)", fullP)
	b.tbl.note("fan-out and isolation rates: the daemon's stdin is fed closed-loop, at most %d frames ahead of the slowest healthy peer (the peer queues hold 1024), so delivery is measured rather than drops", cfg.window)
	b.tbl.note("isolation latency: %d frames per trial written to stdin at %s (half the fan-out rate), from each frame's due time to the sink's handler", paceFrames, fmtRate(paceRate))
	b.tbl.note("isolation: the black-holed peer's queue fills (1024) and then drops for that peer only; every healthy peer received every frame unless a trial is noted incomplete")
	b.tbl.note("the fan-out ceiling is a process of its own posting the same frames from one goroutine per sink over a keep-alive mTLS client; the sinks run in the harness process, on the same cores as the daemon")
	return nil
}

// cpuRow shows the median CPU per frame of the daemon and the ceiling.
func cpuRow(section, figure string, daemon, ceiling []time.Duration) row {
	d, c := medianDuration(daemon), medianDuration(ceiling)
	if d == 0 || c == 0 {
		return row{section: section, figure: figure, measured: "n/a", result: unavailable}
	}
	return row{section: section, figure: figure, measured: fmtMicros(d), baseline: fmtMicros(c), ratio: fmtRatio(float64(c), float64(d))}
}

// medianSummary is the per-statistic median of runs' latency summaries.
func medianSummary(rs []fanResult) latencySummary {
	var p50, p99, mx []time.Duration
	for _, r := range rs {
		p50, p99, mx = append(p50, r.lats.p50), append(p99, r.lats.p99), append(mx, r.lats.max)
	}
	return latencySummary{p50: medianDuration(p50), p99: medianDuration(p99), max: medianDuration(mx)}
}

// memory is the memory section: the churn run, then the RSS per live
// workload (memory.go).
func (b *bench) memory() error {
	if b.cfg.memFrames > 0 {
		if err := b.memoryChurn(); err != nil {
			return err
		}
	}
	if b.cfg.memRSSLive > 0 {
		return b.liveRSS()
	}
	return nil
}

// memoryChurn is the churn run: many workloads, each driven to a terminal
// state and most removed.
func (b *bench) memoryChurn() error {
	cfg := b.cfg
	workloads := cfg.memFrames / memFramesPerWorkload
	d, err := startDaemon(b.bin, b.root, b.this.opts(daemonOpts{name: "memory", ident: b.node, ingress: true, metrics: b.hasMetrics}))
	if err != nil {
		return err
	}
	defer b.stopDaemon(d)
	var res memResult
	settle := func() { time.Sleep(time.Second) }
	settle()
	if b.hasMetrics {
		res.goroutinesPre, res.goroutineErr = d.goroutines(cfg.metricsPath)
	} else {
		res.goroutineErr = errors.New("the daemon has no --metrics flag")
	}
	st, err := d.procStatus()
	if err != nil {
		return err
	}
	res.rssStartKB = st["VmRSS"]
	client, closeIdle := producerClient(cfg.c)
	start := time.Now()
	progress("memory run: %d frames over %d workloads, %d open at once, %d producers", workloads*memFramesPerWorkload, workloads, cfg.memLive, cfg.c)
	res.ok, res.failed, res.firstError = memoryLoad(client, "http://"+d.ingressAddr+ingressPath, cfg.c, workloads, cfg.memLive,
		func(done int64) {
			if done%100000 == 0 {
				st, _ := d.procStatus()
				progress("memory run: %d frames, RSS %d MiB, peak %d MiB", done, st["VmRSS"]>>10, st["VmHWM"]>>10)
			}
		})
	res.elapsed = time.Since(start)
	closeIdle()
	// Every accepted frame was written to the broker before its answer.
	base := d.upserts.Load() + d.removes.Load()
	deadline := time.Now().Add(5 * time.Second)
	for d.upserts.Load()+d.removes.Load() < res.ok && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		base = d.upserts.Load() + d.removes.Load()
	}
	if base != res.ok {
		b.tbl.note("memory: the broker side read %d upserts and removals for %d accepted frames", base, res.ok)
	}
	if res.goroutineErr == nil {
		deadline := time.Now().Add(15 * time.Second)
		for {
			n, err := d.goroutines(cfg.metricsPath)
			if err != nil {
				res.goroutineErr = err
				break
			}
			res.goroutinesPost = n
			if abs(n-res.goroutinesPre) <= 5 || time.Now().After(deadline) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	if st, err = d.procStatus(); err != nil {
		return err
	}
	res.peakKB, res.rssEndKB = st["VmHWM"], st["VmRSS"]
	progress("memory run: %d accepted, %d failed in %s; peak RSS %d MiB, RSS at end %d MiB",
		res.ok, res.failed, res.elapsed.Round(time.Millisecond), res.peakKB>>10, res.rssEndKB>>10)

	const limitKB = 128 << 10
	b.tbl.add(row{section: "memory",
		figure:   fmt.Sprintf("peak RSS (VmHWM), %d frames over %d workloads, %d open", res.ok+res.failed, workloads, cfg.memLive),
		measured: mib(res.peakKB), baseline: mib(res.rssStartKB) + " at start, " + mib(res.rssEndKB) + " at end",
		target: "< 128 MiB", result: check(res.peakKB > 0 && res.peakKB < limitKB && res.failed == 0)})
	g := row{section: "memory", figure: "goroutines before -> after the run", target: "within +-5"}
	if res.goroutineErr != nil {
		g.measured, g.result = "n/a", unavailable
		b.tbl.note("memory: goroutines not measured: %v", res.goroutineErr)
	} else {
		g.measured = fmt.Sprintf("%d -> %d", res.goroutinesPre, res.goroutinesPost)
		g.ratio = fmt.Sprintf("%+d", res.goroutinesPost-res.goroutinesPre)
		g.result = check(abs(res.goroutinesPost-res.goroutinesPre) <= 5)
	}
	b.tbl.add(g)
	b.tbl.add(row{section: "memory", figure: "  ingress rate over the memory run",
		measured: fmtRate(float64(res.ok) / res.elapsed.Seconds())})
	if res.failed > 0 {
		b.tbl.note("memory: %d frames not accepted, first: %s", res.failed, res.firstError)
	}
	b.tbl.note("memory: the daemon runs with its default --resync-interval (30s); the ingress and fan-out daemons with 1h, so heartbeats of the growing re-sync set stay out of their figures")
	return nil
}

func mib(kb int64) string { return strconv.FormatFloat(float64(kb)/1024, 'f', 1, 64) + " MiB" }

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
