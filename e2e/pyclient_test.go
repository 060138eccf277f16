package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// pyProducer drives the Python client (clients/python/wlmclient.py) the
// way a real producer does: jobs whose frames are requested back to back
// from several threads, a leased job that outlives a renewal, a job
// scheduled on a member named, and a close that flushes. It prints what it
// meant as one JSON object.
const pyProducer = `
import json, sys, threading, time
import wlmclient

addr, member = sys.argv[1], sys.argv[2]
THREADS, JOBS = 4, 32
ENDS = ["complete", "fail", "cancel", "remove"]
FINAL = {"complete": "completed", "fail": "failed", "cancel": "cancelled", "remove": "removed"}

c = wlmclient.Client(addr=addr, producer="pyit", lease=None)
node = c.node()
jobs = [c.submit("m", "e") for _ in range(JOBS)]
# Step 1 (start) and step 2 (the end) of job j run on threads (j+1)%4 and
# (j+2)%4, each after the job's previous step returned.
done = {(j, 0): threading.Event() for j in range(JOBS)}
for j in range(JOBS):
    done[(j, 0)].set()
    done[(j, 1)], done[(j, 2)] = threading.Event(), threading.Event()

def steps(t):
    for k in (1, 2):
        for j in range(JOBS):
            if (j + k) % THREADS != t:
                continue
            done[(j, k - 1)].wait(60)
            if k == 1:
                jobs[j].start()
            else:
                end = ENDS[j % len(ENDS)]
                getattr(jobs[j], end)(*(["why"] if end in ("fail", "cancel") else []))
            done[(j, k)].set()

ts = [threading.Thread(target=steps, args=(t,)) for t in range(THREADS)]
for t in ts: t.start()
for t in ts: t.join()

sched = c.submit("m", "e", scheduled_on_member=member)
sched.complete()

leased = wlmclient.Client(addr=addr, producer="pyit-leased", lease=5)
lj = leased.submit("m", "e")
lj.start()
# Past two renewals (every 5/3 s): the renewals reach the daemon as sent frames.
deadline = time.monotonic() + 60
while leased.stats().sent < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
lj.complete()

c.close(timeout=60)
leased.close(timeout=60)
print(json.dumps({
    "nodeId": node["nodeId"],
    "jobs": {jobs[j].id: FINAL[ENDS[j % len(ENDS)]] for j in range(JOBS)},
    "scheduled": sched.id, "leased": lj.id,
    "stats": c.stats().__dict__, "leasedStats": leased.stats().__dict__,
}))
`

// pyStats are the Python client's counters as the script prints them.
type pyStats struct {
	Queued, Sent, Retried, Refused, Dropped int
}

