package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/pairbroker"
	"nvpair-workload-manager/internal/dev/pairshadow"
)

// Timeouts of the process management.
const (
	readyTimeout = 20 * time.Second // from start to the daemon's discovery:subscribe
	killTimeout  = 5 * time.Second  // from a kill the devcluster itself makes (a crash it injects) to the exit
)

// clusterConfig is what a cluster needs to run its daemons.
type clusterConfig struct {
	bin            string // the daemon's binary
	stockBin       string // the stock daemon's binary, for the stock nodes
	stock          int    // how many nodes, the last ones, run the stock daemon
	ingress        string // node 1's --local-ingress; port 0 lets the daemon pick one
	metrics        bool   // give every daemon a --metrics endpoint on a loopback port it picks
	resyncInterval time.Duration
	staleAfter     time.Duration // the brokers' staleness budget (pairbroker.Store.SweepStale); 0: no sweep
	logLevel       string
	logf           func(format string, args ...any) // devcluster's notes (never nil)
	// shadowBin is PAIR's store program (internal/dev/pairshadow), which
	// judges every broker's Jobs list; "" when ../shared has none.
	shadowBin string
	// holdDiscovery gives each daemon a snapshot of itself alone until
	// releaseDiscovery, which pushes the whole directory to every node at
	// once: the one snapshot of issue 37 that makes every node dial every
	// other, so the scale benchmark times the mesh from one instant.
	holdDiscovery bool
	// readyTimeout is start's wait for discovery:subscribe (readyTimeout
	// when 0): 128 daemons starting at once on 2 cores need longer.
	readyTimeout time.Duration
}

// node is one member: its files, its ports, its broker and its current
// daemon process.
type node struct {
	idx        int // 1-based
	name       string
	short      string
	id         string
	appDir     string
	clusterDir string
	logPath    string
	broker     *broker
	stock      bool // the node runs the stock workload manager (stock.go)

	mu          sync.Mutex // guards the fields below
	port        int        // the inter-node port the daemon bound, kept across restarts; 0 before the first start
	ingress     string     // node 1's ingress address as bound, kept across restarts; "" on others
	wantIngress string     // as configured; port 0 lets the daemon pick one
	wantMetrics bool       // the daemon gets a --metrics endpoint
	extraArgs   []string   // further daemon flags, given at every start (tests set them before the first)
	metrics     string     // the --metrics address as bound, kept across restarts; "" without --metrics
	proc        *process   // the current daemon; nil before the first start
	up          bool       // the daemon subscribed and has not exited
}

// process is one run of a daemon.
type process struct {
	cmd        *exec.Cmd
	pid        int
	logFrom    int64         // the log's size when it started: its own lines follow
	subscribed chan struct{} // closed on discovery:subscribe
	done       chan struct{} // closed when the process was waited for
	err        error         // the Wait result, set before done is closed
	expected   sync.Once     // guards markExpected
	expectedCh chan struct{} // closed when the devcluster stops or kills it itself
	startErr   error         // why start gave up on it, set before it is killed
}

func (p *process) markExpected() { p.expected.Do(func() { close(p.expectedCh) }) }

func (p *process) isExpected() bool {
	select {
	case <-p.expectedCh:
		return true
	default:
		return false
	}
}

// exitEvent reports a daemon that exited without being asked to.
type exitEvent struct {
	node *node
	pid  int
	err  error
}

// cluster runs N daemons, each with its broker.
type cluster struct {
	cfg   clusterConfig
	nodes []*node

	discMu sync.Mutex // serializes directory changes and their pushes; taken before any broker lock

	pidMu sync.Mutex
	pids  []int // every daemon process ever started

	unexpected chan exitEvent // buffered; a daemon that died on its own

	// links, under --chaos, carries every node's traffic to every other
	// node (chaosnet.go); nil otherwise. Set before the first start.
	links *linkNet

	// pickPort picks a stock node's port (stock.go's pickPort when nil); a
	// test makes it race another process.
	pickPort func() (int, error)

	// released is set by releaseDiscovery (clusterConfig.holdDiscovery).
	released atomic.Bool

	// stopping is set once the whole cluster stops: its daemons' exits
	// are no node losses to tell the brokers of.
	stopping atomic.Bool

	// shadowProblems are the shadows that could not start or failed to
	// stop; set by newCluster and closeShadows.
	shadowProblems []string
	shadowsClosed  sync.Once
}

