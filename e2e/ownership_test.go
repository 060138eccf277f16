package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// A producer that names a job of the node's broker (its id collides with a
// proxy's) is refused 409 for a removal, a lease and a plain frame: the
// broker's job is neither removed nor retired anywhere, and the broker's
// later frames for it, its completion and new runs, still reach the peer.
func TestProcessIngressRemovalOrLeaseOfABrokerJobIs409AndTheBrokersLaterFramesReachThePeer(t *testing.T) {
	t.Parallel()
	a, b, nodes, ingress := leaseProcPair(t)
	a.send(testframe.LifecycleLine("proxy-1", "running", nodes[0].ID))
	b.WaitUpserts("proxy-1", 1)

	refusals := []struct {
		what    string
		body    string
		headers []string
	}{
		{"removal", `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"proxy-1"}}`, nil},
		{"lease", string(testframe.Lifecycle(leasedInfo("proxy-1", "running", 2), nil)), []string{leaseHeader, itoa(statetable.MinLeaseSeconds)}},
		{"frame", string(testframe.Lifecycle(leasedInfo("proxy-1", "completed", 2), nil)), nil},
	}
	for _, r := range refusals {
		st, text := testkit.PostIngress(t, ingress, r.body, r.headers...)
		if st != http.StatusConflict || !strings.Contains(text, `"proxy-1"`) || strings.Contains(text, "\n") {
			t.Fatalf("ingress %s of the broker's job: %d %q, want 409 with one line naming it", r.what, st, text)
		}
	}
	// The broker's own frames go on: its completion, then three new runs.
	done := testframe.Workload("proxy-1", "completed", nodes[0].ID, map[string]any{"seq": 2})
	a.send(string(testframe.Lifecycle(done, nil)))
	for i := range 3 {
		w := testframe.Workload("proxy-1", "running", nodes[0].ID, map[string]any{"runId": "run-" + itoa(i+2)})
		a.send(string(testframe.Lifecycle(w, nil)))
	}
	b.WaitUpserts("proxy-1", 5)
	// Past a lease's length nothing retired the job: no failed state at
	// either broker, no removal anywhere (the barrier is a later frame).
	a.send(testframe.LifecycleLine("barrier", "running", nodes[0].ID))
	b.WaitUpserts("barrier", 1)
	for _, d := range []*daemonProc{a, b} {
		if rm := d.WithMethod(wireframe.MethodRemove); len(rm) != 0 {
			t.Fatalf("a broker got %d removals", len(rm))
		}
		if got := procTerminalStates(d, "proxy-1"); slices.Contains(got, "failed") {
			t.Fatalf("the broker's job was retired as failed: %v", got)
		}
	}
	if got := procTerminalStates(b, "proxy-1"); !slices.Equal(got, []string{"completed"}) {
		t.Fatalf("the peer's terminal states of the broker's job: %v, want its completion", got)
	}
}

// replayLines is the broker's store as it replays it to a restarted
// daemon: the latest event of each workload its daemon wrote up.
func replayLines(d *daemonProc) []string {
	latest := map[string]map[string]any{}
	var order []string
	for _, w := range d.Upserts() {
		id := w["id"].(string)
		if latest[id] == nil {
			order = append(order, id)
		}
		latest[id] = w
	}
	for _, f := range d.WithMethod(wireframe.MethodRemove) {
		var rm struct{ WorkloadID string }
		json.Unmarshal(f.Params, &rm)
		delete(latest, rm.WorkloadID)
	}
	var lines []string
	for _, id := range order {
		if w := latest[id]; w != nil {
			lines = append(lines, string(testframe.Lifecycle(w, nil)))
		}
	}
	return lines
}

