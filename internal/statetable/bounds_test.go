package statetable

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/statejournal"
	"nvpair-workload-manager/internal/wireframe"
)

// The record's bounds (issue 36): every record the table writes is within
// the journal's record bound and restores as it was written; a removal of
// more runs than a tombstone keeps still drops each run's replay; a line
// over MaxLineBytes is not kept; a version past MaxVersion is refused.

// field is a value of exactly wireframe.MaxKeyFieldBytes, distinct by tag.
func field(tag string) string {
	return tag + strings.Repeat("x", wireframe.MaxKeyFieldBytes-len(tag))
}

// ingressFrame parses body as the ingress does (the largest params
// --workload-max-bytes allows, the node's origin stamped) and returns the
// table's frame for it, its line built as the ingress builds it.
func ingressFrame(t testing.TB, node string, body []byte) *Frame {
	t.Helper()
	f, err := wireframe.ParseIngress(body, node, wireframe.MaxWorkloadMaxBytes)
	if err != nil {
		t.Fatalf("the ingress refuses the frame: %v", err)
	}
	if f.Method == wireframe.MethodRemove {
		return &Frame{Source: FromProducer, Removal: &f.Removal, Line: wireframe.EncodeNotification(f.Method, f.Removal.Params)}
	}
	return &Frame{Source: FromProducer, Life: &f.Life, Line: ReassertionLine(f.Method, f.Life.Params)}
}

// padTo pads a frame built by build(pad) until it is exactly size bytes.
func padTo(t testing.TB, size int, build func(pad string) []byte) []byte {
	t.Helper()
	body := build(strings.Repeat("p", size-len(build(""))))
	if len(body) != size {
		t.Fatalf("padded frame is %d bytes, want %d", len(body), size)
	}
	return body
}

