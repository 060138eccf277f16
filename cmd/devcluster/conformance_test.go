package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The conformance run (spec 3.5.8): both clients, driven the way the real
// producer drives its reports, against a two-node cluster whose brokers
// merge as PAIR's does, through every fault a producer meets. Each client
// has a node of its own (Go on node 1, Python on node 2) and runs the
// conformance producer's scenario (clients/python/conformance_producer.py
// and its Go twin): many jobs open at once, more than the node's
// --max-live-workloads (so the ingress answers 503 with Retry-After),
// the frames of a job requested from several goroutines or threads,
// every fourth job scheduled on the other member by name. Midway
// its daemon is restarted (node 1's killed, node 2's stopped as its broker
// stops it), later its node refuses every connection until the producer's
// outbox holds terminal frames, and the producer is killed and started
// again on the same outbox to run more jobs. A recording proxy in front of
// each ingress sees every request and answer.

// Conformance scenario sizes. Kept small enough for a loaded 2-core CI box
// (the run takes under a minute) and large enough that every fault meets
// jobs in every state. The node admits a new job while it holds fewer than
// conformLiveLimit, live or ended within the retention (two heartbeats,
// 1 s here); the producer keeps conformConcurrency jobs open, each some
// conformStepDelay per step, so the node turns new jobs away (503 with
// Retry-After) for a share of the run and the client holds a backlog,
// without the backlog being all there is.
const (
	conformJobsFirst     = 90
	conformJobsSecond    = 30
	conformConcurrency   = 16
	conformLiveLimit     = 20 // --max-live-workloads
	conformResync        = 500 * time.Millisecond
	conformStepDelay     = 3000 // ms, the most between two steps of a job: past a renewal (every 2 s) now and then
	conformLease         = 6    // seconds: renewed every 2 s, so a job open for a few steps is renewed
	conformRestartAfter  = 20   // jobs meant before the daemon restart
	conformOutboxAfter   = 50   // jobs meant before the node refuses
	conformOutboxPending = 3    // terminal frames in the outbox at the kill
	conformWait          = 90 * time.Second
)

// conformClient is one client under test: how to start its producer.
type conformClient struct {
	name    string   // "go" or "python"
	command []string // the producer program and its leading arguments
}

// producerRun is one process of a conformance producer and what it said
// on stdout (the protocol in clients/go/internal/conformproducer).
type producerRun struct {
	cmd    *exec.Cmd
	stderr lockedBuffer
	exited chan struct{}

	mu        sync.Mutex // guards the fields below
	nodeID    string
	memberID  string
	submitted map[string]string // id -> scheduledOn ("" for none)
	ending    map[string]string // id -> the final state of an end call under way or made
	meant     map[string]string // id -> the final state meant
	stepErrs  []string
	stats     map[string]int64 // the latest stats line
	done      bool
	closeErr  string
	badLines  []string
}

func startProducerRun(t *testing.T, cl conformClient, args ...string) *producerRun {
	t.Helper()
	r := &producerRun{exited: make(chan struct{}), submitted: map[string]string{}, ending: map[string]string{}, meant: map[string]string{}}
	argv := append(slices.Clone(cl.command), args...)
	r.cmd = exec.Command(argv[0], argv[1:]...)
	r.cmd.Env = append(os.Environ(), "no_proxy=127.0.0.1,localhost", "NO_PROXY=127.0.0.1,localhost")
	r.cmd.Stderr = &r.stderr
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("start the %s producer: %v", cl.name, err)
	}
	go func() {
		defer close(r.exited)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			r.take(sc.Text())
		}
		r.cmd.Wait()
	}()
	t.Cleanup(func() {
		r.cmd.Process.Kill()
		<-r.exited
	})
	return r
}