func TestProcessPythonClientJobsFromManyThreadsReachTheBrokerInOrderWithALease(t *testing.T) {
	t.Parallel()
	python := python3OrSkip(t)
	a, b, nodes, ingress := leaseProcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := pyScriptCommand(ctx, t, python, pyProducer, ingress, "node-"+nodes[1].ID[:8])
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("the Python producer: %v\n%s", err, stderr)
	}
	var rep struct {
		NodeID             string            `json:"nodeId"`
		Jobs               map[string]string `json:"jobs"`
		Scheduled, Leased  string
		Stats, LeasedStats pyStats
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("the producer's report %q: %v", out, err)
	}
	if rep.NodeID != nodes[0].ID {
		t.Fatalf("GET /v1/node gave the client node id %q, want %q", rep.NodeID, nodes[0].ID)
	}
	// Three frames a job plus the scheduled job's two, every one taken at
	// once: nothing retried, refused or dropped.
	if want := (pyStats{Sent: 3*len(rep.Jobs) + 2}); rep.Stats != want {
		t.Fatalf("client stats %+v, want %+v", rep.Stats, want)
	}
	if s := rep.LeasedStats; s.Sent < 4 || s.Retried+s.Refused+s.Dropped+s.Queued != 0 {
		t.Fatalf("leased client stats %+v, want the three frames and at least one renewal sent, nothing else", s)
	}

	removed := func(d *daemonProc) map[string]bool {
		out := map[string]bool{}
		for _, f := range d.WithMethod(wireframe.MethodRemove) {
			var rm struct{ WorkloadID string }
			json.Unmarshal(f.Params, &rm)
			out[rm.WorkloadID] = true
		}
		return out
	}
	// states returns the seqs and states A's broker got for id, in order.
	states := func(d *daemonProc, id string) (seqs []float64, sts []string) {
		for _, w := range d.Upserts() {
			if w["id"] == id {
				seqs = append(seqs, w["seq"].(float64))
				sts = append(sts, w["state"].(string))
			}
		}
		return seqs, sts
	}
	reached := func(d *daemonProc, id, final string) bool {
		if final == "removed" {
			return removed(d)[id]
		}
		_, sts := states(d, id)
		return slices.Contains(sts, final)
	}
	rep.Jobs[rep.Scheduled] = "completed"
	rep.Jobs[rep.Leased] = "completed"
	for _, d := range []*daemonProc{a, b} {
		testkit.Eventually(t, "every job's final state at both brokers", func() bool {
			for id, final := range rep.Jobs {
				if !reached(d, id, final) {
					return false
				}
			}
			return true
		})
	}
	for id, final := range rep.Jobs {
		seqs, sts := states(a, id)
		want, wantSeqs := []string{"queued", "running", final}, []float64{1, 2, 3}
		switch {
		case final == "removed":
			want, wantSeqs = want[:2], wantSeqs[:2]
		case id == rep.Scheduled:
			want, wantSeqs = []string{"queued", "completed"}, []float64{1, 2}
		case id == rep.Leased:
			// A renewal is the running frame again, same seq; what the
			// broker gets of it is the daemon's business, so repeats of
			// it are folded before the comparison.
			seqs, sts = slices.Compact(seqs), slices.Compact(sts)
		}
		if !slices.Equal(sts, want) || !slices.Equal(seqs, wantSeqs) {
			t.Errorf("A's broker got job %s as states %v seqs %v, want %v %v (in order, once each)", id, sts, seqs, want, wantSeqs)
		}
	}
	for _, w := range a.Upserts() {
		if w["id"] == rep.Scheduled && w["scheduledOn"] != nodes[1].ID {
			t.Errorf("the job scheduled on member node-%s carries scheduledOn %v, want %s", nodes[1].ID[:8], w["scheduledOn"], nodes[1].ID)
		}
		if w["originatedFrom"] != nodes[0].ID {
			t.Errorf("job %v reached A's broker with originatedFrom %v", w["id"], w["originatedFrom"])
		}
	}
}

// pyLiveLimitProducer submits job A, then job B, which the daemon at
// --max-live-workloads 1 refuses with a 503 and Retry-After while A lives,
// then completes A. The client's _post is wrapped only to see B refused
// before A's end is asked for. It prints its ids and counters.
const pyLiveLimitProducer = `
import json, sys, threading, time
import wlmclient

c = wlmclient.Client(addr=sys.argv[1], producer="pylive", lease=None)
a_id, b_id = wlmclient.new_id("pylive-a"), wlmclient.new_id("pylive-b")
b_refused = threading.Event()
post = c._post
def watched(f):
    r = post(f)
    if r[0] == 503 and json.loads(f.body)["params"]["workloadInfo"]["id"] == b_id:
        b_refused.set()
    return r
c._post = watched

a = c.submit("m", "e", id=a_id)
deadline = time.monotonic() + 60
while c.stats().sent < 1 and time.monotonic() < deadline:
    time.sleep(0.01)
c.submit("m", "e", id=b_id)
if not b_refused.wait(60):
    sys.exit("B was never refused at the live-workload limit")
a.complete()
err = None
try:
    c.close(timeout=30)
except wlmclient.WlmError as e:
    err = str(e)
print(json.dumps({"a": a_id, "b": b_id, "closeErr": err, "stats": c.stats().__dict__}))
`