// TestTheLargestEntryIsOneRecordAndRestoresExactly builds the largest
// entries the live paths allow: every key field at its bound (the node's
// id too), a removal of MaxRemovalRuns runs whose engine and runId are at
// their bound, and the longest line, from an ingress body of
// wireframe.MaxBytes (the most any path takes) whose origin the ingress
// stamps; and a leased run with such a line. Each is appended to a real
// journal at its default record bound, and a restart restores each as it
// was written, byte for byte.
func TestTheLargestEntryIsOneRecordAndRestoresExactly(t *testing.T) {
	if MaxRecordBytes > statejournal.DefaultMaxRecordBytes {
		t.Fatalf("the table's largest record, %d bytes, is over the journal's bound of %d", MaxRecordBytes, statejournal.DefaultMaxRecordBytes)
	}
	node, id := field("node-"), field("id-")
	path := filepath.Join(t.TempDir(), "journal")
	j, err := statejournal.Open(path, statejournal.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)}
	cfg := Config{Self: node, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 30, MaxEndedBytes: 1 << 30, MemberClaim: time.Hour, Now: c.now}
	tb := New(cfg)
	tb.SetJournal(j)
	info := func(id string, i int) map[string]any {
		return testframe.Workload(id, "running", "", map[string]any{"originatedFrom": nil,
			"engine": field("engine-" + strconv.Itoa(i) + "-"), "runId": field("run-" + strconv.Itoa(i) + "-")})
	}
	for i := range MaxRemovalRuns {
		if o, _ := tb.Commit(ingressFrame(t, node, testframe.Lifecycle(info(id, i), nil))); o != Applied {
			t.Fatalf("run %d: %s", i, o)
		}
	}
	removal := padTo(t, wireframe.MaxBytes, func(pad string) []byte {
		return []byte(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"` + id + `","pad":"` + pad + `"}}`)
	})
	if o, _ := tb.Commit(ingressFrame(t, node, removal)); o != Applied {
		t.Fatalf("the removal: %s", o)
	}
	leased := padTo(t, wireframe.MaxBytes, func(pad string) []byte {
		w := info(field("leased-"), 0) // another workload: a producer's frame for the removed id ends its dropped replays
		w["pad"] = pad
		return testframe.Lifecycle(w, nil)
	})
	run := ingressFrame(t, node, leased)
	run.LeaseSeconds = MaxLeaseSeconds
	if o, _ := tb.Commit(run); o != Applied {
		t.Fatalf("the leased run: %s", o)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if n := tb.Stats().JournalFailed.Load(); n != 0 {
		t.Fatalf("%d records were not appended", n)
	}
	tb.mu.Lock()
	tomb := tb.removals[wireframe.WorkloadRef{Origin: node, ID: id}]
	big := tb.byKey[run.Life.Key()]
	tb.mu.Unlock()
	if len(tomb.runs) != MaxRemovalRuns {
		t.Fatalf("the tombstone keeps %d runs, want %d", len(tomb.runs), MaxRemovalRuns)
	}
	written := map[string][]byte{"the removal": encodePut(nil, tomb), "the leased run": encodePut(nil, big)}
	for what, rec := range written {
		if len(rec) > MaxRecordBytes {
			t.Fatalf("%s's record is %d bytes, over MaxRecordBytes (%d)", what, len(rec), MaxRecordBytes)
		}
		t.Logf("%s: a record of %d bytes (MaxRecordBytes %d, the journal's bound %d)", what, len(rec), MaxRecordBytes, statejournal.DefaultMaxRecordBytes)
	}

	var recs [][]byte
	j, err = statejournal.Open(path, statejournal.Options{}, func(p []byte) error {
		recs = append(recs, bytes.Clone(p))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	again := New(cfg)
	if st := again.Restore(recs, 5*time.Second); st.Refused != 0 || st.Runs != 1 || st.Ends != 1 {
		t.Fatalf("restore %+v: want the leased run and the removal, nothing refused", st)
	}
	again.mu.Lock()
	restored := map[string][]byte{
		"the removal":    encodePut(nil, again.removals[wireframe.WorkloadRef{Origin: node, ID: id}]),
		"the leased run": encodePut(nil, again.byKey[run.Life.Key()]),
	}
	again.mu.Unlock()
	for what, rec := range written {
		if string(restored[what]) != string(rec) {
			t.Fatalf("%s restores other than it was written (%d bytes written, %d restored)", what, len(rec), len(restored[what]))
		}
	}
}

// runsOf commits n producer runs of workload id, each its own engine and
// runId, and returns their frames.
func runsOf(t testing.TB, tb *Table, id string, n int) []*wireframe.Lifecycle {
	t.Helper()
	var evs []*wireframe.Lifecycle
	for i := range n {
		run := "run-" + strconv.Itoa(i)
		ev := event(t, id, "running", `"runId":"`+run+`"`)
		ev.Info.RunID = run
		if o := commit(t, tb, FromProducer, ev); o != Applied {
			t.Fatalf("run %d: %s", i, o)
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestARemovalOfMoreRunsThanATombstoneKeepsStillDropsEachRunsReplay: a
// producer removes a workload of MaxRemovalRuns+1 runs. Its tombstone
// keeps none, which stands for any: the broker's replay of each run is
// dropped for its retention, before a restart and after it, and the
// tombstone's record restores. One of MaxRemovalRuns keeps them all, and a
// new run the broker starts under the id is kept.
func TestARemovalOfMoreRunsThanATombstoneKeepsStillDropsEachRunsReplay(t *testing.T) {
	tb, c, j := newTable(t)
	evs := runsOf(t, tb, "many", MaxRemovalRuns+1)
	remove(t, tb, FromProducer, "many")
	for _, i := range []int{0, MaxRemovalRuns} {
		if o := commit(t, tb, FromBroker, evs[i]); o != ReplayDropped {
			t.Fatalf("the replay of run %d: %s, want replay_dropped", i, o)
		}
	}
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	if st := again.Restore(j.records(), 5*time.Second); st.Refused != 0 || st.Ends != 1 {
		t.Fatalf("restore %+v: the tombstone's record must restore", st)
	}
	for _, i := range []int{0, MaxRemovalRuns} {
		if o := commit(t, again, FromBroker, evs[i]); o != ReplayDropped {
			t.Fatalf("after the restart, the replay of run %d: %s, want replay_dropped", i, o)
		}
	}

	tb, _, _ = newTable(t)
	evs = runsOf(t, tb, "some", MaxRemovalRuns)
	remove(t, tb, FromProducer, "some")
	if o := commit(t, tb, FromBroker, evs[MaxRemovalRuns-1]); o != ReplayDropped {
		t.Fatalf("the replay of the last of %d runs: %s, want replay_dropped", MaxRemovalRuns, o)
	}
	other := event(t, "some", "running", `"runId":"new-run"`)
	other.Info.RunID = "new-run"
	if o := commit(t, tb, FromBroker, other); o != Applied {
		t.Fatalf("a new run under the id: %s, want applied", o)
	}
}

// TestATombstonesRunsCountInTheEndedBytes: the runs a tombstone keeps are
// its bytes too, so --max-ended-bytes bounds them.
func TestATombstonesRunsCountInTheEndedBytes(t *testing.T) {
	tb, _, _ := newTable(t)
	runsOf(t, tb, "w", MaxRemovalRuns)
	remove(t, tb, FromProducer, "w")
	tb.mu.Lock()
	r := tb.removals[wireframe.WorkloadRef{Origin: self, ID: "w"}]
	runBytes := 0
	for _, k := range r.runs {
		runBytes += len(k.engine) + len(k.runID)
	}
	lineAndKey := int64(len(r.line)+len(r.key.Origin)+len(r.key.ID)) + entryOverhead
	tb.mu.Unlock()
	if got, want := tb.Sizes().EndedBytes, lineAndKey+int64(runBytes); got != want {
		t.Fatalf("the ended bytes are %d, want %d: the line, the key and the overhead (%d) and the %d runs' %d bytes", got, want, lineAndKey, MaxRemovalRuns, runBytes)
	}
}

// TestABrokerLineOverMaxLineBytesIsNotKept: a broker frame whose params
// hold a resync member is re-encoded without it, and encoding/json writes
// each '<' as six bytes: a frame of 300 KB makes a line of 1.8 MB, which
// the table does not keep (its record would not restore). The run it
// updates is deleted rather than left at its older state.
func TestABrokerLineOverMaxLineBytesIsNotKept(t *testing.T) {
	tb, _, j := newTable(t, func(c *Config) { c.MaxLiveBytes = 1 << 30 })
	commit(t, tb, FromBroker, event(t, "b", "running"))
	params := `{"Resync":false,"workloadInfo":` + testframe.WorkloadJSON("b", "completed", self, `"runId":"r-b"`, `"engine":"e"`, `"pad":"`+strings.Repeat("<", 300_000)+`"`) + `}`
	ev, err := wireframe.ParseLifecycle(wireframe.MethodCompleted, json.RawMessage(params))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(ReassertionLine(ev.Method, ev.Params)); n <= MaxLineBytes {
		t.Fatalf("the line is %d bytes: the test wants one over MaxLineBytes (%d)", n, MaxLineBytes)
	}
	before := len(j.records())
	if o := commit(t, tb, FromBroker, &ev); o != LineTooLong {
		t.Fatalf("the frame: %s, want line_too_long", o)
	}
	if tb.HoldsRun(ev.Key()) || tb.Stats().Untracked.Load() != 1 {
		t.Fatalf("the run is still held, or the frame not counted untracked (%d)", tb.Stats().Untracked.Load())
	}
	for _, rec := range j.records()[before:] {
		if rec[0] == recPut {
			t.Fatalf("a put of %d bytes was written for the frame", len(rec))
		}
	}
}

// TestARestoreRefusesAVersionPastMaxVersion: a CRC-valid journal can hold
// any number; a put, a forget or a mark past MaxVersion is refused, so the
// counter restarts at most at MaxVersion and the next change's version is
// above every one restored, never 0.
func TestARestoreRefusesAVersionPastMaxVersion(t *testing.T) {
	tb, c, j := newTable(t)
	commit(t, tb, FromProducer, event(t, "ok", "running"))
	tb.Join("peer")
	recs := j.records()
	withVersion := func(rec []byte, v uint64) []byte {
		_, n := binary.Uvarint(rec[1:])
		return append(binary.AppendUvarint([]byte{rec[0]}, v), rec[1+n:]...)
	}
	put, ack := recs[0], recs[1]
	mark := func(v uint64) []byte {
		b := appendString([]byte{recAck}, "crafted")
		b = binary.AppendUvarint(b, v)
		return binary.AppendVarint(b, 0)
	}
	forget := func(v uint64) []byte {
		b := binary.AppendUvarint([]byte{recForget}, v)
		b = append(b, byte(kindLive))
		return appendKey(b, wireframe.WorkloadKey{Origin: self, Engine: "e", RunID: "r-ok", ID: "ok"})
	}
	crafted := [][]byte{withVersion(put, math.MaxUint64), withVersion(put, MaxVersion+1), mark(math.MaxUint64), forget(math.MaxUint64)}
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now, Journal: &memJournal{}})
	st := again.Restore(append([][]byte{put, ack}, crafted...), 5*time.Second)
	if st.Refused != len(crafted) || st.Runs != 1 {
		t.Fatalf("restore %+v: want the %d crafted records refused and the run kept", st, len(crafted))
	}
	if v := again.Version(); v != tb.Version() {
		t.Fatalf("the counter restarts at %d, want %d", v, tb.Version())
	}

	// At MaxVersion itself, the next change is above it.
	top := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now, Journal: &memJournal{}})
	if st := top.Restore([][]byte{withVersion(put, MaxVersion)}, 5*time.Second); st.Refused != 0 {
		t.Fatalf("restore %+v: a version at MaxVersion is taken", st)
	}
	commit(t, top, FromProducer, event(t, "next", "running"))
	if v := top.Version(); v != MaxVersion+1 {
		t.Fatalf("the next version after MaxVersion is %d", v)
	}
}
