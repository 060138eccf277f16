// Command devcluster runs a development cluster of nvpair-workload-manager
// daemons on one machine: it mints the cluster's identities and pins, builds
// and starts N daemons on loopback, plays each node's broker (discovery
// snapshots, the Jobs store, the replay after a restart), shows every
// node's Jobs list side by side, and with --simulate drives traffic through
// node 1's ingress and the other nodes' brokers.
//
//	go run ./cmd/devcluster --simulate
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"nvpair-workload-manager/internal/cliflags"
	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/pairshadow"
	"nvpair-workload-manager/internal/dev/stockwlm"
)

func main() {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	if len(os.Args) > 1 && os.Args[1] == "scale" {
		os.Exit(runScale(os.Args[2:], os.Stdout, os.Stderr, sigs)) // scale.go: issue 37's scale benchmark
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, sigs, isTerminal(os.Stdout), hooks{}))
}

// config is the parsed command line.
type config struct {
	nodes          int
	dir            string
	keep           bool
	bin            string
	stock          int
	stockBin       string
	ingress        string
	simulate       bool
	chaos          bool
	metrics        bool
	duration       time.Duration
	resyncInterval time.Duration
	staleAfter     time.Duration
	logLevel       string
}

// maxNodes bounds --nodes: 128 daemons on one machine is the most issue
// 37's scale targets ask of it (each holds a connection to every other, so
// the processes' file descriptors grow with the square: see scale.go's
// check before a run).
const maxNodes = 128

const usage = `usage: devcluster [flags]
       devcluster scale [flags]   (the scale benchmark: devcluster scale -h)

Runs N nvpair-workload-manager daemons on loopback, plays their brokers and
shows every node's Jobs list side by side. Ctrl-C stops it.

`

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("devcluster", flag.ContinueOnError)
	// The flag package's own errors are not printed: cliflags turns them
	// into one line naming the flag, which run prints (exit 2).
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.IntVar(&c.nodes, "nodes", 3, fmt.Sprintf("number of nodes (1 to %d)", maxNodes))
	fs.StringVar(&c.dir, "dir", "", "working directory, empty or absent (default: a new temporary directory, removed on exit unless --keep)")
	fs.BoolVar(&c.keep, "keep", false, "keep the temporary working directory on exit")
	fs.StringVar(&c.bin, "bin", "", "the daemon's binary (default: go build the module root into the working directory)")
	fs.IntVar(&c.stock, "stock", 0, "run this many nodes, the last ones, on the stock workload manager built from ../shared/upstream (node 1 stays ours: it carries the ingress)")
	fs.StringVar(&c.stockBin, "stock-bin", "", "the stock workload manager's binary (default: go build it from shared/upstream above the module root)")
	fs.StringVar(&c.ingress, "ingress", "127.0.0.1:14324", "node 1's --local-ingress address; port 0 picks a free port")
	fs.BoolVar(&c.simulate, "simulate", false, "drive simulated traffic through node 1's ingress and the other nodes' brokers")
	fs.BoolVar(&c.chaos, "chaos", false, "with --simulate: restart a daemon, kill the leased producer mid-job, cut a node off for longer than the staleness budget and slow one node's answers, logging each fault; the run must still converge with every job as its producer meant")
	fs.BoolVar(&c.metrics, "metrics", false, "give every daemon a --metrics endpoint on a free loopback port; the summary shows each node's per-peer delivery counters")
	fs.DurationVar(&c.duration, "duration", 0, "end the run after this long and report convergence (0: until Ctrl-C)")
	fs.DurationVar(&c.resyncInterval, "resync-interval", 2*time.Second, "the daemons' --resync-interval (heartbeat)")
	fs.DurationVar(&c.staleAfter, "stale-after", defaultStaleAfter, "the brokers' staleness budget: another node's live job not re-asserted this long is failed by inference (PAIR's default; 10s shows it within a demo)")
	fs.StringVar(&c.logLevel, "log-level", "info", "the daemons' --log-level: info or debug (the dev cluster reads their startup lines)")
	explain := cliflags.Explain(fs, map[string]string{"nodes": "N", "dir": "DIR", "bin": "PATH", "ingress": "HOST:PORT", "duration": "D", "resync-interval": "D", "stale-after": "D", "stock": "N", "stock-bin": "PATH", "log-level": "LEVEL"})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, usage)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
		}
		return c, explain(err)
	}
	staleGiven := false
	fs.Visit(func(f *flag.Flag) { staleGiven = staleGiven || f.Name == "stale-after" })
	if c.chaos && !staleGiven {
		// PAIR's 5 minutes would make the cut outlast any demo: a short
		// budget, five heartbeats, shows the sweep within the run.
		c.staleAfter = 5 * c.resyncInterval
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.nodes < 1 || c.nodes > maxNodes:
		return c, fmt.Errorf("--nodes %d: must be between 1 and %d", c.nodes, maxNodes)
	case c.stock < 0 || c.stock >= c.nodes:
		return c, fmt.Errorf("--stock %d: must be between 0 and --nodes minus 1 (%d): node 1 runs this daemon, for its ingress", c.stock, c.nodes-1)
	case c.stockBin != "" && c.stock == 0:
		return c, fmt.Errorf("--stock-bin %s: give --stock N too", c.stockBin)
	case c.duration < 0:
		return c, fmt.Errorf("--duration %s: must not be negative", c.duration)
	case c.resyncInterval < 100*time.Millisecond:
		return c, fmt.Errorf("--resync-interval %s: must be at least 100ms", c.resyncInterval)
	case c.staleAfter < 2*c.resyncInterval:
		// A budget under two heartbeats fails live jobs between two
		// re-assertions: the views would flap, not converge.
		return c, fmt.Errorf("--stale-after %s: must be at least twice --resync-interval (%s)", c.staleAfter, 2*c.resyncInterval)
	case c.chaos && !c.simulate:
		return c, errors.New("--chaos needs --simulate: the faults are injected while traffic runs")
	case c.chaos && c.nodes < 2:
		return c, fmt.Errorf("--chaos needs at least 2 nodes, not --nodes %d", c.nodes)
	case c.chaos && c.duration > 0 && c.duration < chaosNeeds(c):
		return c, fmt.Errorf("--duration %s: --chaos needs at least %s to inject and heal every fault (a shorter --stale-after or --resync-interval shortens it)", c.duration, chaosNeeds(c).Round(time.Second))
	case !strings.EqualFold(c.logLevel, "info") && !strings.EqualFold(c.logLevel, "debug"):
		// The ports are learned from the daemons' startup lines, at info.
		return c, fmt.Errorf("--log-level %q: must be info or debug; the dev cluster learns the daemons' ports from their info lines", c.logLevel)
	}
	if c.ingress != "" {
		if _, _, err := net.SplitHostPort(c.ingress); err != nil {
			return c, fmt.Errorf("--ingress %s: %v", c.ingress, err)
		}
	}
	return c, nil
}