// take reads one stdout line of the producer.
func (r *producerRun) take(line string) {
	var ev struct {
		Event, NodeID, MemberID, ID, ScheduledOn, Final, Step, Err, CloseErr string
	}
	var raw map[string]any
	r.mu.Lock()
	defer r.mu.Unlock()
	if json.Unmarshal([]byte(line), &ev) != nil || json.Unmarshal([]byte(line), &raw) != nil {
		r.badLines = append(r.badLines, line)
		return
	}
	switch ev.Event {
	case "node":
		r.nodeID, r.memberID = ev.NodeID, ev.MemberID
	case "submitted":
		r.submitted[ev.ID] = ev.ScheduledOn
	case "ending":
		r.ending[ev.ID] = ev.Final
	case "meant":
		r.meant[ev.ID] = ev.Final
	case "stepError":
		r.stepErrs = append(r.stepErrs, fmt.Sprintf("job %q step %s: %s", ev.ID, ev.Step, ev.Err))
	case "stats":
		r.stats = map[string]int64{}
		for k, v := range raw {
			if f, ok := v.(float64); ok {
				r.stats[k] = int64(f)
			}
		}
	case "done":
		r.done, r.closeErr = true, ev.CloseErr
	default:
		r.badLines = append(r.badLines, line)
	}
}

func (r *producerRun) meantCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.meant)
}

func (r *producerRun) stat(name string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats[name]
}

func (r *producerRun) isDone() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// killNow ends the producer as a crash does and waits for it.
func (r *producerRun) killNow(t *testing.T) {
	t.Helper()
	r.cmd.Process.Kill()
	select {
	case <-r.exited:
	case <-time.After(killTimeout):
		t.Fatal("the producer did not exit after a kill")
	}
}

