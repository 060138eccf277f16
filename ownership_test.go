package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/statejournal"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// An ingress removal of an id the node does not hold is relayed (a peer
// may hold it), but no producer owned it, so the broker's own job of that
// id is not silenced.
func TestOwnershipIngressRemovalOfAnUnheldIDIsRelayedButSilencesNothing(t *testing.T) {
	n, q := ifxNode(t)
	if _, err := n.m.ingestLocal(testframe.Removal("ghost", "")); err != nil {
		t.Fatal(err)
	}
	if got := ifxDrain(q); len(got) != 1 {
		t.Fatalf("sent %s, want the removal", ifxDescribe(got))
	}
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("ghost", "running", n.id))))
	if got := ifxDrain(q); len(got) != 1 || !ifxIsTracked(n, n.id, "ghost") {
		t.Fatalf("the broker's own job of that id was silenced: queued %s", ifxDescribe(got))
	}
}

// A producer's job whose last run has ended past its retention is
// nobody's: the broker's later job of that id is the
// broker's, and the producer's frame for it is refused.
func TestOwnershipEndsWhenTheSetDropsTheWorkloadsLastRun(t *testing.T) {
	n, q := ifxNode(t)
	clock := ifxUseClock(n)
	ifxOwn(t, n, q, "job-1")
	if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("completed"), testframe.WorkloadJSON("job-1", "completed", "", `"seq":2`)))); err != nil {
		t.Fatal(err)
	}
	clock.advance(2 * n.m.cfg.ResyncInterval)
	n.m.pruneTable()
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", n.id))))
	if _, err := n.m.ingestLocal(testframe.Removal("job-1", "")); !statetable.IsBrokerOwned(err) {
		t.Fatalf("a producer's removal of the broker's later job of its old id: %v, want 409", err)
	}
}

// ownBrokerRunJSON is a lifecycle line from the broker for run runID of id.
func ownBrokerRunJSON(id, runID, origin string) string {
	info := fmt.Sprintf(`{"id":%q,"model":"qwen3.5-9b","engine":"llamacpp","state":"running","runId":%q,"originatedFrom":%q}`, id, runID, origin)
	return string(wireframe.EncodeNotification(testframe.MethodFor("running"), json.RawMessage(`{"workloadInfo":`+info+`}`)))
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
	if _, err := n.m.ingestLocal(testframe.Removal("proxy-7", "")); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)
	for i := range 3 {
		clock.advance(n.m.cfg.ResyncInterval)
		if _, err := n.m.ingestLocal(testframe.Removal("proxy-7", "")); err != nil {
			t.Fatalf("repeated removal %d: %v", i, err)
		}
		ifxDrain(q)
	}
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("proxy-7", "running", n.id))))
	if got := ifxDrain(q); len(got) != 1 || !ifxIsTracked(n, n.id, "proxy-7") {
		t.Fatalf("the broker's own job silenced by repeated removals: queued %s, tracked %v", ifxDescribe(got), ifxIsTracked(n, n.id, "proxy-7"))
	}
}

// The removal memory drops only the broker's replay of a run the producer
// removed: a new run the broker starts under the same id, within the
// window, is the broker's own job, tracked and relayed.
func TestOwnershipRemovalMemoryDropsOnlyTheRemovedRunsReplay(t *testing.T) {
	n, q := ifxNode(t)
	if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("proxy-7", "running", "", `"runId":"producer-run"`)))); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)
	if _, err := n.m.ingestLocal(testframe.Removal("proxy-7", "")); err != nil {
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
		{"report", testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("proxy-9", "running", ""))},
		{"removal", string(testframe.Removal("proxy-9", ""))},
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
			n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("proxy-9", "running", n.id))))
			close(g.release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			got := ifxDrain(q)
			owned := n.m.table.CheckProducer(wireframe.WorkloadRef{Origin: n.id, ID: "proxy-9"}) == nil
			if owned || !ifxIsTracked(n, n.id, "proxy-9") || len(got) != 1 || got[0].method == wireframe.MethodRemove {
				t.Fatalf("the broker's job after a racing ingress %s: owned by the producer %v, tracked %v, queued %s", tc.name, owned, ifxIsTracked(n, n.id, "proxy-9"), ifxDescribe(got))
			}
		})
	}
}