// hooks let the tests look inside a run.
type hooks struct {
	created  func(*cluster) // the cluster exists; no daemon runs yet
	finished func(*cluster) // the convergence verdict is in; the daemons still run
}

// run is the whole program; it returns the exit status: 0 when the views
// converged, 1 when they did not or the cluster failed, 2 for a bad flag.
func run(args []string, stdout, stderr io.Writer, sigs <-chan os.Signal, tty bool, h hooks) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "devcluster: %v\n", err)
		return 2
	}
	if limit, known := openFileLimit(); cfg.chaos {
		if err := checkChaosFDs(cfg.nodes, limit, known); err != nil {
			fmt.Fprintf(stderr, "devcluster: %v\n", err)
			return 1
		}
	}
	var noteMu sync.Mutex
	var notes []string // shown under the view; printed at the end
	logf := func(format string, args ...any) {
		noteMu.Lock()
		defer noteMu.Unlock()
		line := time.Now().Format("15:04:05 ") + fmt.Sprintf(format, args...)
		notes = append(notes, line)
		if len(notes) > 5 {
			notes = notes[len(notes)-5:]
		}
		if !tty {
			fmt.Fprintln(stderr, "devcluster: "+fmt.Sprintf(format, args...))
		}
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "devcluster: %v\n", err)
		return 1
	}

	dir, cleanup, err := workDir(cfg)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if msg := cleanup(); msg != "" {
			fmt.Fprintln(stdout, msg)
		}
	}()

	bin := cfg.bin
	if bin == "" {
		root, err := moduleRoot()
		if err != nil {
			return fail(fmt.Errorf("%v (or pass --bin PATH)", err))
		}
		fmt.Fprintf(stdout, "devcluster: building the daemon from %s\n", root)
		if bin, err = buildDaemon(root, filepath.Join(dir, "bin")); err != nil {
			return fail(err)
		}
	} else if bin, err = filepath.Abs(bin); err != nil {
		return fail(err)
	}

	stockBin := cfg.stockBin
	if cfg.stock > 0 && stockBin == "" {
		root, err := moduleRoot()
		if err != nil {
			return fail(fmt.Errorf("%v (or pass --stock-bin PATH)", err))
		}
		src, err := stockwlm.Find(root)
		if err != nil {
			return fail(fmt.Errorf("%v (or pass --stock-bin PATH)", err))
		}
		fmt.Fprintf(stdout, "devcluster: building the stock workload manager from %s\n", src)
		if stockBin, err = stockwlm.Build("", src, filepath.Join(dir, "bin")); err != nil {
			return fail(err)
		}
	} else if stockBin != "" {
		if stockBin, err = filepath.Abs(stockBin); err != nil {
			return fail(err)
		}
	}

	shadowBin, err := buildShadow(stdout, filepath.Join(dir, "bin"))
	if err != nil {
		return fail(err)
	}

	members, err := devpki.WriteCluster(dir, cfg.nodes)
	if err != nil {
		return fail(fmt.Errorf("mint the cluster: %w", err))
	}
	c := newCluster(clusterConfig{bin: bin, stockBin: stockBin, stock: cfg.stock, ingress: cfg.ingress, metrics: cfg.metrics, resyncInterval: cfg.resyncInterval,
		staleAfter: cfg.staleAfter, logLevel: cfg.logLevel, logf: logf, shadowBin: shadowBin}, members, dir)
	defer c.closeShadows() // after the daemons stopped; a second close is a no-op
	if cfg.chaos {
		p := planChaos(c)
		if c.links, err = newLinkNet(c, p.cut, p.slow); err != nil {
			return fail(err)
		}
		defer c.links.close() // after the daemons stopped
	}
	if h.created != nil {
		h.created(c)
	}
	defer c.stop() // on every path; the normal end stops them before its summary
	if err := c.startAll(); err != nil {
		if cfg.ingress != "" && strings.Contains(err.Error(), cfg.ingress) && strings.Contains(err.Error(), "in use") {
			err = fmt.Errorf("%v\n(the ingress port is taken: --ingress 127.0.0.1:0 picks a free one)", err)
		}
		return fail(err)
	}
	// The startup lines stay above the view: a redraw in place starts at
	// the top of the screen, so the header prints them again.
	startup := []string{fmt.Sprintf("devcluster: %d nodes under %s, heartbeat %s, staleness budget %s", cfg.nodes, dir, cfg.resyncInterval, cfg.staleAfter)}
	for _, n := range c.nodes {
		line := fmt.Sprintf("devcluster: %s pid %d id %s peer port %d log %s", n.name, n.current().pid, n.id, n.peerPort(), n.logPath)
		if n.stock {
			line += " (stock workload manager)"
		}
		startup = append(startup, line)
		// Each URL on a line of its own, which the view never cuts at the
		// terminal's width (fitLine): a URL cut short cannot be copied.
		if a := n.ingressAddr(); a != "" {
			startup = append(startup, fmt.Sprintf("devcluster: %s ingress http://%s/v1/workloads/events", n.name, a))
		}
		if a := n.metricsAddr(); a != "" {
			startup = append(startup, fmt.Sprintf("devcluster: %s metrics http://%s/metrics", n.name, a))
		}
	}
	if cfg.metrics {
		line, err := writePrometheusConfig(dir, c.nodes)
		if err != nil {
			return fail(err)
		}
		startup = append(startup, line)
	}
	startup = append(startup, "devcluster: all nodes up")
	fmt.Fprintln(stdout, strings.Join(startup, "\n"))

	var sim *simulator
	chaosDone := make(chan struct{})
	chaosCtx, stopChaos := context.WithCancel(context.Background())
	if cfg.simulate {
		sim = newSimulator(c)
		if cfg.chaos {
			sim.crashShare = 0 // the chaos kills the producer once, at a time of its choosing
		}
		sim.start()
	}
	if cfg.chaos {
		go func() { runChaos(chaosCtx, c, sim, cfg, logf); close(chaosDone) }()
	} else {
		close(chaosDone)
	}
	stopSim := func() {
		stopChaos()
		<-chaosDone // every fault undone
		if sim != nil {
			sim.stop()
		}
	}
	defer stopSim()

	header := func() []string {
		var lines []string
		if tty {
			lines = slices.Clone(startup[:len(startup)-1])
		} else {
			lines = []string{fmt.Sprintf("devcluster: %d nodes, heartbeat %s, dir %s (daemon logs: node<i>.log)", cfg.nodes, cfg.resyncInterval, dir)}
			if a := c.nodes[0].ingressAddr(); a != "" {
				lines = append(lines, "ingress: http://"+a+"/v1/workloads/events (node1)")
			}
		}
		if sim != nil {
			lines = append(lines, sim.stats.String())
		}
		noteMu.Lock()
		lines = append(lines, notes...)
		noteMu.Unlock()
		if cfg.duration > 0 {
			return append(lines, fmt.Sprintf("ends after %s; Ctrl-C to stop sooner", cfg.duration))
		}
		return append(lines, "Ctrl-C to stop")
	}
	viewCtx, stopView := context.WithCancel(context.Background())
	v := &viewer{c: c, out: stdout, tty: tty, header: header, start: time.Now()}
	if f, ok := stdout.(*os.File); ok && tty {
		v.size = func() (int, int) { return terminalSize(f) }
	}
	viewDone := make(chan struct{})
	go func() { v.run(viewCtx); close(viewDone) }()
	endView := sync.OnceFunc(func() { stopView(); <-viewDone })
	defer endView()

	var timeout <-chan time.Time
	if cfg.duration > 0 {
		t := time.NewTimer(cfg.duration)
		defer t.Stop()
		timeout = t.C
	}
	failed := false
	sweep := time.NewTicker(sweepInterval(cfg.staleAfter))
	defer sweep.Stop()
	judge := time.NewTicker(judgeInterval)
	defer judge.Stop()