// waitFor waits up to conformWait for cond, failing the test with what
// the producer said on stderr.
func (r *producerRun) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(conformWait)
	for !cond() {
		select {
		case <-r.exited:
			if !cond() {
				t.Fatalf("the producer exited before %s: %v\nstderr:\n%s", what, r.cmd.ProcessState, tail(r.stderr.String(), 20))
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s\nproducer stderr:\n%s", conformWait, what, tail(r.stderr.String(), 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// conformLedger is what one client's producer meant over both its runs.
type conformLedger struct {
	nodeID, memberID string
	submitted        map[string]string // id -> scheduledOn
	meant            map[string]string // id -> final state
	openAtKill       map[string]string // submitted in the first run, not ended when it was killed -> the end under way ("" for none)
	killedAt         time.Time
	stepErrs         []string
	firstStats       map[string]int64 // the first run's last stats line before its kill
	secondStats      map[string]int64 // the second run's final stats line
}

// runConformanceProducer runs one client's scenario against its node n,
// with other the cluster's other member, through proxy; restart restarts
// n's daemon. It returns what the producer meant.
func runConformanceProducer(t *testing.T, cl conformClient, n, other *node, proxy *conformProxy, restart func() error) conformLedger {
	t.Helper()
	outbox := filepath.Join(t.TempDir(), cl.name+".outbox")
	common := []string{"--addr", proxy.addr, "--producer", "conf-" + cl.name, "--outbox", outbox,
		"--lease", strconv.Itoa(conformLease), "--member", other.name,
		"--concurrency", strconv.Itoa(conformConcurrency), "--step-delay-ms", strconv.Itoa(conformStepDelay)}

	first := startProducerRun(t, cl, append(slices.Clone(common), "--jobs", strconv.Itoa(conformJobsFirst), "--seed", "1")...)
	first.waitFor(t, "the first jobs to end", func() bool { return first.meantCount() >= conformRestartAfter })
	t.Logf("%s: restarting %s's daemon at %s with %d jobs meant, %d frames queued in the client",
		cl.name, n.name, time.Now().Format("15:04:05.000"), first.meantCount(), first.stat("queued"))
	if err := restart(); err != nil {
		t.Fatalf("restarting %s: %v", n.name, err)
	}
	first.waitFor(t, "more jobs to end after the restart", func() bool { return first.meantCount() >= conformOutboxAfter })

	// The node refuses every connection; the producer goes on ending jobs,
	// whose terminal frames wait in its outbox, and is killed.
	proxy.refusing.Store(true)
	first.waitFor(t, "terminal frames to wait in the outbox", func() bool {
		return first.stat("outboxPending") >= conformOutboxPending
	})
	first.killNow(t)
	killedAt := time.Now()
	proxy.refusing.Store(false)

	first.mu.Lock()
	led := conformLedger{
		nodeID: first.nodeID, memberID: first.memberID,
		submitted: maps.Clone(first.submitted), meant: maps.Clone(first.meant),
		openAtKill: map[string]string{}, killedAt: killedAt,
		stepErrs: slices.Clone(first.stepErrs), firstStats: maps.Clone(first.stats),
	}
	for id := range led.submitted {
		if _, ok := led.meant[id]; !ok {
			led.openAtKill[id] = first.ending[id]
		}
	}
	first.mu.Unlock()
	// GET /v1/node told the producer who its node is and which node id the
	// other member's name stands for.
	if led.nodeID != n.id || led.memberID != other.id {
		t.Errorf("%s: the producer learned node %q and member %s = %q, want %q and %q", cl.name, led.nodeID, other.name, led.memberID, n.id, other.id)
	}
	t.Logf("%s: killed the producer with %d jobs meant, %d open, %d frames queued, %d terminal frames in its outbox",
		cl.name, len(led.meant), len(led.openAtKill), led.firstStats["queued"], led.firstStats["outboxPending"])

	second := startProducerRun(t, cl, append(slices.Clone(common), "--jobs", strconv.Itoa(conformJobsSecond), "--seed", "2")...)
	second.waitFor(t, "the second run to finish", second.isDone)
	<-second.exited
	second.mu.Lock()
	defer second.mu.Unlock()
	for id, s := range second.submitted {
		if _, dup := led.submitted[id]; dup {
			t.Errorf("%s: the restarted producer minted id %s again", cl.name, id)
		}
		led.submitted[id] = s
	}
	maps.Copy(led.meant, second.meant)
	led.stepErrs = append(led.stepErrs, second.stepErrs...)
	led.secondStats = maps.Clone(second.stats)
	if second.closeErr != "" {
		t.Errorf("%s: the second run's Close: %s", cl.name, second.closeErr)
	}
	for _, l := range append(first.badLines, second.badLines...) {
		t.Errorf("%s: the producer printed a line outside its protocol: %q", cl.name, l)
	}
	return led
}

func TestConformanceBothClientsEndEveryJobAsMeantOnBothNodes(t *testing.T) {
	t.Parallel()
	clients := conformClients(t)
	c := testClusterWith(t, 2, conformResync, false, func(c *cluster) {
		for _, n := range c.nodes {
			n.wantIngress = "127.0.0.1:0"
			n.extraArgs = []string{"--max-live-workloads", strconv.Itoa(conformLiveLimit)}
		}
	})
	n1, n2 := c.nodes[0], c.nodes[1]
	// Node 1's daemon crashes (SIGKILL) and its broker starts it again;
	// node 2's is stopped as its broker stops it (stdin closed) and started
	// again, as for an upgrade.
	restarts := []func() error{
		func() error {
			if err := c.kill(n1); err != nil {
				return err
			}
			return c.start(n1)
		},
		func() error {
			c.stopProcess(n2, n2.current())
			return c.start(n2)
		},
	}
	proxies := []*conformProxy{newConformProxy(t, n1.ingressAddr()), newConformProxy(t, n2.ingressAddr())}
	ledgers := make([]conformLedger, len(clients))
	ran := make([]bool, len(clients))
	var wg sync.WaitGroup
	for i, cl := range clients {
		n, other := c.nodes[i], c.nodes[1-i]
		wg.Go(func() {
			ran[i] = t.Run(cl.name, func(t *testing.T) {
				ledgers[i] = runConformanceProducer(t, cl, n, other, proxies[i], restarts[i])
			})
		})
	}
	wg.Wait()
	for i, cl := range clients {
		if !ran[i] {
			continue
		}
		t.Run(cl.name+" final states", func(t *testing.T) {
			checkConformStates(t, c, cl, ledgers[i], proxies[i].records())
		})
		t.Run(cl.name+" requests", func(t *testing.T) {
			checkConformRequests(t, ledgers[i], proxies[i].records())
		})
	}
}

// conformClients returns the clients under test, their producers built.
// Python is required under CI=true and skipped with a note otherwise.
func conformClients(t *testing.T) []conformClient {
	t.Helper()
	producer := buildModuleProgram(t, filepath.Join("clients", "go"), "./internal/conformproducer", "conformproducer")
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := []conformClient{{name: "go", command: []string{producer}}}
	python, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and python3 is not installed: the Python client's conformance is not run")
		}
		t.Log("python3 is not installed: only the Go client's conformance is run")
		return out
	}
	return append(out, conformClient{name: "python", command: []string{python, filepath.Join(root, "clients", "python", "conformance_producer.py")}})
}

// checkConformStates waits until both nodes' brokers hold what the
// producer meant, then checks nothing else is there: every job it ended
// is in the state it meant on both nodes (a removed one on neither), every
// job left open by its killed producer is failed by its lease or, when its
// first frame never left the producer, on neither node; no job it never
// submitted carries its prefix.
func checkConformStates(t *testing.T, c *cluster, cl conformClient, led conformLedger, recs []proxyRecord) {
	for _, e := range led.stepErrs {
		t.Errorf("a step failed: %s", e)
	}
	// stateOf is the state a broker holds a job in once it ended as
	// final: none for a removal.
	stateOf := func(final string) string {
		if final == "removed" {
			return ""
		}
		return final
	}
	want := func(id string) (states []string) {
		if final, ok := led.meant[id]; ok {
			return []string{stateOf(final)}
		}
		// Open at the kill: never reached the node, or retired by its
		// lease; or, when the kill came while its end call was under
		// way, ended as that call meant (the outbox had it).
		return []string{"", "failed", stateOf(led.openAtKill[id])}
	}
	stateOn := func(n *node, id string) string {
		j, ok := n.broker.get(led.nodeID, id)
		if !ok {
			return ""
		}
		return j.State
	}
	settled := func() (bad []string) {
		for id := range led.submitted {
			s1, s2 := stateOn(c.nodes[0], id), stateOn(c.nodes[1], id)
			if s1 != s2 || !slices.Contains(want(id), s1) {
				bad = append(bad, fmt.Sprintf("%s: node1 %q node2 %q, want one of %q on both", id, s1, s2, want(id)))
			}
		}
		sort.Strings(bad)
		return bad
	}
	deadline := time.Now().Add(conformWait)
	for bad := settled(); len(bad) > 0; bad = settled() {
		if time.Now().After(deadline) {
			t.Errorf("%d jobs not as meant after %s:\n%s", len(bad), conformWait, strings.Join(bad[:min(len(bad), 20)], "\n"))
			for _, b := range bad[:min(len(bad), 5)] {
				id, _, _ := strings.Cut(b, ":")
				t.Logf("what the proxy saw of %s (the producer was killed at %s):", id, led.killedAt.Format("15:04:05.000"))
				for _, r := range recs {
					if r.ID == id {
						t.Logf("  %s-%s %s seq %d lease %q: %s %d", r.Start.Format("15:04:05.000"), r.End.Format("15:04:05.000"), cmp.Or(r.State, "removal"), r.Seq, r.Lease, r.Outcome, r.Status)
					}
				}
			}
			t.FailNow()
		}
		time.Sleep(50 * time.Millisecond)
	}
	prefix := "conf-" + cl.name + "-"
	for _, n := range c.nodes {
		byState := map[string]int{}
		for _, j := range n.broker.snapshot() {
			if j.Origin != led.nodeID || !strings.HasPrefix(j.ID, prefix) {
				continue
			}
			byState[j.State]++
			if _, ok := led.submitted[j.ID]; !ok {
				t.Errorf("%s holds job %s, which the producer never submitted", n.name, j.ID)
			}
			if sched := led.submitted[j.ID]; sched != "" {
				var info struct{ ScheduledOn string }
				json.Unmarshal(j.Info, &info)
				if info.ScheduledOn != sched {
					t.Errorf("%s holds job %s scheduled on %q, want %q", n.name, j.ID, info.ScheduledOn, sched)
				}
			}
		}
		t.Logf("%s's Jobs list, this producer's jobs by state: %v", n.name, byState)
	}
	meantBy := map[string]int{}
	for _, f := range led.meant {
		meantBy[f]++
	}
	openBy := map[string]int{}
	for id := range led.openAtKill {
		openBy[cmp.Or(stateOn(c.nodes[0], id), "absent")]++
	}
	t.Logf("jobs submitted %d; meant %d %v; open at the producer's kill %d, now on both nodes %v",
		len(led.submitted), len(led.meant), meantBy, len(led.openAtKill), openBy)
	t.Logf("client stats: first run at its kill %v; second run at its close %v", led.firstStats, led.secondStats)
}

// checkConformRequests checks what the proxy saw the client send: per
// job, never two requests in flight at once, seq never going back, a frame
// sent again only after an answer that asks for it (a transport failure, a
// 5xx, 408 or 429), a lease renewal, or across the producer's restart
// (its outbox), never sooner than a Retry-After, and nothing after a 409.
func checkConformRequests(t *testing.T, led conformLedger, recs []proxyRecord) {
	byJob := map[string][]proxyRecord{}
	statuses := map[string]int{}
	retries, renewals, raHonoured, outboxResends := 0, 0, 0, 0
	for _, r := range recs {
		key := r.Outcome
		if r.Outcome == outcomeAnswered {
			key = strconv.Itoa(r.Status)
		}
		statuses[key]++
		if r.HTTPMethod == "POST" && r.ID != "" {
			byJob[r.ID] = append(byJob[r.ID], r)
		}
	}
	for id, rs := range byJob {
		slices.SortFunc(rs, func(a, b proxyRecord) int { return a.Start.Compare(b.Start) })
		for i := 1; i < len(rs); i++ {
			prev, r := rs[i-1], rs[i]
			// The first run's requests all started before its kill, the
			// second's after: the outbox sends again what the first may
			// have had taken, and that is allowed (spec 3.5.6).
			acrossRestart := prev.Start.Before(led.killedAt) && r.Start.After(led.killedAt)
			if r.Start.Before(prev.End) && !acrossRestart {
				t.Errorf("job %s: two requests in flight at once (%s seq %d and %s seq %d)", id, prev.State, prev.Seq, r.State, r.Seq)
			}
			if prev.Outcome == outcomeAnswered && prev.Status == 409 {
				t.Errorf("job %s: %s seq %d sent after a 409", id, r.State, r.Seq)
			}
			switch {
			case r.Seq < prev.Seq && !acrossRestart:
				t.Errorf("job %s: seq went back from %d to %d", id, prev.Seq, r.Seq)
			case r.Seq > prev.Seq:
				if !acrossRestart && (prev.Outcome != outcomeAnswered || prev.Status != 200 && retryableStatus(prev.Status)) {
					t.Errorf("job %s: seq %d sent while seq %d was not taken (%s %d)", id, r.Seq, prev.Seq, prev.Outcome, prev.Status)
				}
			case r.Body != prev.Body:
				if !acrossRestart {
					t.Errorf("job %s: seq %d sent twice with different bodies", id, r.Seq)
				}
			case prev.Outcome == outcomeAnswered && prev.Status == 200:
				switch {
				case acrossRestart:
					outboxResends++
				case r.Lease != "" && (r.State == "queued" || r.State == "running"):
					renewals++
				default:
					t.Errorf("job %s: %s seq %d sent again after it was taken (200)", id, r.State, r.Seq)
				}
			case prev.Outcome == outcomeAnswered && !retryableStatus(prev.Status):
				t.Errorf("job %s: %s seq %d retried after %d, which is final", id, r.State, r.Seq, prev.Status)
			default:
				retries++
				if prev.RetryAfter > 0 {
					if gap := r.Start.Sub(prev.End); gap < prev.RetryAfter && !acrossRestart {
						t.Errorf("job %s: retried %s after a Retry-After of %s", id, gap, prev.RetryAfter)
					} else {
						raHonoured++
					}
				}
			}
		}
	}
	for id, final := range led.meant {
		if final != "removed" {
			continue
		}
		taken := false
		for _, r := range byJob[id] {
			taken = taken || r.Seq == math.MaxInt64 && r.Outcome == outcomeAnswered && r.Status == 200
		}
		if !taken {
			t.Errorf("job %s: meant removed, but no removal of it was taken (200): its absence proves nothing", id)
		}
	}
	t.Logf("requests %d by answer %v; retries %d (%d after a Retry-After, each no sooner); lease renewals %d; outbox re-sends after the restart %d",
		len(recs), statuses, retries, raHonoured, renewals, outboxResends)
	if statuses["503"] == 0 {
		t.Errorf("the node never answered 503: the live-workload limit (%d) was not reached", conformLiveLimit)
	}
}

// retryableStatus is what a client may retry: a 5xx, 408 or 429.
func retryableStatus(s int) bool { return s >= 500 || s == 408 || s == 429 }
