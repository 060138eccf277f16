//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/pairbroker"
	"nvpair-workload-manager/internal/dev/testkit"
)

// The Slurm bridge, `nvpair-wlm slurm` (issue 38), against a real Slurm
// (slurm_harness_test.go) and real daemons, each member judged by what
// PAIR's store fed its stdout shows (pairNodeBroker, statetable_test.go):
// every kind of job with its states on two members within two polls of
// Slurm's own view; the bridge killed with kill -9 and started again, its
// jobs' leases running out meanwhile; Slurm's controller restarted while a
// job runs.

// pollInterval is the bridge's --interval in these tests.
const pollInterval = time.Second

// bridgeProc is one nvpair-wlm slurm process.
type bridgeProc struct {
	cmd    *exec.Cmd
	log    *testkit.LogBuffer
	exited chan struct{}
}

// startBridge starts the bridge on s, reporting to ingress, with its state
// file at state, this node's pending jobs included; it is killed at
// cleanup if it still runs.
func startBridge(t *testing.T, s *slurm, ingress, state string, extra ...string) *bridgeProc {
	t.Helper()
	args := append([]string{"slurm", "--addr", ingress, "--interval", pollInterval.String(), "--lease", "10s",
		"--node", s.node, "--pending", "--state", state, "--log-level", "info"}, extra...)
	b := &bridgeProc{cmd: exec.Command(wlmBinary(t), args...), log: &testkit.LogBuffer{}, exited: make(chan struct{})}
	b.cmd.Env = s.env()
	b.cmd.Stdout, b.cmd.Stderr = b.log, b.log
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { b.cmd.Wait(); close(b.exited) }()
	t.Cleanup(func() {
		b.kill9()
		if t.Failed() {
			t.Logf("the bridge's log:\n%s", b.log.String())
		}
	})
	return b
}

// kill9 kills the bridge with SIGKILL and waits for it.
func (b *bridgeProc) kill9() {
	b.cmd.Process.Signal(syscall.SIGKILL)
	<-b.exited
}

// asWorkload is the workload state Slurm's text state names (the bridge's
// mapping, docs/producer-guide.md, read here apart from its code).
var asWorkload = map[string]string{
	"PENDING": "queued", "REQUEUED": "queued", "SUSPENDED": "queued",
	"CONFIGURING": "running", "RUNNING": "running", "COMPLETING": "running",
	"COMPLETED": "completed", "FAILED": "failed", "TIMEOUT": "failed", "NODE_FAIL": "failed",
	"OUT_OF_MEMORY": "failed", "BOOT_FAIL": "failed", "DEADLINE": "failed", "PREEMPTED": "failed",
	"CANCELLED": "cancelled",
}

// watch follows Slurm's view and the members' Jobs lists together, and
// keeps when each first showed each job in each state: Slurm's by its
// own job key, the lists' by the Slurm job their workload names.
type watch struct {
	t       *testing.T
	s       *slurm
	members map[string]*pairNodeBroker
	origin  string
	slurmAt map[string]map[string]time.Time            // key -> workload state -> first seen in Slurm's view
	shownAt map[string]map[string]map[string]time.Time // member -> key -> state -> first shown
	ids     map[string]string                          // key -> workload id
}

func newWatch(t *testing.T, s *slurm, origin string, members map[string]*pairNodeBroker) *watch {
	w := &watch{t: t, s: s, members: members, origin: origin, slurmAt: map[string]map[string]time.Time{},
		shownAt: map[string]map[string]map[string]time.Time{}, ids: map[string]string{}}
	for name := range members {
		w.shownAt[name] = map[string]map[string]time.Time{}
	}
	return w
}

// firstAt records the first time of (key, state) in m.
func firstAt(m map[string]map[string]time.Time, key, state string, now time.Time) {
	if m[key] == nil {
		m[key] = map[string]time.Time{}
	}
	if _, ok := m[key][state]; !ok {
		m[key][state] = now
	}
}