wait:
	for {
		select {
		case <-timeout:
			break wait
		case s := <-sigs:
			logf("%v: stopping (again to skip the convergence wait)", s)
			break wait
		case ev := <-c.unexpected:
			logf("%s (pid %d) exited on its own (%v): %s", ev.node.name, ev.pid, ev.err, logTail(ev.node.logPath, 3))
			failed = true
			break wait
		case <-sweep.C:
			c.sweep()
		case <-judge.C:
			c.judge()
		}
	}

	stopSim()
	deadline := 3*cfg.resyncInterval + 3*time.Second
	ok, why := awaitConvergence(c, deadline, sigs)
	endView()
	var deliveries []nodeDeliveries
	if cfg.metrics {
		deliveries = scrapeDeliveries(c) // while the daemons still run
	}
	if h.finished != nil {
		h.finished(c)
	}
	// The Jobs lists as they converged: once the daemons stop, each broker
	// sees the others leave discovery and fails their live jobs.
	final := c.views()
	c.judge()
	for _, problem := range c.stop() {
		fmt.Fprintf(stderr, "devcluster: %s\n", problem)
		failed = true
	}
	// The brokers saw every node leave discovery as the daemons stopped:
	// PAIR's store must agree on that too.
	c.judge()
	c.closeShadows()
	fmt.Fprintln(stdout)
	summary(stdout, final, deliveries, ok, why)
	if !brokerVerdict(stdout, c) {
		failed = true
	}
	if cfg.chaos && ok {
		if bad := intentVerdict(checkIntents(sim, final[0])); bad != "" {
			fmt.Fprintf(stdout, "as meant: no (%s)\n", bad)
			failed = true
		} else {
			fmt.Fprintln(stdout, "as meant: yes (every job in the state its producer or broker last meant; a lease-expired job failed)")
		}
	}
	noteMu.Lock()
	if tty && len(notes) > 0 {
		fmt.Fprintln(stdout, "last notes:\n  "+strings.Join(notes, "\n  "))
	}
	noteMu.Unlock()
	if failed || !ok {
		return 1
	}
	return 0
}

