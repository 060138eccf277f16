package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
)

// daemonBin is the daemon, built once for every test by the same code the
// devcluster uses when no --bin is given, into testTmp, which TestMain
// removes at the end. shadowBin is PAIR's store program, built there too,
// which judges the brokers of every test cluster; "" without ../shared.
var daemonBin, testTmp, shadowBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		tmp, err := os.MkdirTemp("", "devcluster-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(tmp)
		testTmp = tmp
		flag.Parse() // for testing.Short
		// Under -short every test that needs a daemon skips (needsDaemons),
		// so none is built, nor PAIR's store: the paper clusters' tests
		// then run unjudged by it, as they do without ../shared.
		if testing.Short() {
			return m.Run()
		}
		root, err := moduleRoot()
		if err != nil {
			fmt.Fprintln(os.Stderr, "module root:", err)
			return 1
		}
		// Under -race the daemons are built with it too, and a race they
		// hit makes them exit non-zero, which fails the run.
		var flags []string
		if raceEnabled {
			flags = append(flags, "-race")
		}
		if daemonBin, err = buildDaemon(root, tmp, flags...); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if shadowBin, err = buildShadow(os.Stderr, tmp); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}())
}

// needsDaemons skips t under go test -short, the quick lane: t starts
// daemons or builds a program, seconds each, and TestMain built none.
func needsDaemons(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts daemons or builds a program (seconds each); the full run has it")
	}
}

// waitTimeout bounds every wait on a condition in these tests.
const waitTimeout = 20 * time.Second

// eventually waits until cond holds or fails the test after waitTimeout.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", waitTimeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lockedBuffer is an io.Writer several goroutines may write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// origins returns the set of origins a node's store holds jobs from.
func origins(jobs []job) map[string]int {
	m := map[string]int{}
	for _, j := range jobs {
		m[j.Origin]++
	}
	return m
}

func TestDevclusterSimulateConvergesAndShowsBothPaths(t *testing.T) {
	needsDaemons(t) // runs the dev cluster on daemonBin
	t.Parallel()
	var stdout, stderr lockedBuffer
	var c *cluster
	var final []nodeView
	code := run([]string{"--bin", daemonBin, "--simulate", "--duration", "4s", "--nodes", "3", "--ingress", "127.0.0.1:0"},
		&stdout, &stderr, nil, false, hooks{
			created:  func(x *cluster) { c = x },
			finished: func(x *cluster) { final = x.views() },
		})
	out := stdout.String()
	if code != 0 {
		t.Fatalf("exit status %d, want 0\nstdout tail:\n%s\nstderr:\n%s", code, tail(out, 30), stderr.String())
	}
	if !strings.Contains(out, "converged: yes") {
		t.Errorf("the summary does not say the views converged:\n%s", tail(out, 30))
	}
	if strings.Contains(stderr.String(), "killed") || strings.Contains(stderr.String(), "exited with") {
		t.Errorf("a daemon did not end cleanly on its closed stdin:\n%s", stderr.String())
	}
	if strings.Contains(out, "\x1b") {
		t.Error("stdout is not a terminal, yet the output carries escape codes")
	}
	if len(final) != 3 {
		t.Fatalf("final views of %d nodes, want 3", len(final))
	}
	ingressOrigin := c.nodes[0].id // the ingress stamps node 1's id; node 1 has no broker traffic
	for _, v := range final {
		o := origins(v.jobs)
		if o[ingressOrigin] == 0 {
			t.Errorf("%s holds no job reported through node 1's ingress: %v", v.name, o)
		}
		for _, n := range c.nodes[1:] {
			if o[n.id] == 0 {
				t.Errorf("%s holds no job entered through %s's broker: %v", v.name, n.name, o)
			}
		}
		// each node's summary section lists its jobs
		if !strings.Contains(out, fmt.Sprintf("%s (%s, node id %s): %d jobs", v.name, v.short, v.id, len(v.jobs))) {
			t.Errorf("the summary has no section for %s with %d jobs", v.name, len(v.jobs))
		}
	}
	assertExited(t, c.allPIDs())
	if _, err := os.Stat(filepath.Dir(c.nodes[0].appDir)); !os.IsNotExist(err) {
		t.Errorf("the temporary working directory is still there (%v); it must be removed without --keep", err)
	}
}