// observe reads Slurm's view and each member's Jobs list once.
func (w *watch) observe() {
	now := time.Now()
	if states, err := w.s.states(); err == nil {
		for id, st := range states {
			for _, key := range expandKey(id) {
				if ws := asWorkload[st]; ws != "" {
					firstAt(w.slurmAt, key, ws, now)
				}
			}
		}
	}
	for name, m := range w.members {
		for _, r := range m.jobs().Snapshot() {
			if r.Origin != w.origin || r.Engine != "slurm" {
				continue
			}
			var info struct {
				Key string `json:"slurmJob"`
			}
			json.Unmarshal(r.Info, &info)
			w.ids[info.Key] = r.ID
			firstAt(w.shownAt[name], info.Key, r.State, now)
		}
	}
}

// expandKey is the job keys an squeue id names: "45_[0-2]" (a pending
// array not split yet) names 45_0, 45_1 and 45_2.
func expandKey(id string) []string {
	arr, rest, ok := strings.Cut(id, "_[")
	if !ok {
		return []string{id}
	}
	rest, _, _ = strings.Cut(strings.TrimSuffix(rest, "]"), "%")
	var out []string
	for part := range strings.SplitSeq(rest, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		var a, b int
		fmt.Sscan(lo, &a)
		fmt.Sscan(hi, &b)
		for i := a; i <= b; i++ {
			out = append(out, fmt.Sprintf("%s_%d", arr, i))
		}
	}
	return out
}

// shows reports whether member shows the job keyed key in state now.
func (w *watch) shows(member, key, state string) bool {
	r, ok := w.record(member, key)
	return ok && r.State == state
}

// record is member's record of the job keyed key.
func (w *watch) record(member, key string) (pairbroker.Record, bool) {
	id, ok := w.ids[key]
	if !ok {
		return pairbroker.Record{}, false
	}
	return w.members[member].jobs().Get(w.origin, id)
}

