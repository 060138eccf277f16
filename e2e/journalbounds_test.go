//go:build unix

package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/pairbroker"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/statejournal"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// The journal's bounds across kill -9 (issue 36): every record the table
// writes a restart restores, whatever the entry the live paths let in (a
// removal of more runs than a tombstone keeps, of runs whose fields are at
// their bound, a line as long as the ingress takes), and a version a
// crafted journal holds cannot wrap the next one to 0. Each is judged by
// what a 200 promised: a removal a returning member learns, a job its
// producer still owns.

// TestJournalARemovalOf65RunsSurvivesKill9AndDropsEachReplay: a producer's
// workload of 65 runs, removed (200) while B is away; A killed with SIGKILL
// and started again, its broker's replay of each run landing after the
// removal; B returns. B must not show the runs, and A must drop each
// replay (spec 3.5.3). Before, the tombstone's record held all 65 runs,
// which a restore refused.
func TestJournalARemovalOf65RunsSurvivesKill9AndDropsEachReplay(t *testing.T) {
	skipUnderShort(t)
	removedRunsAcrossKill(t, statetable.MaxRemovalRuns+1, func(tag string, i int) string { return tag + "-" + itoa(i) })
}

// TestJournalARemovalWhoseRunsPass2MiBSurvivesKill9: the same with 4,400
// runs whose engine and runId are at their bound (256 bytes): a tombstone
// of all of them would be 2.2 MiB, over the journal's record bound. Before,
// its append failed, the removal was answered 200 without a record, and
// every compaction failed on it.
func TestJournalARemovalWhoseRunsPass2MiBSurvivesKill9(t *testing.T) {
	skipUnderShort(t)
	const runs = 4400
	if size := runs * 2 * wireframe.MaxKeyFieldBytes; size <= statejournal.DefaultMaxRecordBytes {
		t.Fatalf("%d runs are %d bytes of fields: the test wants more than the journal's record bound", runs, size)
	}
	removedRunsAcrossKill(t, runs, func(tag string, i int) string {
		s := tag + "-" + itoa(i) + "-"
		return s + strings.Repeat("x", wireframe.MaxKeyFieldBytes-len(s))
	})
}

// removedRunsAcrossKill runs the scenario of the two tests above: n runs of
// one workload, each field(tag, i) for its engine and runId.
func removedRunsAcrossKill(t *testing.T, n int, field func(tag string, i int) string) {
	t.Helper()
	nodes := writeCluster(t, 2)
	// A 10 s heartbeat: a removal drops replays for its retention, two
	// intervals, which the kill and the restart take a fraction of.
	a := newPairNodeBroker(t, nodes[0], originFlags("10s")...)
	b := newPairNodeBroker(t, nodes[1])
	a.start()
	b.start()
	meet(t, a, b)
	const id = "many-runs"
	origin := nodes[0].ID
	held := func(s *pairbroker.Store) int {
		k := 0
		for _, r := range s.Snapshot() {
			if r.Origin == origin && r.ID == id {
				k++
			}
		}
		return k
	}
	p := newProducer(t, a.cur().loggedValue("local ingress listening", "addr"))
	p.warm(32)
	p.mustPostAll("a run", n, 32, func(i int) (string, []string) {
		w := testframe.Workload(id, "running", "", map[string]any{"originatedFrom": nil, "engine": field("engine", i), "runId": field("run", i)})
		return string(testframe.Lifecycle(w, nil)), nil
	})
	b.mustJobs(fmt.Sprintf("B's Jobs list to show the %d runs", n), func(s *pairbroker.Store) bool { return held(s) == n })
	// PAIR's broker replays its store to a restarted worker, and that
	// replay can land after a producer's removal (the ingress's
	// description, "Removal memory"): the replay of each run is taken as
	// A's broker would send it before the removal reached it.
	var stale []string
	for _, r := range a.jobs().Replay(origin, a.replayWindow) {
		if r.ID == id {
			stale = append(stale, string(wireframe.EncodeNotification(pairbroker.ReplayMethod(r.State), []byte(`{"workloadInfo":`+string(r.Info)+`}`))))
		}
	}
	if len(stale) != n {
		t.Fatalf("A's broker would replay %d of the %d runs", len(stale), n)
	}
	leave(t, a.cur())
	b.stop()
	if code, text := p.post(string(testframe.Removal(id, ""))); code != http.StatusOK {
		t.Fatalf("the removal of %d runs answered %d %q, want 200", n, code, text)
	}
	a.kill9()
	d := a.start()
	for _, line := range stale {
		d.send(line)
	}
	if refused, ends := d.loggedValue("journal read", "refused"), d.loggedValue("journal read", "ends"); refused != "0" || ends != "1" {
		t.Fatalf("A's restart refused %s records and restored %s ends: the removal's tombstone must restore", refused, ends)
	}
	testkit.Eventually(t, fmt.Sprintf("A to drop its broker's replay of each of the %d removed runs", n), func() bool {
		return strings.Count(d.stderr.String(), "outcome=replay_dropped") == n
	})
	b.start()
	meet(t, a, b)
	// A sends B what changed since its mark in version order: once B shows
	// a job posted after the replays, it has had every change before it.
	p = newProducer(t, d.loggedValue("local ingress listening", "addr"))
	if code, text := p.post(jobFrame("after", "running", 1)); code != http.StatusOK {
		t.Fatalf("a post after the restart answered %d %q", code, text)
	}
	b.mustJobs("B's Jobs list to show the job posted after the restart", func(s *pairbroker.Store) bool {
		return shown(shownStates(s, origin), "after") == "running"
	})
	if k := held(b.jobs()); k != 0 {
		t.Fatalf("B, back after A's kill -9, shows %d of the %d runs removed (answered 200) while it was away", k, n)
	}
}