// defaultStaleAfter is PAIR's broker's staleness budget: a live workload of
// another node that its origin has not re-asserted for this long is failed
// by inference (the budget PAIR's workloadstore staleness tests use).
const defaultStaleAfter = 5 * time.Minute

// sweepInterval is how often the brokers sweep: PAIR's broker runs its
// staleness sweep (StaleForeign, then ApplyInferredUnchangedSince) every
// 60 s with a budget of 5 minutes, a fifth of it; a shorter demo budget
// keeps that ratio, down to 100 ms.
func sweepInterval(staleAfter time.Duration) time.Duration {
	return max(staleAfter/5, 100*time.Millisecond)
}

// judgeInterval is how often the brokers' Jobs lists are compared with
// PAIR's store beside them, while the run goes on.
const judgeInterval = 500 * time.Millisecond

// buildShadow builds PAIR's store program (internal/dev/pairshadow) into
// outDir, from the ../shared found from the module root (else from the
// working directory). Without one it says so in one line and returns "":
// the run goes on, its Jobs lists the model's alone.
func buildShadow(stdout io.Writer, outDir string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		root = "."
	}
	mod, err := pairshadow.Find(root)
	if errors.Is(err, pairshadow.ErrNotFound) {
		fmt.Fprintf(stdout, "devcluster: no shadow of PAIR's broker store: %v\n", err)
		return "", nil
	}
	if err != nil {
		return "", err
	}
	fmt.Fprintf(stdout, "devcluster: every broker's Jobs list is judged by PAIR's store from %s\n", mod)
	return pairshadow.Build(mod, outDir)
}