// A leased ingress job whose daemon is killed (SIGKILL: nothing written at
// exit) and started again, with the broker replaying its store before it
// reads ready, is failed at both brokers within its lease plus the restart
// grace; the read-back of the restarted daemon lists the replayed ingress
// jobs, and an unleased one stays running.
func TestProcessALeasedIngressJobIsFailedOnBothNodesAfterItsDaemonIsKilledAndRestarted(t *testing.T) {
	t.Parallel()
	a, b, nodes, ingress := leaseProcPair(t)
	postProc(t, ingress, leasedInfo("kept", "running", 1), 0)
	postProc(t, ingress, leasedInfo("crashed", "running", 1), statetable.MinLeaseSeconds)
	posted := time.Now()
	b.WaitUpserts("crashed", 1)
	// Both were answered 200, so both are in the journal: no wait.
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	store := replayLines(a)

	a2 := startDaemon(t, nodeArgs(nodes[0], 0, "--local-ingress", "127.0.0.1:0")...)
	for _, line := range store {
		a2.send(line) // the broker replays its store before it reads ready
	}
	a2.port = a2.boundPeerPort()
	a2.discover(nodes[1], b.port)
	b.discover(nodes[0], a2.port)
	a2.waitLog("broadcast targets changed", "total=1")
	ingress2 := a2.loggedValue("local ingress listening", "addr")

	testkit.Eventually(t, "the read-back to list the replayed ingress jobs", func() bool {
		st, _, body := testkit.GetReadBack(t, ingress2, "")
		var answer testkit.ReadBackAnswer
		if st != http.StatusOK || json.Unmarshal(body, &answer) != nil {
			return false
		}
		ids := answer.IDs()
		slices.Sort(ids)
		return slices.Equal(ids, []string{"crashed", "kept"})
	})
	for _, d := range []*daemonProc{a2, b} {
		testkit.Eventually(t, "the expiry of crashed", func() bool { return procExpiry(d, "crashed") != nil })
	}
	took := time.Since(posted)
	if limit := (statetable.MinLeaseSeconds + restartLeaseGrace + 1) * time.Second; took > limit {
		t.Fatalf("the expiry reached both brokers %s after the post, over the lease plus the restart grace plus 1 s (%s)", took, limit)
	}
	t.Logf("a %d s lease across a kill -9 and restart: the job was failed at both brokers %s after it was posted", statetable.MinLeaseSeconds, took.Round(time.Millisecond))
	for _, d := range []*daemonProc{a2, b} {
		if got := procTerminalStates(d, "kept"); len(got) != 0 {
			t.Errorf("the unleased job got terminal states %v", got)
		}
	}
}

