package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/ownjournal"
	"nvpair-workload-manager/internal/wireframe"
)

// withJournal gives the node an ownership journal in its own directory.
func withJournal(path string, maxBytes int) nodeOption {
	return func(c *Config) { c.JournalPath, c.JournalMaxBytes = path, maxBytes }
}

// An ingress removal of an id the node does not hold is relayed, but not
// remembered: no producer owned it, and remembering it would silence the
// broker's own job of that id.
func TestOwnershipIngressRemovalOfAnUnheldIDIsRelayedButNotRemembered(t *testing.T) {
	n, q := ifxNode(t)
	if _, err := n.m.ingestLocal([]byte(ifxRemoveJSON("ghost", ""))); err != nil {
		t.Fatal(err)
	}
	if got := ifxDrain(q); len(got) != 1 {
		t.Fatalf("queued %s, want the removal", ifxDescribe(got))
	}
	if ifxRememberedCount(n) != 0 {
		t.Fatal("a removal of an id no producer owned was remembered")
	}
	n.m.handleLine([]byte(ifxStdioLifecycleJSON("ghost", "running", n.id, false)))
	if got := ifxDrain(q); len(got) != 1 || !ifxIsTracked(n, n.id, "ghost") {
		t.Fatalf("the broker's own job of that id was silenced: queued %s", ifxDescribe(got))
	}
}

// A producer's job whose last run the re-sync set drops (its terminal
// retention passed) is nobody's: the broker's later job of that id is the
// broker's, and the producer's frame for it is refused.
func TestOwnershipEndsWhenTheSetDropsTheWorkloadsLastRun(t *testing.T) {
	n, q := ifxNode(t)
	clock := ifxUseClock(n)
	ifxOwn(t, n, q, "job-1")
	if _, err := n.m.ingestLocal([]byte(ifxLifecycleJSON("job-1", "completed", "", `"seq":2`))); err != nil {
		t.Fatal(err)
	}
	clock.advance(2 * n.m.cfg.ResyncInterval)
	n.m.pruneResync()
	n.m.activeMu.Lock()
	owned := n.m.own.len()
	n.m.activeMu.Unlock()
	if owned != 0 {
		t.Fatalf("%d workloads owned after the job's last run was pruned, want 0", owned)
	}
	n.m.handleLine([]byte(ifxStdioLifecycleJSON("job-1", "running", n.id, false)))
	if _, err := n.m.ingestLocal([]byte(ifxRemoveJSON("job-1", ""))); !isNotOwned(err) {
		t.Fatalf("a producer's removal of the broker's later job of its old id: %v, want 409", err)
	}
}

// A journal that is not one the daemon wrote is one warning and a fresh
// start; the next write replaces it with a whole one.
func TestJournalCorruptIsOneWarningAndAFreshStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), ownjournal.FileName)
	if err := os.WriteFile(path, []byte("nvpair-wlm-journal v1 crc32c=00000000 bytes=99\n{\"owned\":[[\"x\""), 0o600); err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t, withJournal(path, 0))
	n.start()
	if got := strings.Count(n.logs.String(), "ownership journal unusable"); got != 1 || !n.logs.contains("level=WARN", "torn write") {
		t.Fatalf("%d warnings for a torn journal, want one naming it torn:\n%s", got, n.logs.String())
	}
	if _, err := n.m.ingestLocal([]byte(ifxLifecycleJSON("job-1", "running", ""))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the journal to be written whole", func() bool {
		s, err := ownjournal.Read(path, ownjournal.DefaultMaxBytes)
		return err == nil && len(s.Owned) == 1 && s.Owned[0].ID == "job-1"
	})
}

// At its byte bound the journal keeps what fits, counts what it left out
// and stays within the bound.
func TestJournalAtItsBoundOmitsAndCounts(t *testing.T) {
	path := filepath.Join(t.TempDir(), ownjournal.FileName)
	const bound = 1024
	n := newTestNode(t, withJournal(path, bound))
	q := ifxCaptureQueue(n)
	for i := range 40 {
		ifxOwn(t, n, q, "job-"+itoa(i))
	}
	n.m.writeJournal()
	st, err := os.Stat(path)
	if err != nil || st.Size() > bound {
		t.Fatalf("journal %v, %v: want it within %d bytes", st, err, bound)
	}
	s, err := ownjournal.Read(path, bound)
	if err != nil {
		t.Fatal(err)
	}
	omitted := int(n.m.journal.omitted.Load())
	if omitted == 0 || len(s.Owned)+omitted != 40 {
		t.Fatalf("kept %d, omitted %d of 40", len(s.Owned), omitted)
	}
	var page strings.Builder
	if err := n.m.writeMetrics(&page); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "\nnvpair_wlm_journal_entries_omitted_total "+itoa(omitted)+"\n") {
		t.Fatal("the omitted entries are not in the metrics")
	}
	if !n.logs.contains("level=WARN", "ownership journal at its byte bound") {
		t.Fatal("no warning at the bound")
	}
}