func newCluster(cfg clusterConfig, members []devpki.Node, logDir string) *cluster {
	c := &cluster{cfg: cfg, unexpected: make(chan exitEvent, 64)}
	for i, m := range members {
		n := &node{
			idx:        i + 1,
			name:       fmt.Sprintf("node%d", i+1),
			short:      fmt.Sprintf("n%d", i+1),
			id:         m.ID,
			appDir:     m.AppDir,
			clusterDir: m.ClusterDir,
			logPath:    filepath.Join(logDir, fmt.Sprintf("node%d.log", i+1)),
		}
		n.broker = newBrokerAt(m.ID, n.name, cfg.staleAfter, nil, c.startShadow(n.name))
		n.stock = i >= len(members)-cfg.stock
		n.broker.logf = cfg.logf
		if i == 0 {
			n.wantIngress = cfg.ingress
		}
		n.wantMetrics = cfg.metrics && !n.stock // the stock daemon has no metrics endpoint
		c.nodes = append(c.nodes, n)
	}
	return c
}

// startAll starts every daemon at once and waits until each has subscribed.
// On an error every daemon started is stopped again.
func (c *cluster) startAll() error {
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() { errs[i] = c.start(n) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.stop()
		return err
	}
	return nil
}

// start starts n's daemon and waits until it subscribed to discovery.
// The first start binds port 0 for each listener (and node 1's ingress at
// --ingress, whose port may be 0) and learns the ports from the daemon's
// startup lines; every restart asks for the same ports, so the peers'
// discovery entries and the producers' address stay valid. Nothing picks a
// port by opening and closing it, which another process could take first.
func (c *cluster) start(n *node) error {
	if n.stock {
		return c.startStock(n)
	}
	p, err := c.launch(n)
	if err != nil {
		return err
	}
	return c.awaitSubscribed(n, p)
}

// learnPorts reads the startup lines p wrote to n's log (spec 3.8: started
// peerAddr, local ingress listening addr, metrics endpoint listening addr)
// and keeps the bound addresses. The daemon writes them before its ready
// frame, and its log is a file it writes synchronously, so once the broker
// has read discovery:subscribe they are all there.
func (c *cluster) learnPorts(n *node, p *process) error {
	lines, err := logLinesFrom(n.logPath, p.logFrom)
	if err != nil {
		return err
	}
	peer, ingress, metrics := "", "", ""
	for _, l := range lines {
		switch {
		case logMsg(l) == "started":
			peer = logValue(l, "peerAddr")
		case logMsg(l) == "local ingress listening":
			ingress = logValue(l, "addr")
		case logMsg(l) == "metrics endpoint listening":
			metrics = logValue(l, "addr")
		}
	}
	_, portText, err := net.SplitHostPort(peer)
	port, perr := strconv.Atoi(portText)
	if err != nil || perr != nil || port == 0 {
		return fmt.Errorf("%s: no bound peer port in its log (its started line, logged at info): %s", n.name, logTail(n.logPath, 3))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.wantIngress != "" && ingress == "" || n.wantMetrics && metrics == "" {
		return fmt.Errorf("%s: no bound ingress or metrics address in its log: %s", n.name, logTail(n.logPath, 3))
	}
	n.port, n.ingress, n.metrics = port, ingress, metrics
	return nil
}

// logLinesFrom returns the lines of the log at path from offset on.
func logLinesFrom(path string, offset int64) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, err
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines, sc.Err()
}

// logMsg is the msg of a log line in slog's text format, unquoted.
func logMsg(line string) string { return logValue(line, "msg") }

// logValue is the value of key in a log line in slog's text format
// (key=value, the value quoted when it holds a space), or "".
func logValue(line, key string) string {
	i := strings.Index(" "+line, " "+key+"=")
	if i < 0 {
		return ""
	}
	rest := line[i+len(key)+1:]
	if strings.HasPrefix(rest, `"`) {
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return ""
		}
		v, _ := strconv.Unquote(q)
		return v
	}
	v, _, _ := strings.Cut(rest, " ")
	return v
}