// startWithJournal starts a test node with its ingress on and, as its
// journal, a real one in a temporary directory wrapped by wrap: a stand-in
// that holds, fails or refuses what the test needs. The journal is given
// before the start (no JournalPath: Run opens none).
func startWithJournal(t *testing.T, wrap func(journalFile) journalFile) *testNode {
	t.Helper()
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	f, err := statejournal.Open(filepath.Join(t.TempDir(), journalFileName), statejournal.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.m.journal.use(wrap(f))
	n.start()
	return n
}

// heldJournal is a journal whose Wait is held until released: a stand-in
// for a slow disk, to see what an answer waits for.
type heldJournal struct {
	journalFile
	waiting chan uint64   // each Wait's sequence, as it starts
	release chan struct{} // closed to let every Wait return
}

func (j *heldJournal) Wait(seq uint64) error {
	j.waiting <- seq
	<-j.release
	return j.journalFile.Wait(seq)
}

// An ingress 200 is a promise (spec 5.3): the answer waits until the
// frame's journal record is durable, not only until it is committed.
func TestAnIngress200WaitsForItsJournalRecord(t *testing.T) {
	j := &heldJournal{waiting: make(chan uint64, 1), release: make(chan struct{})}
	n := startWithJournal(t, func(f journalFile) journalFile { j.journalFile = f; return j })
	answered := make(chan int, 1)
	go func() {
		st, _ := testkit.PostIngress(t, n.m.IngressAddr(), string(testframe.Lifecycle(leasedInfo("durable", "running", 1), nil)))
		answered <- st
	}()
	select {
	case seq := <-j.waiting:
		if seq == 0 {
			t.Fatal("the frame's record has no sequence")
		}
	case st := <-answered:
		t.Fatalf("answered %d without waiting for the journal", st)
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("the post neither waited for the journal nor was answered")
	}
	select {
	case st := <-answered:
		t.Fatalf("answered %d while its journal record was not yet durable", st)
	case <-time.After(100 * time.Millisecond):
	}
	close(j.release)
	if st := <-answered; st != http.StatusOK {
		t.Fatalf("answered %d once durable, want 200", st)
	}
}

// refusingJournal is a journal that takes no record (closed, or a record
// over its bound): a stand-in for Append's refusals.
type refusingJournal struct{ journalFile }

func (refusingJournal) Append([]byte) (uint64, error) { return 0, statejournal.ErrClosed }

// A frame whose record the journal refused is applied but not answered
// 200 (spec 5.3): there is no record for the answer to count on, so its
// wait fails rather than pass as "no record needed".
func TestAFrameWhoseRecordTheJournalRefusesIsNotAnswered200(t *testing.T) {
	n := startWithJournal(t, func(f journalFile) journalFile { return refusingJournal{f} })
	st, text := testkit.PostIngress(t, n.m.IngressAddr(), string(testframe.Lifecycle(leasedInfo("unrecorded", "running", 1), nil)))
	if st != http.StatusInternalServerError || !strings.Contains(text, "not durable") {
		t.Fatalf("a frame whose record the journal refused answered %d %q, want 500 not durable", st, text)
	}
}

// failingFirstGroup stands in for a journal whose first group fails and is
// cut back: that record is not in the file and its Wait fails.
type failingFirstGroup struct {
	journalFile
	mu     sync.Mutex
	failed uint64 // the failed record's sequence, once appended
}

func (j *failingFirstGroup) Append(b []byte) (uint64, error) {
	seq, err := j.journalFile.Append(b)
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failed == 0 && err == nil {
		j.failed = seq
	}
	return seq, err
}

func (j *failingFirstGroup) Wait(seq uint64) error {
	j.mu.Lock()
	failed := j.failed
	j.mu.Unlock()
	if seq == failed {
		return errors.New("injected: the group's fsync failed")
	}
	return j.journalFile.Wait(seq)
}

// A producer's frame that changes nothing (an older state of a job the
// table holds) is answered on the record of the state it stands on: 500
// when that record's group failed, never a 200 for a job of which the
// journal holds nothing.
func TestAStaleIngressFrameIsNot200WhenTheHeldStatesRecordFailed(t *testing.T) {
	n := startWithJournal(t, func(f journalFile) journalFile { return &failingFirstGroup{journalFile: f} })
	if st, text := testkit.PostIngress(t, n.m.IngressAddr(), string(testframe.Lifecycle(leasedInfo("stale", "running", 2), nil))); st != http.StatusInternalServerError {
		t.Fatalf("the frame whose group failed answered %d %q, want 500", st, text)
	}
	if st, text := testkit.PostIngress(t, n.m.IngressAddr(), string(testframe.Lifecycle(leasedInfo("stale", "queued", 1), nil))); st == http.StatusOK {
		t.Fatalf("an older state of a job whose record failed answered 200 %q", text)
	}
}

// Without a fault: the frame that changes nothing is answered only once
// the record of the state it stands on is durable.
func TestAStaleIngressFrameWaitsForTheHeldStatesRecord(t *testing.T) {
	j := &heldJournal{waiting: make(chan uint64, 4), release: make(chan struct{})}
	n := startWithJournal(t, func(f journalFile) journalFile { j.journalFile = f; return j })
	newer := make(chan int, 1)
	go func() {
		st, _ := testkit.PostIngress(t, n.m.IngressAddr(), string(testframe.Lifecycle(leasedInfo("held", "running", 2), nil)))
		newer <- st
	}()
	held := <-j.waiting // the newer state's record is appended, not yet durable
	older := make(chan int, 1)
	go func() {
		st, _ := testkit.PostIngress(t, n.m.IngressAddr(), string(testframe.Lifecycle(leasedInfo("held", "queued", 1), nil)))
		older <- st
	}()
	select {
	case seq := <-j.waiting:
		if seq != held {
			t.Fatalf("the older frame waits on record %d, want the held state's %d", seq, held)
		}
	case st := <-older:
		t.Fatalf("the older frame answered %d before the held state's record was durable", st)
	}
	close(j.release)
	if a, b := <-newer, <-older; a != http.StatusOK || b != http.StatusOK {
		t.Fatalf("once durable: %d and %d, want 200 and 200", a, b)
	}
}

// A frame waiting for its journal record's fsync no longer waits on the
// broker, so it holds none of the broker waiters' slots (0049): more
// producers than the bound wait on one slow fsync together, none refused
// 503, and one group can take them all.
func TestFramesWaitingOnTheJournalHoldNoBrokerWaiterSlot(t *testing.T) {
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	f, err := statejournal.Open(filepath.Join(t.TempDir(), journalFileName), statejournal.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const posts = brokerio.WaitersMax + 8
	j := &heldJournal{journalFile: f, waiting: make(chan uint64, posts), release: make(chan struct{})}
	n.m.journal.use(j)
	n.start()
	answered := make(chan int, posts)
	for i := range posts {
		go func() {
			st, _ := testkit.PostIngress(t, n.m.IngressAddr(), string(testframe.Lifecycle(leasedInfo("held-"+strconv.Itoa(i), "running", 1), nil)))
			answered <- st
		}()
	}
	for range posts {
		select {
		case <-j.waiting:
		case st := <-answered:
			t.Fatalf("a post was answered %d while the journal held every wait", st)
		case <-time.After(testkit.WaitTimeout):
			t.Fatalf("fewer than %d posts reached the journal's wait: the broker waiters' slots held them", posts)
		}
	}
	close(j.release)
	for range posts {
		if st := <-answered; st != http.StatusOK {
			t.Fatalf("answered %d once durable, want 200", st)
		}
	}
}