// A lease restored from the journal is armed when the broker replays its
// job: a deadline still ahead is kept; one that passed while the daemon
// was down runs out the restart grace after the replay, so a producer that
// outlived the restart has time to renew.
func TestJournalRestoredLeaseIsArmedOnTheReplayWithTheRestartGrace(t *testing.T) {
	n, _ := ifxNode(t)
	clock := ifxUseClock(n)
	now := clock.now()
	ahead, passed := now.Add(20*time.Second), now.Add(-time.Hour)
	n.m.activeMu.Lock()
	n.m.own.restored = map[wireframe.WorkloadRef]restoredOwn{
		{Origin: n.id, ID: "ahead"}:  {seconds: 30, deadline: ahead},
		{Origin: n.id, ID: "passed"}: {seconds: 30, deadline: passed},
	}
	n.m.activeMu.Unlock()
	for _, id := range []string{"ahead", "passed"} {
		n.m.handleLine([]byte(ifxStdioLifecycleJSON(id, "running", n.id, false)))
	}
	for id, want := range map[string]time.Time{"ahead": ahead, "passed": now.Add(restartLeaseGrace * time.Second)} {
		ref := wireframe.WorkloadRef{Origin: n.id, ID: id}
		seconds, got := n.m.leases.leaseOf(ref)
		if seconds != 30 || !got.Equal(want) {
			t.Errorf("%s: lease of %d s to %v, want 30 s to %v", id, seconds, got, want)
		}
	}
	n.m.activeMu.Lock()
	owned, restored := len(n.m.own.owned), len(n.m.own.restored)
	n.m.activeMu.Unlock()
	if owned != 2 || restored != 0 {
		t.Fatalf("after the replay %d owned and %d still restored, want 2 and 0", owned, restored)
	}
}

// A journal that cannot be written (here its directory is a file: the
// temporary file cannot be made, whoever runs the test) is counted and
// warned, and the daemon goes on; that a failed write leaves the previous
// journal whole is the atomic write's (TestWriteReplacesWholeAndReadsBack).
func TestJournalWriteFailureIsCountedAndWarned(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "app")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t, withJournal(filepath.Join(notDir, ownjournal.FileName), 0))
	q := ifxCaptureQueue(n)
	ifxOwn(t, n, q, "job-1")
	n.m.writeJournal()
	n.m.writeJournal()
	if n.m.journal.failures.Load() != 2 || n.m.journal.writes.Load() != 0 {
		t.Fatalf("failed writes: %d counted, %d writes, want 2 and 0", n.m.journal.failures.Load(), n.m.journal.writes.Load())
	}
	if got := strings.Count(n.logs.String(), "ownership journal not written"); got != 1 || !n.logs.contains("level=WARN", "not a directory") {
		t.Fatalf("%d warnings for two failed writes within 10 s, want one naming the reason:\n%s", got, n.logs.String())
	}
}

// ownBrokerRunJSON is a lifecycle line from the broker for run runID of id.
func ownBrokerRunJSON(id, runID, origin string) string {
	info := fmt.Sprintf(`{"id":%q,"model":"qwen3.5-9b","engine":"llamacpp","state":"running","runId":%q,"originatedFrom":%q}`, id, runID, origin)
	return string(wireframe.EncodeNotification(methodFor("running"), json.RawMessage(`{"workloadInfo":`+info+`}`)))
}