func (n *node) args(c *cluster) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stock {
		// The stock daemon takes --port, --cluster-dir, --ipc and
		// --log-level, finds its app dir as the cluster dir's parent and
		// its heartbeat is fixed (30 s).
		return []string{"--port", strconv.Itoa(n.port), "--cluster-dir", n.clusterDir, "--log-level", "info"}
	}
	a := []string{
		"--port", strconv.Itoa(n.port),
		"--app-dir", n.appDir,
		"--cluster-dir", n.clusterDir,
		"--resync-interval", c.cfg.resyncInterval.String(),
	}
	// Always given, so $NVPAIR_LOG_LEVEL cannot hide the startup lines the
	// ports are learned from.
	level := c.cfg.logLevel
	if level == "" {
		level = "info"
	}
	a = append(a, "--log-level", level)
	switch {
	case n.ingress != "":
		a = append(a, "--local-ingress", n.ingress)
	case n.wantIngress != "":
		a = append(a, "--local-ingress", n.wantIngress)
	}
	switch {
	case n.metrics != "":
		a = append(a, "--metrics", n.metrics)
	case n.wantMetrics:
		a = append(a, "--metrics", "127.0.0.1:0")
	}
	return append(a, n.extraArgs...)
}

// launch starts one daemon process for n, its stderr appended to n's log.
func (c *cluster) launch(n *node) (*process, error) {
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy once started
	fmt.Fprintf(logf, "--- devcluster: starting %s at %s\n", n.name, time.Now().Format(time.RFC3339Nano))
	logFrom, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	bin := c.cfg.bin
	if n.stock {
		bin = c.cfg.stockBin
	}
	cmd := exec.Command(bin, n.args(c)...)
	cmd.Stderr = logf
	cmd.SysProcAttr = childProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stdin.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", n.name, bin, err)
	}
	p := &process{cmd: cmd, pid: cmd.Process.Pid, logFrom: logFrom, subscribed: make(chan struct{}),
		done: make(chan struct{}), expectedCh: make(chan struct{})}
	c.pidMu.Lock()
	c.pids = append(c.pids, p.pid)
	c.pidMu.Unlock()

	n.mu.Lock()
	n.proc = p
	n.mu.Unlock()
	if replayed, err := n.broker.attach(stdin); err != nil {
		c.cfg.logf("%s: replay: %v", n.name, err)
	} else if replayed > 0 {
		c.cfg.logf("%s: broker replayed %d workloads to the restarted daemon", n.name, replayed)
	}
	go c.supervise(n, p, stdout)
	return p, nil
}

// supervise runs n's broker on the daemon's stdout and, once it ends, waits
// for the process and takes the node out of the directory.
func (c *cluster) supervise(n *node, p *process, stdout io.Reader) {
	var once sync.Once
	err := n.broker.serve(stdout, nil, func() {
		once.Do(func() {
			learn := c.learnPorts
			if n.stock {
				learn = func(n *node, _ *process) error { return awaitStockListening(n) }
			}
			if err := learn(n, p); err != nil {
				p.startErr = err
				p.markExpected() // start reports it
				p.cmd.Process.Kill()
				return
			}
			c.nodeUp(n, p)
			close(p.subscribed)
		})
	})
	if err != nil {
		c.cfg.logf("%s: reading the daemon's stdout: %v", n.name, err)
	}
	p.err = p.cmd.Wait()
	c.nodeDown(n, p)
	close(p.done)
	// A daemon that dies before it subscribed is start's to report.
	subscribed := false
	select {
	case <-p.subscribed:
		subscribed = true
	default:
	}
	if subscribed && !p.isExpected() {
		select {
		case c.unexpected <- exitEvent{n, p.pid, p.err}:
		default:
		}
	}
}

// awaitSubscribed waits until p subscribed, or fails with the end of its
// log when it exits first or takes too long.
func (c *cluster) awaitSubscribed(n *node, p *process) error {
	wait := cmp.Or(c.cfg.readyTimeout, readyTimeout)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-p.subscribed:
		return nil
	case <-p.done:
		if p.startErr != nil {
			return p.startErr
		}
		return fmt.Errorf("%s exited at start (%v): %s", n.name, p.err, logTail(n.logPath, 3))
	case <-t.C:
		c.stopProcess(n, p)
		return fmt.Errorf("%s did not subscribe within %s: %s", n.name, wait, logTail(n.logPath, 3))
	}
}

// nodeUp is called when n's daemon subscribed: its broker pushes the
// directory (it replayed its store when the daemon started), then every
// other member learns of it.
func (c *cluster) nodeUp(n *node, p *process) {
	c.discMu.Lock()
	defer c.discMu.Unlock()
	n.mu.Lock()
	n.up = n.proc == p
	n.mu.Unlock()
	if err := n.broker.subscribed(c.directoryFor(n)); err != nil {
		c.cfg.logf("%s: %v", n.name, err)
	}
	if c.discoveryHeld() {
		return // releaseDiscovery tells every node of every other at once
	}
	c.pushLocked(n)
}