// brokerVerdict prints whether the brokers' side of the run held: every
// Jobs list as PAIR's store had it, no broker's reader stopped by a line.
// It reports false when it did not.
func brokerVerdict(w io.Writer, c *cluster) bool {
	problems := c.brokerProblems()
	switch {
	case len(problems) > 0:
		fmt.Fprintf(w, "as PAIR's broker: no (%d problems)\n", len(problems))
		for _, p := range problems[:min(len(problems), 10)] {
			fmt.Fprintln(w, "  "+p)
		}
		return false
	case c.shadowed():
		fmt.Fprintln(w, "as PAIR's broker: yes (every broker's Jobs list was PAIR's own store's at every check; no daemon line stopped a reader)")
	}
	return true
}

// awaitConvergence waits, until deadline or a signal, for every node to
// hold the same (origin, id, state) set on two polls in a row.
func awaitConvergence(c *cluster, deadline time.Duration, sigs <-chan os.Signal) (bool, string) {
	end := time.NewTimer(deadline)
	defer end.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	streak := 0
	var why string
	var nextSweep time.Time
	for {
		// The brokers go on sweeping while the views settle, as PAIR's do,
		// at their cadence: the verdict is on what a user would see.
		if now := time.Now(); !now.Before(nextSweep) {
			c.sweep()
			nextSweep = now.Add(sweepInterval(c.cfg.staleAfter))
		}
		var ok bool
		ok, why = converged(c.views())
		if ok {
			streak++
		} else {
			streak = 0
		}
		if streak >= 2 {
			return true, ""
		}
		select {
		case <-end.C:
			return false, why + fmt.Sprintf("; not converged within %s", deadline)
		case <-sigs:
			return false, why + "; convergence wait skipped"
		case <-tick.C:
		}
	}
}

// workDir creates the working directory and returns a cleanup that removes
// it unless it was given or --keep was, and says what it did.
func workDir(cfg config) (string, func() string, error) {
	if cfg.dir != "" {
		dir, err := filepath.Abs(cfg.dir)
		if err != nil {
			return "", nil, err
		}
		if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
			return "", nil, fmt.Errorf("--dir %s is not empty", dir)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", nil, err
		}
		return dir, func() string { return "devcluster: kept " + dir }, nil
	}
	dir, err := os.MkdirTemp("", "devcluster-")
	if err != nil {
		return "", nil, err
	}
	if cfg.keep {
		return dir, func() string { return "devcluster: kept " + dir }, nil
	}
	return dir, func() string {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Sprintf("devcluster: remove %s: %v", dir, err)
		}
		return ""
	}, nil
}

// moduleRoot finds the daemon's module: from this file's location when the
// source is at hand (go run, go test), else from `go env GOMOD`.
func moduleRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
		if isDaemonModule(root) {
			return root, nil
		}
	}
	goBin, err := goTool()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	if gomod := strings.TrimSpace(string(out)); gomod != "" && gomod != os.DevNull {
		if root := filepath.Dir(gomod); isDaemonModule(root) {
			return root, nil
		}
	}
	return "", errors.New("cannot find the nvpair-workload-manager module: run from its source tree")
}

func isDaemonModule(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "module" {
			return f[1] == "nvpair-workload-manager"
		}
	}
	return false
}

func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return "", errors.New("the go command is not on PATH")
}

// buildDaemon runs `go build` in the module root, with flags, and returns
// the binary.
func buildDaemon(root, outDir string, flags ...string) (string, error) {
	goBin, err := goTool()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(outDir, "nvpair-workload-manager")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	cmd := exec.Command(goBin, append(append([]string{"build", "-o", bin}, flags...), ".")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build in %s: %v\n%s", root, err, out)
	}
	return bin, nil
}