// A producer that posts and removes an id the broker will use later, then
// repeats the removal, cannot keep the id remembered past the window of
// the removal it owned: a repeat of an id no one owns is relayed but not
// remembered, so the broker's own job of that id is tracked and relayed
// once the window has passed.
func TestOwnershipARepeatedRemovalDoesNotKeepASquattedIDSilenced(t *testing.T) {
	n, q := ifxNode(t)
	clock := ifxUseClock(n)
	ifxOwn(t, n, q, "proxy-7")
	if _, err := n.m.ingestLocal([]byte(ifxRemoveJSON("proxy-7", ""))); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)
	for i := range 3 {
		clock.advance(n.m.resync.retention / 2)
		if _, err := n.m.ingestLocal([]byte(ifxRemoveJSON("proxy-7", ""))); err != nil {
			t.Fatalf("repeated removal %d: %v", i, err)
		}
		ifxDrain(q)
	}
	n.m.handleLine([]byte(ifxStdioLifecycleJSON("proxy-7", "running", n.id, false)))
	if got := ifxDrain(q); len(got) != 1 || !ifxIsTracked(n, n.id, "proxy-7") {
		t.Fatalf("the broker's own job silenced by repeated removals: queued %s, tracked %v", ifxDescribe(got), ifxIsTracked(n, n.id, "proxy-7"))
	}
}

// The removal memory drops only the broker's replay of a run the producer
// removed: a new run the broker starts under the same id, within the
// window, is the broker's own job, tracked and relayed.
func TestOwnershipRemovalMemoryDropsOnlyTheRemovedRunsReplay(t *testing.T) {
	n, q := ifxNode(t)
	if _, err := n.m.ingestLocal([]byte(ifxLifecycleJSON("proxy-7", "running", "", `"runId":"producer-run"`))); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)
	if _, err := n.m.ingestLocal([]byte(ifxRemoveJSON("proxy-7", ""))); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)
	n.m.handleLine([]byte(ownBrokerRunJSON("proxy-7", "producer-run", n.id)))
	if got := ifxDrain(q); len(got) != 0 || ifxIsTracked(n, n.id, "proxy-7") {
		t.Fatalf("the replay of the removed run came back: queued %s", ifxDescribe(got))
	}
	n.m.handleLine([]byte(ownBrokerRunJSON("proxy-7", "broker-run", n.id)))
	if got := ifxDrain(q); len(got) != 1 || !ifxIsTracked(n, n.id, "proxy-7") {
		t.Fatalf("the broker's new run of a removed id silenced: queued %s, tracked %v", ifxDescribe(got), ifxIsTracked(n, n.id, "proxy-7"))
	}
}