// discoveryHeld reports whether the directory is still held back
// (clusterConfig.holdDiscovery).
func (c *cluster) discoveryHeld() bool { return c.cfg.holdDiscovery && !c.released.Load() }

// releaseDiscovery pushes the whole directory to every node at once; a
// later call does nothing.
func (c *cluster) releaseDiscovery() {
	c.discMu.Lock()
	defer c.discMu.Unlock()
	if c.released.CompareAndSwap(false, true) {
		c.pushLocked(nil)
	}
}

// nodeDown takes n out of the directory once its daemon has exited.
func (c *cluster) nodeDown(n *node, p *process) {
	c.discMu.Lock()
	defer c.discMu.Unlock()
	n.mu.Lock()
	current := n.proc == p
	if current {
		n.up = false
	}
	n.mu.Unlock()
	if current {
		n.broker.detach()
	}
	if !c.stopping.Load() {
		c.pushLocked(n)
	}
}

// pushLocked sends the directory to every member but except, and notes what
// each broker failed by inference because a node left; called with discMu
// held.
func (c *cluster) pushLocked(except *node) {
	names := map[string]string{}
	for _, o := range c.nodes {
		names[o.id] = o.short
	}
	for _, o := range c.nodes {
		if o == except {
			continue
		}
		for _, j := range o.broker.discovery(c.directoryFor(o)) {
			c.cfg.logf("%s inferred %s/%s failed: its node left discovery", o.name, names[j.Origin], j.ID)
		}
	}
}

// directoryFor is the discovery:nodes snapshot node r gets: every member
// whose daemon is up, as the desktop's discovery would list it. devpki
// gives a node's certificate the node id as its principal, so hostUuid and
// clusterUuid are the same UUID. Under --chaos each peer's port is the
// port of r's own link to it (chaosnet.go), so the dev cluster can cut or
// slow that link.
func (c *cluster) directoryFor(r *node) json.RawMessage {
	type wl struct {
		Port int `json:"port"`
	}
	type entry struct {
		HostUUID    string        `json:"hostUuid"`
		Name        string        `json:"name"`
		IP          string        `json:"ip"`
		IPs         []string      `json:"ips"`
		ClusterUUID string        `json:"clusterUuid"`
		Trusted     bool          `json:"trusted"`
		Services    map[string]wl `json:"services"`
		LastSeen    int64         `json:"lastSeen"`
	}
	nodes := []entry{}
	listed := c.nodes
	if c.discoveryHeld() {
		listed = []*node{r} // itself alone until releaseDiscovery
	}
	for _, n := range listed {
		n.mu.Lock()
		up, port := n.up, n.port
		n.mu.Unlock()
		if !up {
			continue
		}
		if c.links != nil && n != r {
			port = c.links.port(r, n, port)
		}
		nodes = append(nodes, entry{HostUUID: n.id, Name: n.name, IP: "127.0.0.1", IPs: []string{"127.0.0.1"},
			ClusterUUID: n.id, Trusted: true, Services: map[string]wl{"wl": {port}}, LastSeen: time.Now().Unix()})
	}
	b, _ := json.Marshal(map[string]any{"nodes": nodes})
	return b
}

// isUp reports whether n's daemon is running and subscribed.
func (n *node) isUp() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.up
}

func (n *node) current() *process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc
}

// ingressAddr is node 1's ingress address ("" when it has none).
func (n *node) ingressAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ingress
}

// metricsAddr is the daemon's --metrics address ("" without --metrics).
func (n *node) metricsAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.metrics
}

func (n *node) peerPort() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.port
}

// startShadow starts PAIR's store for one broker, or returns nil when
// there is no program, or it does not start (a problem of the run).
func (c *cluster) startShadow(name string) *pairshadow.Shadow {
	if c.cfg.shadowBin == "" {
		return nil
	}
	sh, err := pairshadow.Start(c.cfg.shadowBin)
	if err != nil {
		c.shadowProblems = append(c.shadowProblems, fmt.Sprintf("%s: %v", name, err))
		return nil
	}
	return sh
}

// judge compares every broker's Jobs list with PAIR's store beside it, and
// notes each job they disagree on, the first time, naming the node.
func (c *cluster) judge() {
	for _, n := range c.nodes {
		for _, l := range n.broker.judge() {
			c.cfg.logf("%s: PAIR's store disagrees: %s", n.name, l)
		}
	}
}