// TestProcessPythonClientANewJobRefusedAtTheLiveLimitDoesNotHoldBackTheEndThatFreesTheSlot
// runs the Python client against a daemon that holds one live workload:
// job B's first frame is refused 503 with Retry-After while job A lives,
// and A's completed frame, asked for after that, must still reach the
// broker while B waits for its retry (a client whose sender slept on B's
// retry never sent it: a livelock until A's lease ran out); B is taken
// once A's terminal entry left its retention.
func TestProcessPythonClientANewJobRefusedAtTheLiveLimitDoesNotHoldBackTheEndThatFreesTheSlot(t *testing.T) {
	t.Parallel()
	python := python3OrSkip(t)
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0", "--max-live-workloads", "1", "--resync-interval", "1s")
	ingress := d.loggedValue("local ingress listening", "addr")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := pyScriptCommand(ctx, t, python, pyLiveLimitProducer, ingress)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("the Python producer's stderr:\n%s", stderr.String())
		}
	}()

	// The broker's lines: the index of the first upsert of an id prefix in
	// a state, or -1.
	first := func(prefix, state string) int {
		for i, w := range d.Upserts() {
			if id, _ := w["id"].(string); strings.HasPrefix(id, prefix) && w["state"] == state {
				return i
			}
		}
		return -1
	}
	testkit.Eventually(t, "job A's completed frame at the broker while job B waits for its retry",
		func() bool { return first("pylive-a-", "completed") >= 0 })
	testkit.Eventually(t, "job B's queued frame at the broker once A's slot is free",
		func() bool { return first("pylive-b-", "queued") >= 0 })
	if a, b := first("pylive-a-", "completed"), first("pylive-b-", "queued"); b < a {
		t.Fatalf("B's queued frame reached the broker at line %d, before A's completed at %d", b, a)
	}
	var err2 error
	select {
	case err2 = <-done:
		done <- err2 // for the deferred wait
	case <-ctx.Done():
		t.Fatal("the Python producer did not exit")
	}
	if err2 != nil {
		t.Fatalf("the Python producer: %v", err2)
	}
	var rep struct {
		A, B     string
		CloseErr *string `json:"closeErr"`
		Stats    pyStats
	}
	if err := json.Unmarshal([]byte(stdout.String()), &rep); err != nil {
		t.Fatalf("the producer's report %q: %v", stdout.String(), err)
	}
	if rep.CloseErr != nil {
		t.Fatalf("close: %s", *rep.CloseErr)
	}
	if s := rep.Stats; s.Sent != 3 || s.Retried < 1 || s.Dropped+s.Refused+s.Queued != 0 {
		t.Fatalf("client stats %+v, want 3 sent, at least one retry, nothing dropped, refused or queued", s)
	}
}

// python3OrSkip returns python3's path; without it the test skips, or
// fails under CI=true, where the Python client must be tested.
func python3OrSkip(t *testing.T) string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and python3 is not installed: the Python client is not tested")
		}
		t.Skip("python3 is not installed")
	}
	return python
}

// pyScriptCommand writes source as a script and returns the command that
// runs it with args, importing wlmclient from clients/python. A proxy in
// the environment points nowhere: the client must not use it.
func pyScriptCommand(ctx context.Context, t *testing.T, python, source string, args ...string) *exec.Cmd {
	t.Helper()
	dir := filepath.Join(moduleRoot(t), "clients", "python")
	script := filepath.Join(t.TempDir(), "producer.py")
	if err := os.WriteFile(script, []byte(source), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, python, append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir, "NO_PROXY=", "http_proxy=http://127.0.0.1:9")
	return cmd
}