// ownGate holds the first ingress frame's broker write until released, so
// a test can commit a broker frame between an ingress frame's ownership
// check and its commit.
type ownGate struct {
	w       io.Writer
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *ownGate) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"method":"`+wireframe.MethodUpsert+`"`)) || bytes.Contains(p, []byte(`"method":"`+wireframe.MethodRemove+`"`)) {
		g.once.Do(func() {
			close(g.entered)
			<-g.release
		})
	}
	return g.w.Write(p)
}

// An ingress frame checked while its id was free, whose commit comes
// after the broker's own frame for the id, does not take the broker's
// workload over, and a removal in that window neither untracks the
// broker's job nor retires it at the peers: the frame is not tracked or
// relayed, and the workload stays the broker's.
func TestOwnershipAFrameCheckedBeforeTheBrokerTookTheIDDoesNotTakeItOver(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"report", ifxLifecycleJSON("proxy-9", "running", "")},
		{"removal", ifxRemoveJSON("proxy-9", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &ownGate{entered: make(chan struct{}), release: make(chan struct{})}
			n, q := ifxNode(t, func(c *Config) { g.w = c.Out; c.Out = g })
			done := make(chan error, 1)
			go func() {
				_, err := n.m.ingestLocal([]byte(tc.body))
				done <- err
			}()
			<-g.entered
			n.m.handleLine([]byte(ifxStdioLifecycleJSON("proxy-9", "running", n.id, false)))
			close(g.release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			got := ifxDrain(q)
			ref := wireframe.WorkloadRef{Origin: n.id, ID: "proxy-9"}
			n.m.activeMu.Lock()
			owned := n.m.own.owns(ref)
			n.m.activeMu.Unlock()
			if owned || !ifxIsTracked(n, n.id, "proxy-9") || len(got) != 1 || got[0].method == wireframe.MethodRemove {
				t.Fatalf("the broker's job after a racing ingress %s: owned by the producer %v, tracked %v, queued %s", tc.name, owned, ifxIsTracked(n, n.id, "proxy-9"), ifxDescribe(got))
			}
		})
	}
}

// At its bound the journal keeps leased workloads before unleased ones,
// whatever the maps' order, and copies no more under activeMu than the
// bound can hold.
func TestJournalKeepsLeasedFirstAtTheBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), ownjournal.FileName)
	const bound = 1024
	n := newTestNode(t, withJournal(path, bound))
	q := ifxCaptureQueue(n)
	for i := range 200 {
		ifxOwn(t, n, q, "job-"+itoa(i))
	}
	if _, err := n.m.ingestLocalLeased([]byte(ifxLifecycleJSON("leased-1", "running", "")), []string{"30"}); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		s, omitted := n.m.journalSnapshot()
		if c := cap(s.Owned); c > bound/ownjournal.MinCost {
			t.Fatalf("the snapshot reserved room for %d entries under activeMu, the bound holds at most %d", c, bound/ownjournal.MinCost)
		}
		if len(s.Owned)+omitted != 201 {
			t.Fatalf("kept %d, omitted %d of 201", len(s.Owned), omitted)
		}
		file, _ := ownjournal.Encode(s, bound)
		d, err := ownjournal.Decode(file, bound)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Owned) == 0 || d.Owned[0].ID != "leased-1" || d.Owned[0].LeaseSeconds != 30 {
			t.Fatalf("the leased workload is not kept first at the bound: %d kept, first %+v", len(d.Owned), d.Owned[:min(1, len(d.Owned))])
		}
	}
}

// A journal the daemon cannot use (here a newer version's, after a
// downgrade) is moved aside before the fresh start, replacing one moved
// aside earlier, so the next write does not destroy it.
func TestJournalUnusableIsSetAsideNotOverwritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), ownjournal.FileName)
	newer := []byte("nvpair-wlm-journal v2 crc32c=00000000 bytes=2\n{}")
	if err := os.WriteFile(path+".unusable", []byte("an earlier one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, newer, 0o600); err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t, withJournal(path, 0))
	n.start()
	if !n.logs.contains("level=WARN", "ownership journal unusable", "kept_as="+path+".unusable") {
		t.Fatalf("the warning does not say where the journal was kept:\n%s", n.logs.String())
	}
	if _, err := n.m.ingestLocal([]byte(ifxLifecycleJSON("job-1", "running", ""))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new journal to be written", func() bool {
		s, err := ownjournal.Read(path, ownjournal.DefaultMaxBytes)
		return err == nil && len(s.Owned) == 1
	})
	if b, err := os.ReadFile(path + ".unusable"); err != nil || !bytes.Equal(b, newer) {
		t.Fatalf("the unusable journal set aside holds %q, %v; want the newer version's file", b, err)
	}
}

// Times in the future in the journal (a clock stepped back since the
// write, an edited file) are clamped at its read: a lease's deadline to at
// most its length from now, a removal's time to at most now, so neither
// outlives its window.
func TestJournalFutureTimesAreClampedAtTheRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), ownjournal.FileName)
	n := newTestNode(t, withJournal(path, 0))
	clock := ifxUseClock(n)
	now := clock.now()
	future := now.Add(24 * time.Hour).UnixMilli()
	file, _ := ownjournal.Encode(ownjournal.State{
		Owned:   []ownjournal.Owned{{Origin: "node-x", ID: "leased", LeaseSeconds: 30, LeaseDeadline: future}},
		Removed: []ownjournal.Removed{{Origin: "node-x", ID: "gone", At: future}},
	}, ownjournal.DefaultMaxBytes)
	if err := ownjournal.Write(path, file); err != nil {
		t.Fatal(err)
	}
	n.start()
	n.m.activeMu.Lock()
	defer n.m.activeMu.Unlock()
	if got, want := n.m.own.restored[wireframe.WorkloadRef{Origin: "node-x", ID: "leased"}].deadline, now.Add(30*time.Second); !got.Equal(want) {
		t.Errorf("restored lease deadline %v, want it clamped to %v", got, want)
	}
	e := n.m.removed.index[wireframe.WorkloadRef{Origin: "node-x", ID: "gone"}]
	if e == nil {
		t.Fatal("the removal was not restored")
	}
	if got := e.Value.(removalEntry).at; !got.Equal(now) {
		t.Errorf("restored removal at %v, want it clamped to %v", got, now)
	}
}