// testCluster starts a cluster of n nodes the way run does, with a fast
// heartbeat, and stops it (checking every child exited) when the test ends.
func testCluster(t *testing.T, n int, resync time.Duration) *cluster {
	t.Helper()
	return testClusterWith(t, n, resync, false, nil)
}

// testClusterWith is testCluster with --metrics on or off and a hook that
// may set the nodes up before the first start.
func testClusterWith(t *testing.T, n int, resync time.Duration, metrics bool, before func(*cluster)) *cluster {
	t.Helper()
	needsDaemons(t)
	dir := t.TempDir()
	members, err := devpki.WriteCluster(dir, n)
	if err != nil {
		t.Fatal(err)
	}
	var notes lockedBuffer
	c := newCluster(clusterConfig{bin: daemonBin, ingress: "127.0.0.1:0", metrics: metrics, resyncInterval: resync,
		logf: func(f string, a ...any) { fmt.Fprintf(&notes, f+"\n", a...) }, shadowBin: shadowBin}, members, dir)
	if before != nil {
		before(c)
	}
	t.Cleanup(func() {
		for _, problem := range c.stop() {
			t.Error(problem)
		}
		judgeAtTheEnd(t, c)
		assertExited(t, c.allPIDs())
		if t.Failed() {
			t.Logf("devcluster notes:\n%s", notes.String())
			for _, n := range c.nodes {
				b, _ := os.ReadFile(n.logPath)
				t.Logf("%s log:\n%s", n.name, tail(string(b), 25))
			}
		}
	})
	if err := c.startAll(); err != nil {
		t.Fatal(err)
	}
	return c
}

// judgeAtTheEnd compares every broker's Jobs list with PAIR's store a last
// time, closes the shadows and fails the test for each problem of the
// brokers' side: a disagreement (naming the node and the job), a reader a
// daemon's line stopped.
func judgeAtTheEnd(t *testing.T, c *cluster) {
	t.Helper()
	c.judge()
	c.closeShadows()
	for _, p := range c.brokerProblems() {
		t.Error(p)
	}
}

// probe is a workload the test enters through a node's broker path.
func probe(n *node, id, state string, seq int) (string, json.RawMessage) {
	now := time.Now().UnixMilli()
	info := workloadInfo{ID: id, Model: "probe-model", Engine: "probe-engine", State: state,
		OriginatedFrom: n.id, ScheduledOn: n.id, Seq: seq, CreatedAt: now, RequesterID: "e2e"}
	if state != "queued" {
		info.StartedAt = &now
	}
	if state == "completed" {
		info.CompletedAt = &now
	}
	raw, _ := json.Marshal(info)
	return lifecycleMethod(state), raw
}

func enter(t *testing.T, n *node, id, state string, seq int) {
	t.Helper()
	method, raw := probe(n, id, state, seq)
	if err := n.broker.local(method, raw); err != nil {
		t.Fatal(err)
	}
}

// holds reports whether every node in ns holds (origin, id) in state.
func holds(ns []*node, origin, id, state string) bool {
	for _, n := range ns {
		if j, ok := n.broker.get(origin, id); !ok || j.State != state {
			return false
		}
	}
	return true
}