// 5,000 jobs posted and removed through the ingress, then the broker's
// replay of all of them (a store that had not yet applied the removals):
// none comes back at the peer. A removal holds its workload's id for its
// retention, two re-sync intervals (spec 5): the interval is raised so
// that the posts, slow on a loaded machine with the race detector, all
// fall within it, as a replay does within PAIR's 60 s.
func TestProcessFiveThousandIngressRemovalsThenAReplayBringNoneBack(t *testing.T) {
	t.Parallel()
	a, b, nodes, ingress := leaseProcPair(t, "--resync-interval", "10m")
	const jobs = 5000
	var wg sync.WaitGroup
	const workers = 4
	for w := range workers {
		wg.Go(func() {
			for i := w; i < jobs; i += workers {
				id := "r-" + itoa(i)
				if st, text := testkit.PostIngress(t, ingress, string(testframe.Lifecycle(leasedInfo(id, "running", 1), nil))); st != http.StatusOK {
					t.Errorf("post %s: %d %s", id, st, text)
					return
				}
				if st, text := testkit.PostIngress(t, ingress, fmt.Sprintf(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":%q}}`, id)); st != http.StatusOK {
					t.Errorf("remove %s: %d %s", id, st, text)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	b.WaitMethod(wireframe.MethodRemove, jobs)
	// The replay: each job's later event, so a peer's dedup cannot hide
	// one that came back; then a barrier behind them on the same channel.
	for i := range jobs {
		w := testframe.Workload("r-"+itoa(i), "running", nodes[0].ID, map[string]any{"seq": 2})
		a.send(string(testframe.Lifecycle(w, nil)))
	}
	a.send(testframe.LifecycleLine("barrier", "running", nodes[0].ID))
	b.WaitUpserts("barrier", 1)
	back := 0
	for _, w := range b.Upserts() {
		if id, _ := w["id"].(string); strings.HasPrefix(id, "r-") && w["seq"] == 2.0 {
			back++
		}
	}
	t.Logf("%d ingress removals, then a replay: %d came back at the peer", jobs, back)
	if back != 0 {
		t.Fatalf("%d of %d removed jobs came back with the replay", back, jobs)
	}
}

// The real binary killed after a 200 and started over a journal whose
// last record is torn (a crash in the middle of a write) logs one warning,
// keeps every whole record before it, and relays: the producer's job is
// still its own.
func TestProcessATornJournalTailIsOneWarningAndTheRecordsBeforeItStay(t *testing.T) {
	t.Parallel()
	nodes := writeCluster(t, 1)
	a := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0")
	a.WaitMethod("ready", 1)
	if st, text := testkit.PostIngress(t, a.loggedValue("local ingress listening", "addr"), string(testframe.Lifecycle(leasedInfo("job-1", "running", 1), nil))); st != http.StatusOK {
		t.Fatalf("post: %d %s", st, text)
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	path := filepath.Join(nodes[0].AppDir, journalFileName)
	journal, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A record's length and checksum, and half its payload: a torn write,
	// where the next record goes: over the zeros the daemon writes ahead of
	// its records (spec 5.3), which end its last one (a record ends in its
	// line's closing brace).
	end := len(bytes.TrimRight(journal, "\x00"))
	if _, err := f.WriteAt([]byte{200, 0, 0, 0, 1, 2, 3, 4, 'P', 1}, int64(end)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	a2 := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0")
	a2.WaitMethod("ready", 1)
	a2.waitLog("journal: dropped a torn or damaged tail", "bytesDropped=10")
	if got := strings.Count(a2.stderr.String(), "torn or damaged tail"); got != 1 {
		t.Fatalf("%d warnings, want one", got)
	}
	ingress := a2.loggedValue("local ingress listening", "addr")
	// The producer still owns job-1: its removal is taken, not 409.
	if st, text := testkit.PostIngress(t, ingress, `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-1"}}`); st != http.StatusOK {
		t.Fatalf("the producer's removal of its job after the restart: %d %s", st, text)
	}
}

// A producer that posts and removes (repeatedly) an id the broker uses
// later cannot silence the broker's own job of it: the real binary drops
// the broker's replay of the run the producer removed, but relays the new
// run the broker starts under that id to the peer.
func TestProcessAProducerThatRemovedAnIDCannotSilenceTheBrokersNewJobOfIt(t *testing.T) {
	t.Parallel()
	a, b, nodes, ingress := leaseProcPair(t)
	if st, text := testkit.PostIngress(t, ingress, string(testframe.Lifecycle(leasedInfo("proxy-7", "running", 1), nil))); st != http.StatusOK {
		t.Fatalf("post: %d %s", st, text)
	}
	b.WaitUpserts("proxy-7", 1)
	for range 3 {
		if st, text := testkit.PostIngress(t, ingress, `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"proxy-7"}}`); st != http.StatusOK {
			t.Fatalf("remove: %d %s", st, text)
		}
	}
	b.WaitMethod(wireframe.MethodRemove, 1)
	send := func(overrides map[string]any) {
		a.send(string(testframe.Lifecycle(testframe.Workload("proxy-7", "running", nodes[0].ID, overrides), nil)))
	}
	send(map[string]any{"seq": 2})                          // the replay of the removed run
	send(map[string]any{"runId": "broker-run-1", "seq": 1}) // the broker's own new job
	b.WaitUpserts("proxy-7", 2)
	a.send(testframe.LifecycleLine("barrier", "running", nodes[0].ID))
	b.WaitUpserts("barrier", 1)
	for _, w := range b.Upserts() {
		if w["id"] == "proxy-7" && w["runId"] == "run-proxy-7" && w["seq"] == 2.0 {
			t.Fatalf("the replay of the removed run came back at the peer: %v", w)
		}
	}
}
