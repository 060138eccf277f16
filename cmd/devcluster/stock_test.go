package main

import (
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/stockwlm"
)

var (
	stockOnce sync.Once
	stockBin  string
	stockErr  error
)

// stockBinary builds the stock workload manager once, or skips the test
// with one line when its source is not at hand.
func stockBinary(t *testing.T) string {
	t.Helper()
	needsDaemons(t)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	src, err := stockwlm.Find(root)
	if err != nil {
		t.Skipf("no stock workload manager to run: %v", err)
	}
	stockOnce.Do(func() { stockBin, stockErr = stockwlm.Build("", src, testTmp) })
	if stockErr != nil {
		t.Fatal(stockErr)
	}
	return stockBin
}

func TestParseFlagsRefusesAStockCountThatLeavesNoIngressNode(t *testing.T) {
	for _, args := range [][]string{{"--stock", "3"}, {"--stock", "-1"}, {"--nodes", "1", "--stock", "1"}, {"--stock-bin", "x"}} {
		if _, err := parseFlags(args, &lockedBuffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
	if c, err := parseFlags([]string{"--stock", "2"}, &lockedBuffer{}); err != nil || c.stock != 2 {
		t.Errorf("--stock 2 of 3: %+v, %v", c, err)
	}
}

func TestColumnTitleMarksAStockNode(t *testing.T) {
	if got := columnTitle(nodeView{name: "node3", short: "n3", up: true, stock: true}); got != "node3 (n3) up, stock, 0 jobs" {
		t.Errorf("title %q", got)
	}
}

// A mixed cluster: node 3 runs the stock workload manager; traffic of every
// path reaches every node and the views converge.
func TestDevclusterWithAStockNodeConverges(t *testing.T) {
	t.Parallel()
	bin := stockBinary(t)
	var stdout, stderr lockedBuffer
	var c *cluster
	var final []nodeView
	code := run([]string{"--bin", daemonBin, "--stock", "1", "--stock-bin", bin, "--simulate", "--duration", "5s",
		"--ingress", "127.0.0.1:0", "--resync-interval", "1s", "--stale-after", "6s"},
		&stdout, &stderr, nil, false, hooks{created: func(x *cluster) { c = x }, finished: func(x *cluster) { final = x.views() }})
	out := stdout.String()
	if code != 0 || !strings.Contains(out, "converged: yes") {
		t.Fatalf("exit %d\nstdout tail:\n%s\nstderr:\n%s", code, tail(out, 30), stderr.String())
	}
	if !c.nodes[2].stock || c.nodes[0].stock || !strings.Contains(out, "(stock workload manager)") || !strings.Contains(out, "node3 (n3) up, stock,") {
		t.Errorf("node 3 is not shown as the stock node:\n%s", head(out, 12))
	}
	for _, v := range final {
		if o := origins(v.jobs); o[c.nodes[2].id] == 0 || o[c.nodes[0].id] == 0 {
			t.Errorf("%s lacks the stock node's or node 1's jobs: %v", v.name, o)
		}
	}
	assertExited(t, c.allPIDs())
}

// The stock daemon cannot bind port 0: a first start whose port another
// process took is retried on another port.
func TestAStockNodeWhosePortIsTakenStartsOnAnother(t *testing.T) {
	t.Parallel()
	bin := stockBinary(t)
	var taken int
	c := testClusterWith(t, 2, time.Second, false, func(c *cluster) {
		c.cfg.stock, c.cfg.stockBin = 1, bin
		c.nodes[1].stock = true
		ln, port := holdPort(t)
		t.Cleanup(func() { ln.Close() })
		taken = port
		picks := 0
		c.pickPort = func() (int, error) { // the first pick races another process
			if picks++; picks == 1 {
				return port, nil
			}
			return pickPort()
		}
	})
	if p := c.nodes[1].peerPort(); p == taken || p == 0 {
		t.Fatalf("the stock node serves port %d, the taken one was %d", p, taken)
	}
}

// holdPort listens on a free port, as another process would.
func holdPort(t *testing.T) (interface{ Close() error }, int) {
	t.Helper()
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	return ln, ln.Addr().(*net.TCPAddr).Port
}

// A stock node's path moves a job on before a third of the staleness
// budget passes without a frame for it, and finishes its live jobs when the
// traffic stops: the stock daemon re-asserts them only every 30 s.
func TestAStockPathKeepsItsJobsFromGoingSilent(t *testing.T) {
	c := paperCluster(t, 2)
	c.cfg.staleAfter = 3 * time.Second
	n := c.nodes[1]
	n.stock = true
	s := newSimulator(c)
	p := &simPath{s: s, prefix: n.short, node: n, rng: rand.New(rand.NewPCG(1, 2))}
	s.paths = []*simPath{p}
	now := time.Now()
	fresh := &simJob{info: workloadInfo{ID: "n2-0001", Model: "m", Engine: "e", State: "running", OriginatedFrom: n.id, Seq: 2, CreatedAt: now.UnixMilli()}, sentAt: now}
	silent := &simJob{info: workloadInfo{ID: "n2-0002", Model: "m", Engine: "e", State: "queued", OriginatedFrom: n.id, Seq: 1, CreatedAt: now.UnixMilli()}, sentAt: now.Add(-time.Second)}
	p.jobs = []*simJob{fresh, silent}
	if got := p.silentStockJob(p.jobs, now); got != silent {
		t.Fatalf("silentStockJob = %+v, want the job a third of the budget quiet", got)
	}
	if got := p.silentStockJob([]*simJob{fresh}, now); got != nil {
		t.Fatalf("a job just reported was picked: %+v", got)
	}
	ours := &simPath{s: s, prefix: "n1", node: c.nodes[0]}
	if got := ours.silentStockJob(p.jobs, now); got != nil {
		t.Fatal("a path of this daemon's node was kept moving too")
	}
	s.stop()
	for _, id := range []string{"n2-0001", "n2-0002"} {
		if j, ok := n.broker.get(n.id, id); !ok || j.State != "completed" {
			t.Errorf("after the traffic stopped %s is %+v, want completed", id, j)
		}
	}
}