func TestDevclusterHealsAKilledAndRestartedNode(t *testing.T) {
	t.Parallel()
	const resync = time.Second
	c := testCluster(t, 3, resync)
	sim := newSimulator(c)
	sim.start()
	t.Cleanup(sim.stop)
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	all := c.nodes

	// Before the kill: traffic of every path reaches node 2, and two of
	// node 2's own workloads, one finished and one running, reach everyone.
	eventually(t, "node 2 to hold jobs of all three origins", func() bool {
		o := origins(n2.broker.snapshot())
		return o[n1.id] > 0 && o[n2.id] > 0 && o[n3.id] > 0
	})
	enter(t, n2, "probe-done", "queued", 1)
	enter(t, n2, "probe-done", "completed", 2)
	enter(t, n2, "probe-live", "running", 1)
	eventually(t, "node 2's probes to reach every node", func() bool {
		return holds(all, n2.id, "probe-done", "completed") && holds(all, n2.id, "probe-live", "running")
	})

	// Removals are never repaired (spec.md 5): none may be in
	// flight when node 2 dies, nor be made while it is down or rejoining.
	sim.holdRemovals()
	eventually(t, "every removal so far to have reached every node", func() bool {
		for _, k := range sim.removedJobs() {
			for _, n := range all {
				if _, ok := n.broker.get(k.origin, k.id); ok {
					return false
				}
			}
		}
		return true
	})
	if err := c.kill(n2); err != nil {
		t.Fatal(err)
	}
	if n2.isUp() {
		t.Fatal("node 2 is still up after the kill")
	}
	// While it is down its broker goes on: the running probe finishes. No
	// daemon can carry that; only the replay after the restart can.
	enter(t, n2, "probe-live", "completed", 2)
	if holds([]*node{n1, n3}, n2.id, "probe-live", "completed") {
		t.Fatal("the peers learnt of an event entered while node 2's daemon was dead")
	}
	// And node 2 misses traffic: node 1 gets an ingress event node 2 lacks.
	eventually(t, "node 1 to hold an ingress event node 2 missed", func() bool {
		missed := viewSet(n2.broker.snapshot())
		for _, j := range n1.broker.snapshot() {
			if j.Origin == n1.id && !missed[viewKey{j.Origin, j.ID, j.State}] {
				return true
			}
		}
		return false
	})

	if err := c.start(n2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the replay to bring node 2's finished probe to every node", func() bool {
		return holds(all, n2.id, "probe-live", "completed")
	})
	enter(t, n2, "probe-after", "running", 1)
	eventually(t, "a job entered through the restarted node's broker to reach every node", func() bool {
		return holds(all, n2.id, "probe-after", "running")
	})

	sim.stop()
	deadline := 3*resync + 3*time.Second
	if ok, why := awaitConvergence(c, deadline, nil); !ok {
		t.Fatalf("the views did not converge after the restart: %s", why)
	}
	if !holds(all, n2.id, "probe-done", "completed") {
		t.Error("node 2's workload finished before the kill is missing from a view")
	}
}

func TestDevclusterStopsEveryDaemonWhenOneFailsToStart(t *testing.T) {
	needsDaemons(t) // runs the dev cluster on daemonBin
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0") // node 1's ingress port, taken
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stdout, stderr lockedBuffer
	var c *cluster
	code := run([]string{"--bin", daemonBin, "--nodes", "3", "--ingress", ln.Addr().String(), "--duration", "1s"},
		&stdout, &stderr, nil, false, hooks{created: func(x *cluster) { c = x }})
	if code != 1 {
		t.Fatalf("exit status %d, want 1\nstderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), ln.Addr().String()) {
		t.Errorf("the error does not name the taken ingress address %s:\n%s", ln.Addr(), stderr.String())
	}
	if len(c.allPIDs()) < 3 {
		t.Errorf("started %d daemons, want at least 3 (the failing one and its peers)", len(c.allPIDs()))
	}
	assertExited(t, c.allPIDs())
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func TestDevclusterFailsWhenADaemonDiesOnItsOwn(t *testing.T) {
	needsDaemons(t) // runs the dev cluster on daemonBin
	t.Parallel()
	var stdout, stderr lockedBuffer
	var c *cluster
	crashed := make(chan int, 1)
	code := run([]string{"--bin", daemonBin, "--simulate", "--duration", "60s", "--ingress", "127.0.0.1:0", "--resync-interval", "1s"},
		&stdout, &stderr, nil, false, hooks{created: func(x *cluster) {
			c = x
			go func() {
				// Once every node is up, node 2 dies without the devcluster asking.
				for deadline := time.Now().Add(waitTimeout); !c.allUp(); time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						crashed <- 0
						return
					}
				}
				p := c.nodes[1].current()
				p.cmd.Process.Kill()
				crashed <- p.pid
			}()
		}})
	if code != 1 {
		t.Fatalf("exit status %d, want 1 after a daemon died\nstderr:\n%s", code, stderr.String())
	}
	pid := <-crashed
	if !strings.Contains(stderr.String(), fmt.Sprintf("node2 (pid %d) exited on its own", pid)) {
		t.Errorf("stderr does not report node 2's death:\n%s", stderr.String())
	}
	assertExited(t, c.allPIDs())
}

func TestProducerExampleJobReachesEveryNode(t *testing.T) {
	t.Parallel()
	producer := buildProducerExample(t)
	c := testCluster(t, 3, time.Second)
	out, err := exec.Command(producer, "--addr", c.nodes[0].ingressAddr(), "--id", "example-job", "--work", "0").CombinedOutput()
	if err != nil {
		t.Fatalf("the producer failed against node 1's ingress: %v\n%s", err, out)
	}
	eventually(t, "the example's job to be completed on every node", func() bool {
		return holds(c.nodes, c.nodes[0].id, "example-job", "completed")
	})
}