// TestJournalTheLongestLineTheIngressTakesSurvivesKill9: with the largest
// params --workload-max-bytes allows, a producer's job whose line in the
// table (its re-assertion, the node's origin stamped) is longer than
// wireframe.MaxBytes is answered 200; A is killed with SIGKILL and started
// again with its broker's replay. The journal's record restores and the
// producer still owns its job. Before, a restore held a line to
// wireframe.MaxBytes, refused the record, and the replay made the job the
// broker's: the producer's end was 409.
func TestJournalTheLongestLineTheIngressTakesSurvivesKill9(t *testing.T) {
	skipUnderShort(t)
	nodes := writeCluster(t, 1)
	a := newPairNodeBroker(t, nodes[0], originFlags("10s", "--workload-max-bytes", itoa(wireframe.MaxWorkloadMaxBytes), "--broker-line-max", itoa(wireframe.MaxBrokerLineMax))...)
	a.start()
	body := func(pad int) string {
		w := leasedInfo("longest", "running", 1)
		w["pad"] = strings.Repeat("p", pad)
		return string(testframe.Lifecycle(w, nil))
	}
	tableLine := func(b string) int {
		f, err := wireframe.ParseIngress([]byte(b), nodes[0].ID, wireframe.MaxWorkloadMaxBytes)
		if err != nil {
			t.Fatal(err)
		}
		return len(statetable.ReassertionLine(f.Method, f.Life.Params))
	}
	// Five bytes past wireframe.MaxBytes: the marker adds 14 to the line
	// the broker replays, which must stay within its own bound to arrive.
	long := body(wireframe.MaxBytes + 5 - tableLine(body(0)))
	if n := tableLine(long); n <= wireframe.MaxBytes || len(long) > wireframe.MaxBytes {
		t.Fatalf("the body is %d bytes and its line %d: the test wants a body within wireframe.MaxBytes and a line past it", len(long), n)
	}
	p := newProducer(t, a.cur().loggedValue("local ingress listening", "addr"))
	if code, text := p.post(long); code != http.StatusOK {
		t.Fatalf("the longest body answered %d %q, want 200", code, text)
	}
	// The broker's store holds the job before its replay is measured (a
	// measure of nothing would pass): its object is the frame's without
	// the ingress mark, which would take the replay past the bound.
	testkit.Eventually(t, "the broker's store to hold the job", func() bool { return len(a.jobs().Replay(nodes[0].ID, a.replayWindow)) == 1 })
	for _, r := range a.jobs().Replay(nodes[0].ID, a.replayWindow) {
		replay := wireframe.EncodeNotification(pairbroker.ReplayMethod(r.State), []byte(`{"workloadInfo":`+string(r.Info)+`}`))
		if len(replay) > wireframe.MaxBytes {
			t.Fatalf("the broker's replay of the job is %d bytes: the test wants it within the broker's line bound (%d)", len(replay), wireframe.MaxBytes)
		}
	}
	a.kill9()
	d := a.start()
	if refused, runs := d.loggedValue("journal read", "refused"), d.loggedValue("journal read", "runs"); refused != "0" || runs != "1" {
		t.Fatalf("A's restart refused %s records and restored %s runs: the job's record must restore", refused, runs)
	}
	replayRead(t, d, 1)
	p = newProducer(t, d.loggedValue("local ingress listening", "addr"))
	if code, text := p.post(jobFrame("longest", "completed", 2)); code != http.StatusOK {
		t.Fatalf("the producer's end of its job after the restart answered %d %q, want 200", code, text)
	}
}