// brokerProblems is everything that makes the brokers' side of the run
// fail: each disagreement with PAIR's store, naming the node and the job,
// a broker whose reader a daemon's line stopped, a shadow that failed.
func (c *cluster) brokerProblems() []string {
	out := slices.Clone(c.shadowProblems)
	for _, n := range c.nodes {
		for _, l := range n.broker.disagreements() {
			out = append(out, n.name+": "+l)
		}
		if why := n.broker.stopReason(); why != "" {
			out = append(out, why)
		}
	}
	return out
}

// closeShadows ends every broker's shadow, once the daemons are stopped;
// a later call does nothing.
func (c *cluster) closeShadows() {
	c.shadowsClosed.Do(func() {
		for _, n := range c.nodes {
			if err := n.broker.jobs.Close(); err != nil {
				c.shadowProblems = append(c.shadowProblems, fmt.Sprintf("%s: %v", n.name, err))
			}
		}
	})
}

// shadowed reports whether PAIR's store judges the brokers.
func (c *cluster) shadowed() bool { return c.cfg.shadowBin != "" }

// sweep runs every broker's staleness sweep and notes what it failed.
func (c *cluster) sweep() {
	names := map[string]string{}
	for _, o := range c.nodes {
		names[o.id] = o.short
	}
	for _, n := range c.nodes {
		for _, j := range n.broker.sweep() {
			c.cfg.logf("%s inferred %s/%s failed: not re-asserted for %s", n.name, names[j.Origin], j.ID, c.cfg.staleAfter)
		}
	}
}

// allUp reports whether every daemon is running.
func (c *cluster) allUp() bool {
	for _, n := range c.nodes {
		if !n.isUp() {
			return false
		}
	}
	return true
}

// kill ends n's daemon with SIGKILL (on Windows TerminateProcess) and waits
// for it: the crash the replay and the heartbeat must heal.
func (c *cluster) kill(n *node) error {
	p := n.current()
	if p == nil {
		return fmt.Errorf("%s was never started", n.name)
	}
	p.markExpected()
	p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("%s (pid %d) did not exit after a kill", n.name, p.pid)
	}
}

// stop ends every daemon with PAIR's broker's stop sequence (pairbroker.Stop:
// stdin closed, their shutdown signal; 3 s; terminate; 2 s; kill). It returns
// what went wrong: a daemon that needed more than its closed stdin, or that
// did not exit with status 0 (spec.md 3.1: stdin EOF is a clean
// shutdown).
func (c *cluster) stop() []string {
	c.stopping.Store(true)
	var problems []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		if p := n.current(); p != nil {
			wg.Go(func() {
				result, reported := c.stopProcess(n, p)
				var problem string
				switch {
				case reported:
				case result != pairbroker.ExitedOnEOF:
					problem = fmt.Sprintf("%s (pid %d) did not exit within %s of its closed stdin: %s", n.name, p.pid, pairbroker.StopGrace, result)
				case p.err != nil:
					problem = fmt.Sprintf("%s (pid %d) exited with %v: %s", n.name, p.pid, p.err, logTail(n.logPath, 3))
				}
				if problem != "" {
					mu.Lock()
					problems = append(problems, problem)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	slices.Sort(problems)
	return problems
}

// stopProcess runs the stop sequence on p. It reports how it ended, and
// whether p had ended before and its end was already reported (or was
// deliberate).
func (c *cluster) stopProcess(n *node, p *process) (pairbroker.StopResult, bool) {
	select {
	case <-p.done:
		return pairbroker.ExitedOnEOF, true
	default:
	}
	p.markExpected()
	closeStdin := func() error {
		n.mu.Lock()
		current := n.proc == p
		n.mu.Unlock()
		if current {
			n.broker.detach()
		}
		return nil
	}
	result := pairbroker.Stop(closeStdin, func() error { return terminate(p.cmd.Process) }, p.cmd.Process.Kill, p.done, pairbroker.StopGrace)
	if result != pairbroker.ExitedOnEOF {
		c.cfg.logf("%s (pid %d) did not exit within %s of its closed stdin: %s", n.name, p.pid, pairbroker.StopGrace, result)
	}
	return result, false
}

// allPIDs returns every daemon process id the cluster ever started.
func (c *cluster) allPIDs() []int {
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	return append([]int(nil), c.pids...)
}

// logTail returns the last n non-empty lines of a log, joined by " | ".
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log)"
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if s := strings.TrimSpace(sc.Text()); s != "" && !strings.HasPrefix(s, "--- devcluster:") {
			lines = append(lines, s)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 0 {
		return "(empty log " + path + ")"
	}
	return strings.Join(lines, " | ")
}