func TestDevclusterMetricsSummaryShowsEveryPeersDeliveriesOnEveryNode(t *testing.T) {
	needsDaemons(t) // runs the dev cluster on daemonBin
	t.Parallel()
	var stdout, stderr lockedBuffer
	var c *cluster
	code := run([]string{"--bin", daemonBin, "--simulate", "--duration", "4s", "--nodes", "3", "--ingress", "127.0.0.1:0", "--metrics"},
		&stdout, &stderr, nil, false, hooks{created: func(x *cluster) { c = x }})
	out := stdout.String()
	if code != 0 {
		t.Fatalf("exit status %d, want 0\nstdout tail:\n%s\nstderr:\n%s", code, tail(out, 30), stderr.String())
	}
	if !strings.Contains(out, "converged: yes") {
		t.Errorf("the summary does not say the views converged:\n%s", tail(out, 30))
	}
	seen := map[string]bool{}
	for _, n := range c.nodes {
		addr := n.metricsAddr()
		if addr == "" || seen[addr] || addr == c.nodes[0].ingressAddr() {
			t.Fatalf("%s's metrics address %q is empty or not its own", n.name, addr)
		}
		seen[addr] = true
		if !regexp.MustCompile(`(?m)^devcluster: ` + n.name + ` metrics http://` + regexp.QuoteMeta(addr) + `/metrics$`).MatchString(out) {
			t.Errorf("no startup line of %s holds its metrics URL http://%s/metrics alone:\n%s", n.name, addr, head(out, 12))
		}
	}
	tables, urls := deliveryTables(out)
	if len(tables) != len(c.nodes) {
		t.Fatalf("the summary has delivery tables for %d nodes, want %d:\n%s", len(tables), len(c.nodes), tail(out, 30))
	}
	for _, n := range c.nodes {
		if urls[n.short] != n.metricsAddr() {
			t.Errorf("%s's table names %q, want its metrics address %s", n.name, urls[n.short], n.metricsAddr())
		}
		rows := tables[n.short]
		if len(rows) != len(c.nodes)-1 {
			t.Errorf("%s's table has %d peer rows, want one per other node: %v", n.name, len(rows), rows)
		}
		for _, peer := range c.nodes {
			if peer == n {
				continue
			}
			row, ok := rows[peer.short]
			if !ok {
				t.Errorf("%s's table has no row for %s: %v", n.name, peer.short, rows)
				continue
			}
			if len(row) != len(deliveryFamilies) {
				t.Errorf("%s's row for %s has %d counters, want %d: %v", n.name, peer.short, len(row), len(deliveryFamilies), row)
				continue
			}
			for i, cell := range row {
				if _, err := strconv.ParseUint(cell, 10, 64); err != nil {
					t.Errorf("%s's %s for %s is %q, not a count", n.name, deliveryFamilies[i].column, peer.short, cell)
				}
			}
			if succeeded, _ := strconv.ParseUint(row[0], 10, 64); succeeded == 0 {
				t.Errorf("%s delivered nothing to %s in a simulated run: %v", n.name, peer.short, row)
			}
		}
	}
	assertExited(t, c.allPIDs())
}