// TestJournalAVersionAt2To64Minus1CannotWrapTheNextOne: A's journal, a
// producer's removed job, is rewritten, CRC-valid, with the removal's
// version at 2^64-1 (a removal: the broker replays nothing of it, so the
// first change after the start is the producer's post); A starts, a producer's job is answered 200, A is killed with
// SIGKILL and started again with its broker's replay. The job's record
// restores and the producer still owns it. Before, the restored counter
// made the job's version 0, a restore refused its record, and the replay
// made the job the broker's: the producer's end was 409.
func TestJournalAVersionAt2To64Minus1CannotWrapTheNextOne(t *testing.T) {
	skipUnderShort(t)
	nodes := writeCluster(t, 1)
	a := newPairNodeBroker(t, nodes[0], originFlags("10s")...)
	a.start()
	p := newProducer(t, a.cur().loggedValue("local ingress listening", "addr"))
	for _, frame := range []string{jobFrame("crafted", "running", 1), string(testframe.Removal("crafted", ""))} {
		if code, text := p.post(frame); code != http.StatusOK {
			t.Fatalf("the first job answered %d %q", code, text)
		}
	}
	a.stop()
	rewriteLastPut(t, filepath.Join(nodes[0].AppDir, "workload-manager.journal"), math.MaxUint64)
	d := a.start()
	if refused := d.loggedValue("journal read", "refused"); refused != "1" {
		t.Fatalf("A's restart refused %s records: the crafted version must be refused", refused)
	}
	p = newProducer(t, d.loggedValue("local ingress listening", "addr"))
	if code, text := p.post(jobFrame("after", "running", 1)); code != http.StatusOK {
		t.Fatalf("the job after the crafted journal answered %d %q", code, text)
	}
	a.kill9()
	d = a.start()
	if runs := d.loggedValue("journal read", "runs"); runs != "1" {
		t.Fatalf("A's restart after the kill restored %s runs: the job answered 200 must be one", runs)
	}
	replayRead(t, d, 1)
	p = newProducer(t, d.loggedValue("local ingress listening", "addr"))
	if code, text := p.post(jobFrame("after", "completed", 2)); code != http.StatusOK {
		t.Fatalf("the producer's end of its job after the kill answered %d %q, want 200", code, text)
	}
}

// replayRead waits until d's table holds runs runs: its broker's replay of
// the jobs it holds has been read by then, whichever owner it left them, so
// a producer's frame after it meets the owner the replay left.
func replayRead(t *testing.T, d *daemonProc, runs int) {
	t.Helper()
	metrics := d.loggedValue("metrics endpoint listening", "addr")
	testkit.Eventually(t, fmt.Sprintf("A's table to hold %d runs after its broker's replay", runs), func() bool {
		v, ok := testkit.ScrapeAddr(t, metrics)["nvpair_wlm_resync_set_entries"]
		return ok && int(v) == runs
	})
}

// rewriteLastPut rewrites the journal at path with statejournal's own
// writer, its last put's version set to v: a put is a record whose first
// byte is 'P', then its version as a uvarint (spec 5.3, "Records").
func rewriteLastPut(t *testing.T, path string, v uint64) {
	t.Helper()
	var recs [][]byte
	j, err := statejournal.Open(path, statejournal.Options{}, func(p []byte) error {
		recs = append(recs, bytes.Clone(p))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	j, err = statejournal.Open(path, statejournal.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for i, rec := range recs {
		if len(rec) > 0 && rec[0] == 'P' {
			last = i
		}
	}
	if last < 0 {
		t.Fatal("the journal holds no put")
	}
	_, n := binary.Uvarint(recs[last][1:])
	recs[last] = append(binary.AppendUvarint([]byte{'P'}, v), recs[last][1+n:]...)
	for _, rec := range recs {
		if _, err := j.Append(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}