// until observes every 100 ms until cond holds, and fails the test after
// 3 x WaitTimeout (Slurm's jobs take their own seconds besides).
func (w *watch) until(what string, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(3 * testkit.WaitTimeout)
	for {
		w.observe()
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitLong waits for cond as Eventually does, three times as long: what
// Slurm's commands do takes seconds of its own.
func waitLong(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !testkit.HoldsWithin(3*testkit.WaitTimeout, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// all reports whether every member shows every job of want in its state.
func (w *watch) all(want map[string]string) bool {
	for name := range w.members {
		for key, st := range want {
			if !w.shows(name, key, st) {
				return false
			}
		}
	}
	return true
}

// isSubsequence reports whether got is want with some states left out, in
// want's order.
func isSubsequence(got, want []string) bool {
	i := 0
	for _, g := range got {
		for i < len(want) && want[i] != g {
			i++
		}
		if i == len(want) {
			return false
		}
		i++
	}
	return true
}

func TestSlurmBridgeReportsEveryKindOfJobOnBothMembersWithinTwoPollsOfSlurm(t *testing.T) {
	s := startSlurm(t, 2)
	nodes := writeCluster(t, 2)
	a := newPairNodeBroker(t, nodes[0], "--local-ingress", "127.0.0.1:0")
	b := newPairNodeBroker(t, nodes[1])
	a.start()
	b.start()
	meet(t, a, b)
	ingress := a.cur().loggedValue("local ingress listening", "addr")
	startBridge(t, s, ingress, filepath.Join(t.TempDir(), "state.json"))
	w := newWatch(t, s, nodes[0].ID, map[string]*pairNodeBroker{"A": a, "B": b})

	// Both CPUs taken: the next job waits behind them.
	running := s.sbatch("-J", "cancelled-running", "--wrap", "sleep 120")
	blocker := s.sbatch("-J", "blocker", "--wrap", "sleep 120")
	w.until("both CPUs' jobs running on both members", func() bool { return w.all(map[string]string{running: "running", blocker: "running"}) })
	behind := s.sbatch("-J", "behind-full-cpus", "--wrap", "true")
	held := s.sbatch("-J", "cancelled-pending", "--hold", "--wrap", "true")
	w.until("the waiting jobs queued on both members", func() bool { return w.all(map[string]string{behind: "queued", held: "queued"}) })
	s.run("scancel", held)
	s.run("scancel", running, blocker) // the CPUs are free: the job behind runs
	done := s.sbatch("-J", "completes", "--wrap", "sleep 1")
	three := s.sbatch("-J", "exit-3", "--wrap", "exit 3")
	arr := s.sbatch("-J", "array", "--array=0-2", "--wrap", "true")
	want := map[string]string{behind: "completed", held: "cancelled", running: "cancelled", blocker: "cancelled",
		done: "completed", three: "failed", arr + "_0": "completed", arr + "_1": "completed", arr + "_2": "completed"}
	w.until("every job's end on both members", func() bool { return w.all(want) })

	// Each job's states in order: every frame at A's broker, and at B's a
	// subsequence (a member that catches up is sent a job's latest state).
	order := map[string][]string{held: {"queued", "cancelled"}}
	for key, end := range want {
		if order[key] == nil {
			order[key] = []string{"queued", "running", end}
		}
	}
	for key, seq := range order {
		id := w.ids[key]
		if got := upsertStates(a.cur(), id); !slices.Equal(got, seq) {
			t.Errorf("job %s: A's broker got %v, want %v", key, got, seq)
		}
		if got := upsertStates(b.cur(), id); !isSubsequence(got, seq) || got[len(got)-1] != seq[len(seq)-1] {
			t.Errorf("job %s: B's broker got %v, want %v or a part of it ending the same", key, got, seq)
		}
	}
	// Slurm's own words for each end.
	for key, text := range map[string]string{
		three:   "Slurm job " + three + " ended FAILED (reason NonZeroExitCode, exit code 3)",
		running: "Slurm job " + running + " ended CANCELLED (reason None, killed by signal 15)",
		held:    "Slurm job " + held + " ended CANCELLED (reason JobHeldUser, exit code 0)",
	} {
		for name := range w.members {
			r, _ := w.record(name, key)
			if e, _ := infoOf(t, r)["error"].(string); e != text {
				t.Errorf("%s shows job %s's error %q, want %q", name, key, e, text)
			}
		}
	}
	// Within two polls of Slurm's own view: each state both Slurm (read
	// here every 100 ms) and a member showed, the member no later than two
	// intervals after Slurm.
	var worst time.Duration
	for member, byKey := range w.shownAt {
		for key, states := range byKey {
			for st, shown := range states {
				seen, ok := w.slurmAt[key][st]
				if !ok {
					continue // Slurm held it between two of the test's reads
				}
				lag := shown.Sub(seen)
				worst = max(worst, lag)
				if lag > 2*pollInterval {
					t.Errorf("%s showed job %s %s %v after Slurm did, over two polls (%v)", member, key, st, lag.Round(time.Millisecond), 2*pollInterval)
				}
			}
		}
	}
	t.Logf("%d jobs, each state on both members at most %v after Slurm showed it (polls every %v)", len(want), worst.Round(time.Millisecond), pollInterval)
}

func TestSlurmBridgeKilledWithKill9IsStartedAgainAndSettlesEveryJobHonestly(t *testing.T) {
	s := startSlurm(t, 2)
	nodes := writeCluster(t, 1)
	a := newPairNodeBroker(t, nodes[0], "--local-ingress", "127.0.0.1:0")
	a.start()
	ingress := a.cur().loggedValue("local ingress listening", "addr")
	state := filepath.Join(t.TempDir(), "state.json")
	br := startBridge(t, s, ingress, state, "--lease", "5s")
	w := newWatch(t, s, nodes[0].ID, map[string]*pairNodeBroker{"A": a})

	gate := filepath.Join(s.dir, "short-may-end")
	long := s.sbatch("-J", "long", "--wrap", "sleep 120")
	short := s.sbatch("-J", "short", "--wrap", "while [ ! -e "+gate+" ]; do sleep 0.1; done")
	held := s.sbatch("-J", "held", "--hold", "--wrap", "true")
	w.until("the jobs on A", func() bool { return w.all(map[string]string{long: "running", short: "running", held: "queued"}) })
	ids := map[string]string{long: w.ids[long], short: w.ids[short], held: w.ids[held]}

	// Killed and started again at once: the jobs go on as they were.
	br.kill9()
	br = startBridge(t, s, ingress, state, "--lease", "5s")
	testkit.Eventually(t, "the bridge to take its jobs back", func() bool { return br.log.Contains("recovered", "jobs=3", "readBack=true") })
	os.WriteFile(gate, nil, 0o644)
	w.until("the short job completed after the restart", func() bool { return w.all(map[string]string{short: "completed", long: "running"}) })

	// Killed for longer than its leases: the running job shows failed on
	// the node, as a dead producer's jobs must, and what ended meanwhile
	// is seen by nobody.
	br.kill9()
	s.run("scancel", held)
	w.until("the long job's lease to retire it", func() bool {
		r, ok := w.record("A", long)
		e, _ := infoOf(t, r)["error"].(string)
		return ok && r.State == "failed" && strings.HasPrefix(e, "producer stopped reporting")
	})
	br = startBridge(t, s, ingress, state, "--lease", "5s")
	w.until("every job as Slurm says after the second restart", func() bool {
		return w.all(map[string]string{long: "running", short: "completed", held: "cancelled"})
	})
	s.run("scancel", long)
	w.until("the long job cancelled", func() bool { return w.shows("A", long, "cancelled") })
	for key, id := range ids {
		if w.ids[key] != id {
			t.Errorf("job %s was %s and is %s after the restarts", key, id, w.ids[key])
		}
	}
	if got, want := upsertStates(a.cur(), ids[long]), []string{"queued", "running", "failed", "queued", "running", "cancelled"}; !slices.Equal(got, want) {
		t.Errorf("the long job's states at A: %v, want %v (a new run after its lease ran out)", got, want)
	}
	// The held job was leased while it waited: its lease ran out too, and
	// its end as Slurm gives it is a new run's.
	if got, want := upsertStates(a.cur(), ids[held]), []string{"queued", "failed", "queued", "cancelled"}; !slices.Equal(got, want) {
		t.Errorf("the held job's states at A: %v, want %v", got, want)
	}
	// The node's read-back says the same, lease by lease: only a live job
	// holds one.
	finals := map[string]string{ids[long]: "cancelled", ids[short]: "completed", ids[held]: "cancelled"}
	for _, item := range testkit.ReadBack(t, ingress, "requesterId=slurm/root").Workloads {
		id, _ := item.WorkloadInfo["id"].(string)
		if want, ok := finals[id]; ok {
			if item.WorkloadInfo["state"] != want || item.LeaseDeadline != nil {
				t.Errorf("the read-back shows %s %v with lease %v, want %s and none", id, item.WorkloadInfo["state"], item.LeaseDeadline, want)
			}
			delete(finals, id)
		}
	}
	if len(finals) != 0 {
		t.Errorf("the read-back does not list %v", finals)
	}
}

func TestSlurmBridgeRidesOutARestartOfSlurmsController(t *testing.T) {
	s := startSlurm(t, 2)
	nodes := writeCluster(t, 1)
	a := newPairNodeBroker(t, nodes[0], "--local-ingress", "127.0.0.1:0")
	a.start()
	ingress := a.cur().loggedValue("local ingress listening", "addr")
	br := startBridge(t, s, ingress, filepath.Join(t.TempDir(), "state.json"), "--lease", "5s")
	w := newWatch(t, s, nodes[0].ID, map[string]*pairNodeBroker{"A": a})

	gate := filepath.Join(s.dir, "may-end")
	job := s.sbatch("-J", "rides-it-out", "--wrap", "while [ ! -e "+gate+" ]; do sleep 0.1; done")
	held := s.sbatch("-J", "held", "--hold", "--wrap", "true")
	w.until("the jobs on A", func() bool { return w.all(map[string]string{job: "running", held: "queued"}) })

	s.stopController()
	// squeue gives up on a controller that does not answer after its
	// MessageTimeout (3 s here) and retries.
	waitLong(t, "the bridge to find squeue failing", func() bool { return br.log.Contains("squeue failed") })
	// Longer than a lease: the bridge lives and renews, so nothing expires
	// while Slurm cannot say what it holds.
	calm := time.Now().Add(6 * time.Second)
	for time.Now().Before(calm) {
		if r, ok := a.jobs().Get(nodes[0].ID, w.ids[job]); !ok || r.State != "running" {
			t.Fatalf("while the controller was down A showed the job %+v", r)
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.startController()
	waitLong(t, "the bridge to read Slurm again", func() bool { return br.log.Contains("squeue answers again") })
	s.run("scontrol", "release", held)
	os.WriteFile(gate, nil, 0o644)
	w.until("both jobs completed", func() bool { return w.all(map[string]string{job: "completed", held: "completed"}) })
	if got := upsertStates(a.cur(), w.ids[job]); !slices.Equal(got, []string{"queued", "running", "completed"}) {
		t.Errorf("the job's states at A across the controller's restart: %v", got)
	}
}