func TestDevclusterLearnsEachPortFromTheDaemonAndKeepsItAcrossARestart(t *testing.T) {
	t.Parallel()
	c := testClusterWith(t, 1, time.Second, true, nil)
	n := c.nodes[0]
	port, ingress, metrics := n.peerPort(), n.ingressAddr(), n.metricsAddr()
	for _, addr := range []string{"127.0.0.1:" + strconv.Itoa(port), ingress, metrics} {
		if _, p, err := net.SplitHostPort(addr); err != nil || p == "0" || p == "" {
			t.Fatalf("learned address %q, want a bound HOST:PORT (peer %d, ingress %q, metrics %q)", addr, port, ingress, metrics)
		}
	}
	// The first start asked for port 0 everywhere: the daemon chose.
	log, _ := os.ReadFile(n.logPath)
	peerLogged := regexp.MustCompile(`(?m)peerAddr=\S*:` + strconv.Itoa(port) + `( |$)`)
	if !peerLogged.Match(log) || !strings.Contains(string(log), "addr="+metrics) {
		t.Fatalf("the learned ports are not the ones the daemon logged:\n%s", log)
	}
	client := &http.Client{Timeout: scrapeTimeout}
	defer client.CloseIdleConnections()
	if _, err := scrapePeerCounters(client, metrics); err != nil {
		t.Fatalf("scrape the learned %s: %v", metrics, err)
	}

	if err := c.kill(n); err != nil {
		t.Fatal(err)
	}
	if err := c.start(n); err != nil {
		t.Fatal(err)
	}
	if p, i, m := n.peerPort(), n.ingressAddr(), n.metricsAddr(); p != port || i != ingress || m != metrics {
		t.Errorf("after a restart: peer %d, ingress %s, metrics %s; want the kept %d, %s, %s", p, i, m, port, ingress, metrics)
	}
	if _, err := scrapePeerCounters(client, metrics); err != nil {
		t.Errorf("scrape %s after the restart: %v", metrics, err)
	}
}

// deliveryTables reads the summary's peer deliveries section: per node (n1,
// ...) its rows, peer -> counters in column order, and its metrics address.
func deliveryTables(out string) (map[string]map[string][]string, map[string]string) {
	heading := regexp.MustCompile(`^node\d+ \((n\d+)\) http://(\S+)/metrics$`)
	tables, urls := map[string]map[string][]string{}, map[string]string{}
	in, current := false, ""
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "peer deliveries ("):
			in = true
		case !in:
		case strings.HasPrefix(line, "converged: "):
			return tables, urls
		case heading.MatchString(line):
			m := heading.FindStringSubmatch(line)
			current, urls[m[1]] = m[1], m[2]
			tables[current] = map[string][]string{}
		case current != "" && strings.HasPrefix(line, "  "):
			if f := strings.Fields(line); len(f) > 0 && f[0] != "PEER" {
				tables[current][f[0]] = f[1:]
			}
		}
	}
	return tables, urls
}

func head(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// TestDevclusterOnATerminalKeepsTheStartupLinesAboveTheView: a redraw in
// place starts at the top of the screen, so it prints the startup lines
// (each daemon's pid, node id, peer port and log) again above the view,
// with how the rows are sorted.
func TestDevclusterOnATerminalKeepsTheStartupLinesAboveTheView(t *testing.T) {
	needsDaemons(t) // runs the dev cluster on daemonBin
	t.Parallel()
	var stdout, stderr lockedBuffer
	code := run([]string{"--bin", daemonBin, "--duration", "1s", "--nodes", "2", "--ingress", "127.0.0.1:0"},
		&stdout, &stderr, nil, true, hooks{})
	out := stdout.String()
	if code != 0 {
		t.Fatalf("exit status %d, want 0\nstderr:\n%s", code, stderr.String())
	}
	clear := strings.LastIndex(out, "\x1b[2J")
	redraw := strings.LastIndex(out, "\x1b[H")
	if clear < 0 || redraw < clear {
		t.Fatalf("no redraw in place after the screen was cleared:\n%q", tail(out, 10))
	}
	last := out[redraw:]
	last = last[:strings.Index(last, "\x1b[J")]
	for _, want := range []string{"devcluster: node1 pid ", "devcluster: node2 pid ", " log ", "ingress http://127.0.0.1:", sortNote} {
		if !strings.Contains(last, want) {
			t.Errorf("the last redraw lacks %q:\n%s", want, last)
		}
	}
}

// buildProducerExample builds examples/producer (a module of its own, which
// takes the client from clients/go by a replace) into a temporary directory
// and returns the binary's path.
func buildProducerExample(t *testing.T) string {
	t.Helper()
	return buildModuleProgram(t, filepath.Join("examples", "producer"), ".", "producer")
}

// buildModuleProgram builds the package pkg of the module in dir (relative
// to this module's root) into a temporary directory as name and returns
// the binary's path.
func buildModuleProgram(t *testing.T, dir, pkg, name string) string {
	t.Helper()
	needsDaemons(t)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	goBin, err := goTool()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), name)
	build := exec.Command(goBin, "build", "-o", bin, pkg)
	build.Dir = filepath.Join(root, dir)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s (%s): %v\n%s", name, dir, err, out)
	}
	return bin
}
