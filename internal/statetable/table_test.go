package statetable

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"nvpair-workload-manager/internal/wireframe"
)

const self = "11111111-2222-3333-4444-555555555555"

// clock is a time that moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// memJournal keeps the records it is given, in order.
type memJournal struct {
	mu   sync.Mutex
	recs [][]byte
}

func (j *memJournal) Append(p []byte) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.recs = append(j.recs, append([]byte(nil), p...))
	return uint64(len(j.recs)), nil
}

func (j *memJournal) records() [][]byte {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.recs)
}

const retention = time.Minute

func newTable(t testing.TB, opts ...func(*Config)) (*Table, *clock, *memJournal) {
	t.Helper()
	c := &clock{t: time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)}
	j := &memJournal{}
	cfg := Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20,
		MemberClaim: time.Hour, Now: c.now, Journal: j}
	for _, o := range opts {
		o(&cfg)
	}
	return New(cfg), c, j
}

// event builds a lifecycle event of id in state, with extra members in its
// workloadInfo.
func event(t testing.TB, id, state string, extra ...string) *wireframe.Lifecycle {
	t.Helper()
	info := fmt.Sprintf(`{"id":%q,"model":"m","engine":"e","runId":"r-%s","state":%q,"originatedFrom":%q`, id, id, state, self)
	for _, x := range extra {
		info += "," + x
	}
	info += "}"
	method := map[string]string{"queued": wireframe.MethodSubmitted, "running": wireframe.MethodStarted, "completed": wireframe.MethodCompleted, "failed": wireframe.MethodErrored}[state]
	ev, err := wireframe.ParseLifecycle(method, json.RawMessage(`{"workloadInfo":`+info+`}`))
	if err != nil {
		t.Fatal(err)
	}
	return &ev
}

func removal(t testing.TB, id string) *wireframe.Removal {
	t.Helper()
	r, err := wireframe.ParseRemove(json.RawMessage(fmt.Sprintf(`{"workloadId":%q,"originatedFrom":%q}`, id, self)))
	if err != nil {
		t.Fatal(err)
	}
	return &r
}

func commit(t testing.TB, tb *Table, src Source, ev *wireframe.Lifecycle) Outcome {
	t.Helper()
	o, _ := tb.Commit(&Frame{Source: src, Life: ev})
	return o
}

func remove(t testing.TB, tb *Table, src Source, id string) Outcome {
	t.Helper()
	o, _ := tb.Commit(&Frame{Source: src, Removal: removal(t, id)})
	return o
}

// sent drains what m is sent: the fresh lines above its mark, as
// "id:state" or "id:removed", acknowledging them.
func sent(t testing.TB, tb *Table, m *Member) []string {
	t.Helper()
	var out []string
	for {
		r := tb.TakeAbove(m, 7, 1<<20)
		if len(r.Lines) == 0 {
			return out
		}
		for _, l := range r.Lines {
			out = append(out, describe(t, freshOf(l)))
		}
		tb.Ack(m, r.Versions[len(r.Versions)-1])
	}
}

func freshOf(l Line) []byte {
	h, tl := l.Fresh()
	return append(append([]byte(nil), h...), tl...)
}

func describe(t testing.TB, line []byte) string {
	t.Helper()
	var env struct {
		Method string `json:"method"`
		Params struct {
			Resync       *bool `json:"resync"`
			WorkloadID   string
			WorkloadInfo struct{ ID, State string }
		} `json:"params"`
	}
	if err := json.Unmarshal(line, &env); err != nil {
		t.Fatalf("line %s: %v", line, err)
	}
	if env.Params.Resync != nil {
		t.Fatalf("a fresh line carries the resync marker: %s", line)
	}
	if env.Method == wireframe.MethodRemove {
		return env.Params.WorkloadID + ":removed"
	}
	return env.Params.WorkloadInfo.ID + ":" + env.Params.WorkloadInfo.State
}

func TestCommitKeepsTheLatestStateOfARunWhateverTheArrivalOrder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		frames [][2]string // state, extra
		want   string
	}{
		{"queued then running", [][2]string{{"queued", ""}, {"running", ""}}, "j:running"},
		{"running then a late queued", [][2]string{{"running", ""}, {"queued", ""}}, "j:running"},
		{"completed then a late running", [][2]string{{"completed", ""}, {"running", ""}}, "j:completed"},
		{"a lower seq is older", [][2]string{{"running", `"seq":5`}, {"queued", `"seq":4`}}, "j:running"},
		{"a higher seq wins over rank", [][2]string{{"running", `"seq":5`}, {"queued", `"seq":6`}}, "j:queued"},
		{"a terminal correction", [][2]string{{"completed", ""}, {"failed", ""}}, "j:failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, _, _ := newTable(t)
			m := tb.Join("peer")
			for _, f := range tc.frames {
				var extra []string
				if f[1] != "" {
					extra = append(extra, f[1])
				}
				commit(t, tb, FromProducer, event(t, "j", f[0], extra...))
			}
			if got := sent(t, tb, m); !slices.Equal(got, []string{tc.want}) {
				t.Fatalf("the peer is sent %v, want [%s]: the latest state once", got, tc.want)
			}
		})
	}
}

func TestAPeerIsSentTheEntriesAboveItsMarkInVersionOrderEachAtItsLatestState(t *testing.T) {
	tb, _, _ := newTable(t)
	fast, slow := tb.Join("fast"), tb.Join("slow")
	commit(t, tb, FromBroker, event(t, "a", "queued"))
	commit(t, tb, FromBroker, event(t, "b", "running"))
	if got := sent(t, tb, fast); !slices.Equal(got, []string{"a:queued", "b:running"}) {
		t.Fatalf("fast: %v", got)
	}
	commit(t, tb, FromBroker, event(t, "a", "running"))
	commit(t, tb, FromBroker, event(t, "c", "running"))
	commit(t, tb, FromBroker, event(t, "a", "completed"))
	if got := sent(t, tb, fast); !slices.Equal(got, []string{"c:running", "a:completed"}) {
		t.Fatalf("fast after changes: %v", got)
	}
	// The slow peer took nothing so far: it gets each entry once, at its
	// latest state, never a:queued or a:running after a:completed.
	if got := sent(t, tb, slow); !slices.Equal(got, []string{"b:running", "c:running", "a:completed"}) {
		t.Fatalf("slow: %v", got)
	}
}

func TestAnEntryChangedWhileItsSendWasInFlightIsSentAgain(t *testing.T) {
	tb, _, _ := newTable(t)
	m := tb.Join("peer")
	commit(t, tb, FromBroker, event(t, "a", "running"))
	commit(t, tb, FromBroker, event(t, "b", "running"))
	r := tb.TakeAbove(m, 10, 1<<20)
	commit(t, tb, FromBroker, event(t, "a", "completed")) // while the request is in flight
	tb.Ack(m, r.Versions[len(r.Versions)-1])
	if got := sent(t, tb, m); !slices.Equal(got, []string{"a:completed"}) {
		t.Fatalf("after the ack: %v, want a:completed", got)
	}
}

func TestARemovalDeletesEveryRunAndIsSentAsATombstone(t *testing.T) {
	tb, _, _ := newTable(t)
	m := tb.Join("peer")
	commit(t, tb, FromProducer, event(t, "a", "running"))
	sent(t, tb, m)
	if o := remove(t, tb, FromProducer, "a"); o != Applied {
		t.Fatalf("removal: %s", o)
	}
	if lines, removed := tb.Latest(wireframe.WorkloadRef{Origin: self, ID: "a"}); len(lines) != 0 || !removed {
		t.Fatalf("after the removal: %d runs, removed %v", len(lines), removed)
	}
	late := tb.Join("late")
	if got := sent(t, tb, m); !slices.Equal(got, []string{"a:removed"}) {
		t.Fatalf("peer: %v", got)
	}
	if got := sent(t, tb, late); !slices.Equal(got, []string{"a:removed"}) {
		t.Fatalf("a member that joins after: %v", got)
	}
}

// A removal of a workload the table holds no run of is relayed (a peer may
// hold it), but its tombstone counts against a budget of its own: a flood
// of them never pushes out the end of a workload the node held.
func TestRemovalsOfUnheldWorkloadsAreRelayedButCannotPushOutARealEnd(t *testing.T) {
	tb, _, _ := newTable(t, func(c *Config) { c.MaxEndedBytes = 64 << 10 })
	m := tb.Join("away")
	commit(t, tb, FromProducer, event(t, "real", "completed"))
	for i := range 2000 {
		if o := remove(t, tb, FromProducer, fmt.Sprintf("ghost-%04d", i)); o != Applied {
			t.Fatalf("removal of an unheld id: %s", o)
		}
	}
	sz := tb.Sizes()
	if tb.Stats().Evicted.Load() != 0 || sz.EndedBytes == 0 || sz.UnheldBytes > (64<<10)/unheldShare {
		t.Fatalf("after 2,000 unheld removals: sizes %+v, evicted %d; want the real end kept and the unheld within their share", sz, tb.Stats().Evicted.Load())
	}
	got := sent(t, tb, m)
	if got[0] != "real:completed" || got[len(got)-1] != "ghost-1999:removed" {
		t.Fatalf("the member is sent %d entries, from %s to %s: want the real end and the newest removals", len(got), got[0], got[len(got)-1])
	}
}

func TestTheBrokersReplayOfARunAProducerRemovedIsDroppedButANewRunIsNot(t *testing.T) {
	tb, c, _ := newTable(t)
	commit(t, tb, FromProducer, event(t, "a", "running"))
	remove(t, tb, FromProducer, "a")
	if o := commit(t, tb, FromBroker, event(t, "a", "running")); o != ReplayDropped {
		t.Fatalf("the replay: %s, want replay_dropped", o)
	}
	other := event(t, "a", "running", `"runId":"new-run"`)
	other.Info.RunID = "new-run"
	if o := commit(t, tb, FromBroker, other); o != Applied {
		t.Fatalf("a new run under the id: %s", o)
	}
	c.advance(retention)
	tb.Prune()
	if o := commit(t, tb, FromBroker, event(t, "a", "running")); o != Applied {
		t.Fatalf("the replay after the retention: %s, want applied", o)
	}
}

// The seed's tombstone rule: an ingress removal's tombstone drops the
// broker's ordinary frames for its (origin, id), but a re-sync-tagged one
// is the broker's explicit re-assertion: it is taken, and every member is
// sent it with its marker, so the peers' dedup lets it through even where
// they saw the same frame before the removal.
func TestRemovalTombstoneDoesNotBlockResyncTaggedFrame(t *testing.T) {
	tb, _, _ := newTable(t)
	m := tb.Join("peer")
	commit(t, tb, FromProducer, event(t, "a", "running"))
	remove(t, tb, FromProducer, "a")
	sent(t, tb, m)
	if o := commit(t, tb, FromBroker, event(t, "a", "running")); o != ReplayDropped {
		t.Fatalf("the broker's ordinary frame: %s, want replay_dropped", o)
	}
	tagged := event(t, "a", "running")
	tagged.Resync = true
	if o := commit(t, tb, FromBroker, tagged); o != Applied {
		t.Fatalf("the broker's re-sync-tagged frame: %s, want applied", o)
	}
	r := tb.TakeAbove(m, 7, 1<<20)
	if len(r.Lines) != 1 || !strings.Contains(string(freshOf(r.Lines[0])), `"resync":true`) {
		t.Fatalf("the member is sent %d lines, the first %q: want the re-assertion with its marker", len(r.Lines), freshOf(r.Lines[0]))
	}
	tb.Ack(m, r.Versions[0])
	// A run's next ordinary frame goes as usual, without the marker.
	tagged = event(t, "b", "running")
	tagged.Resync = true
	commit(t, tb, FromBroker, tagged)
	commit(t, tb, FromBroker, event(t, "b", "completed"))
	r = tb.TakeAbove(m, 7, 1<<20)
	if len(r.Lines) != 1 || strings.Contains(string(freshOf(r.Lines[0])), "resync") {
		t.Fatalf("the run's ordinary frame after a re-assertion is sent as %q: want it without the marker", freshOf(r.Lines[0]))
	}
}

func TestAProducersFrameForABrokersWorkloadIsRefused(t *testing.T) {
	tb, c, _ := newTable(t)
	commit(t, tb, FromBroker, event(t, "b", "running"))
	ref := wireframe.WorkloadRef{Origin: self, ID: "b"}
	if err := tb.CheckProducer(ref); !IsBrokerOwned(err) {
		t.Fatalf("check: %v", err)
	}
	if o := commit(t, tb, FromProducer, event(t, "b", "completed")); o != BrokerTook {
		t.Fatalf("commit: %s", o)
	}
	commit(t, tb, FromBroker, event(t, "b", "completed"))
	c.advance(retention)
	tb.Prune()
	if err := tb.CheckProducer(ref); err != nil {
		t.Fatalf("the id after its end's retention: %v, want free", err)
	}
}

func TestAnEndIsForgottenOnlyOnceEveryMemberHasItAndItsRetentionPassed(t *testing.T) {
	tb, c, _ := newTable(t)
	a, b := tb.Join("a"), tb.Join("b")
	commit(t, tb, FromProducer, event(t, "j", "completed"))
	sent(t, tb, a)
	c.advance(retention)
	tb.Prune()
	if tb.Sizes().EndedBytes == 0 {
		t.Fatal("the end was forgotten before member b had it")
	}
	tb.Leave(b) // b leaves discovery: its claim stands
	c.advance(30 * time.Minute)
	tb.Prune()
	if tb.Sizes().EndedBytes == 0 {
		t.Fatal("the end was forgotten within the claim of a member that left")
	}
	b = tb.Join("b")
	if got := sent(t, tb, b); !slices.Equal(got, []string{"j:completed"}) {
		t.Fatalf("b back: %v", got)
	}
	tb.Prune()
	if got := tb.Sizes().EndedBytes; got != 0 {
		t.Fatalf("%d bytes of ends held once every member had them", got)
	}
}

func TestAMemberAwayPastItsClaimNoLongerHoldsEnds(t *testing.T) {
	tb, c, _ := newTable(t)
	a := tb.Join("a")
	commit(t, tb, FromProducer, event(t, "j", "completed"))
	tb.Leave(a)
	c.advance(time.Hour)
	tb.Prune()
	if tb.Sizes().EndedBytes != 0 || tb.Sizes().Members != 0 || tb.Stats().ClaimsExpired.Load() != 1 {
		t.Fatalf("sizes %+v, claims expired %d: want the claim and the end gone", tb.Sizes(), tb.Stats().ClaimsExpired.Load())
	}
}

// At the byte bound the oldest end goes out of the ended bytes; a member
// that lacks it still learns the run is over: the end stays, at its
// version, in its small form, until every member has it (spec 5.2).
func TestAtTheByteBoundTheOldestEndIsKeptSmallWhileAMemberLacksIt(t *testing.T) {
	tb, _, _ := newTable(t, func(c *Config) { c.MaxEndedBytes = 3000 })
	away := tb.Join("away")
	commit(t, tb, FromBroker, event(t, "live", "running"))
	sent(t, tb, away) // it has the live run; then it is away while the ends happen
	for i := range 20 {
		commit(t, tb, FromProducer, event(t, fmt.Sprintf("e-%02d", i), "completed", `"error":"a long text the small form leaves out"`))
	}
	if ev := tb.Stats().Evicted.Load(); ev == 0 || tb.Stats().Compacted.Load() != ev {
		t.Fatalf("%d ends evicted past the byte bound, %d kept small: want some, each kept small", ev, tb.Stats().Compacted.Load())
	}
	if got := tb.Sizes().EndedBytes; got > 3000 {
		t.Fatalf("%d bytes of ends held, over the bound", got)
	}
	var got []string
	for {
		r := tb.TakeAbove(away, 7, 1<<20)
		if len(r.Lines) == 0 {
			break
		}
		for _, l := range r.Lines {
			line := freshOf(l)
			got = append(got, describe(t, line))
			if small := strings.Contains(describe(t, line), "e-00"); small && bytes.Contains(line, []byte("long text")) {
				t.Fatalf("the evicted end is sent whole: %s", line)
			}
		}
		tb.Ack(away, r.Versions[len(r.Versions)-1])
	}
	want := make([]string, 20)
	for i := range want {
		want[i] = fmt.Sprintf("e-%02d:completed", i)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the member away is sent %v, want every end, the evicted ones in their small form, and nothing again", got)
	}
	tb.Prune()
	if s := tb.Sizes(); s.EndKeys != 0 || s.EndKeyBytes != 0 {
		t.Fatalf("%d small ends (%d bytes) held once every member had them", s.EndKeys, s.EndKeyBytes)
	}
}

// Past the bound on the small ends the oldest goes, counted, and a member
// that lacked it is sent the whole table from the start.
func TestPastTheKeyBoundTheOldestSmallEndGoesAndAMemberThatLackedItGetsTheWholeTable(t *testing.T) {
	tb, _, _ := newTable(t, func(c *Config) { c.MaxEndedBytes, c.MaxEndKeyBytes = 3000, 3000 })
	away := tb.Join("away")
	commit(t, tb, FromBroker, event(t, "live", "running"))
	sent(t, tb, away)
	for i := range 40 {
		commit(t, tb, FromProducer, event(t, fmt.Sprintf("e-%02d", i), "completed"))
	}
	if tb.Stats().KeysEvicted.Load() == 0 {
		t.Fatal("nothing evicted past the key bound")
	}
	if s := tb.Sizes(); s.EndKeyBytes > 3000 || s.EndKeys == 0 {
		t.Fatalf("%d small ends take %d bytes, want some within the 3000-byte bound", s.EndKeys, s.EndKeyBytes)
	}
	got := sent(t, tb, away)
	if got[0] != "live:running" || got[len(got)-1] != "e-39:completed" || slices.Contains(got, "e-00:completed") {
		t.Fatalf("the member that lacked an end evicted past the key bound is sent %v: want the whole table from the start, the evicted ends not among them", got)
	}
}

func TestLeasesAreArmedRenewedAndEndedOnTheirRuns(t *testing.T) {
	tb, c, _ := newTable(t)
	arm := func(id string, seconds int) {
		if o, _ := tb.Commit(&Frame{Source: FromProducer, Life: event(t, id, "running"), LeaseSeconds: seconds}); o != Applied {
			t.Fatalf("%s: %s", id, o)
		}
	}
	arm("a", 30)
	arm("b", 10)
	arm("c", 20)
	if at, _ := tb.NextLease(); !at.Equal(c.now().Add(10 * time.Second)) {
		t.Fatalf("the first deadline is %v", at)
	}
	arm("b", 60) // renewed later
	commit(t, tb, FromProducer, event(t, "c", "completed"))
	c.advance(time.Hour)
	var order []string
	for {
		l, ok := tb.DueLease(c.now())
		if !ok {
			break
		}
		order = append(order, l.Key.ID)
		tb.EndLease(l.Ref())
	}
	if !slices.Equal(order, []string{"a", "b"}) || tb.Stats().LeaseRenewed.Load() != 1 {
		t.Fatalf("leases due in order %v (renewed %d), want a then b, c ended by its terminal frame", order, tb.Stats().LeaseRenewed.Load())
	}
}

func TestTheJournalRebuildsWhatARestartNeeds(t *testing.T) {
	tb, c, j := newTable(t)
	m := tb.Join("peer")
	tb.Join("never-took") // joined, took nothing: it is still owed every end
	if o, _ := tb.Commit(&Frame{Source: FromProducer, Life: event(t, "leased", "running"), LeaseSeconds: 30}); o != Applied {
		t.Fatal(o)
	}
	commit(t, tb, FromBroker, event(t, "brokers", "running")) // the broker replays it: not journaled
	commit(t, tb, FromProducer, event(t, "ended", "completed"))
	commit(t, tb, FromProducer, event(t, "gone", "running"))
	remove(t, tb, FromProducer, "gone")
	sent(t, tb, m)
	tb.Prune() // the prune tick writes the marks that moved
	commit(t, tb, FromProducer, event(t, "after", "running"))

	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	st := again.Restore(j.records(), 5*time.Second)
	if st.Refused != 0 {
		t.Fatalf("restore refused %d records", st.Refused)
	}
	if again.Version() < tb.Version() {
		t.Fatalf("version %d after the restore, below %d: a new change could hide under a member's mark", again.Version(), tb.Version())
	}
	if at := again.LeaseOf(wireframe.WorkloadKey{Origin: self, Engine: "e", RunID: "r-leased", ID: "leased"}); at.IsZero() {
		t.Fatal("the producer's lease is gone")
	}
	if err := again.CheckProducer(wireframe.WorkloadRef{Origin: self, ID: "leased"}); err != nil {
		t.Fatalf("the producer no longer owns its job: %v", err)
	}
	if lines, _ := again.Latest(wireframe.WorkloadRef{Origin: self, ID: "brokers"}); len(lines) != 0 {
		t.Fatal("a broker's live run was restored: its broker replays it")
	}
	if o := commit(t, again, FromBroker, event(t, "gone", "running")); o != ReplayDropped {
		t.Fatalf("the replay of a removed run after the restart: %s", o)
	}
	if _, known := again.MemberMark("never-took"); !known {
		t.Fatal("a member that took nothing before the restart is forgotten: the ends it lacks could be forgotten before it returns")
	}
	// The member is sent only what it lacked: the change after its mark.
	peer := again.Join("peer")
	if got := sent(t, again, peer); !slices.Equal(got, []string{"after:running"}) {
		t.Fatalf("the peer after the restart is sent %v, want after:running alone", got)
	}
}

// A record that breaks a live path's bound is refused. One whose header
// breaks it (a lease, a field) never wins its key, so the run's older
// record is restored; one whose line is not its frame is found only when
// it wins its key (the line is parsed for the winner alone), and the run
// is then not restored (spec 5.3).
func TestARestoreEnforcesTheLivePathsBounds(t *testing.T) {
	tb, c, j := newTable(t)
	for _, id := range []string{"ok", "b0", "b1", "b2", "b3"} {
		if o, _ := tb.Commit(&Frame{Source: FromProducer, Life: event(t, id, "running"), LeaseSeconds: 30}); o != Applied {
			t.Fatal(o)
		}
	}
	good := j.records()
	var bad [][]byte
	for i, edit := range []func(e *entry){
		func(e *entry) { e.lease = &leaseState{seconds: 1 << 31} },                                         // a lease the ingress never allows
		func(e *entry) { e.key.ID = "other" },                                                              // a line that names another key
		func(e *entry) { e.line = []byte("not json") },                                                     // a line that is no frame
		func(e *entry) { e.key.ID = strings.Repeat("x", wireframe.MaxKeyFieldBytes+1); e.line = []byte{} }, // a field over its bound
	} {
		id := fmt.Sprintf("b%d", i)
		tb.mu.Lock()
		e := *tb.byKey[wireframe.WorkloadKey{Origin: self, Engine: "e", RunID: "r-" + id, ID: id}]
		tb.mu.Unlock()
		e.version += 10
		edit(&e)
		bad = append(bad, encodePut(nil, &e))
	}
	bad = append(bad, []byte{recPut, 0xff}, []byte{}, []byte{'?'})
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	st := again.Restore(append(good, bad...), 5*time.Second)
	if st.Refused != len(bad) || st.Runs != 4 {
		t.Fatalf("restore %+v: want %d refused and 4 runs: ok, and b0, b1, b3 from their older records", st, len(bad))
	}
	for id, want := range map[string]bool{"ok": true, "b0": true, "b1": true, "b2": false, "b3": true} {
		if got := again.HoldsRun(wireframe.WorkloadKey{Origin: self, Engine: "e", RunID: "r-" + id, ID: id}); got != want {
			t.Errorf("run %s restored: %v, want %v", id, got, want)
		}
	}
}

// A restore parses the line of each key's winning record alone: older
// records of a run, superseded, are never parsed (a line they hold that is
// not a frame is neither refused nor counted), and the newest is restored.
func TestARestoreParsesOnlyTheLineOfEachKeysWinner(t *testing.T) {
	tb, c, j := newTable(t)
	for seq := 1; seq <= 10; seq++ {
		if o, _ := tb.Commit(&Frame{Source: FromProducer, Life: event(t, "job", "running", fmt.Sprintf(`"seq":%d`, seq)), LeaseSeconds: 30}); o != Applied {
			t.Fatal(o)
		}
	}
	recs := j.records()
	for i := range recs[:len(recs)-1] {
		tb.mu.Lock()
		e := *tb.byKey[wireframe.WorkloadKey{Origin: self, Engine: "e", RunID: "r-job", ID: "job"}]
		tb.mu.Unlock()
		e.version = uint64(i + 1)
		e.line = []byte("not json: superseded")
		recs[i] = encodePut(nil, &e)
	}
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	st := again.Restore(recs, 5*time.Second)
	if st.Refused != 0 || st.Runs != 1 || st.Records != 10 {
		t.Fatalf("restore %+v: want 10 records, none refused, the run restored", st)
	}
	if lines, _ := again.Latest(wireframe.WorkloadRef{Origin: self, ID: "job"}); len(lines) != 1 || !strings.Contains(string(lines[0].Reassertion()), `"seq":10`) {
		t.Fatalf("restored %d lines, want the newest record's line", len(lines))
	}
}

func TestAHeartbeatPassVisitsEveryRunOnceAndSkipsThoseChangedSinceItBegan(t *testing.T) {
	tb, _, _ := newTable(t)
	for i := range 10 {
		commit(t, tb, FromBroker, event(t, fmt.Sprintf("p-%d", i), "running"))
	}
	var p Pass
	tb.BeginPass(&p)
	first, _ := tb.TakePass(&p, 3, 1<<20)
	commit(t, tb, FromBroker, event(t, "p-5", "completed")) // changed after the pass began: sent fresh
	remove(t, tb, FromBroker, "p-6")
	var rest [][]byte
	for {
		lines, done := tb.TakePass(&p, 3, 1<<20)
		rest = append(rest, lines...)
		if done {
			break
		}
	}
	if len(first)+len(rest) != 8 {
		t.Fatalf("the pass took %d runs, want the 8 unchanged", len(first)+len(rest))
	}
	for _, l := range append(first, rest...) {
		if !strings.Contains(string(l), `"params":{"resync":true,`) {
			t.Fatalf("a re-assertion without its marker: %s", l)
		}
	}
}

func TestPassesParkedOnARunThatLeavesMoveOnAndNoOtherPassMoves(t *testing.T) {
	tb, _, _ := newTable(t)
	for i := range 6 {
		commit(t, tb, FromBroker, event(t, fmt.Sprintf("p-%d", i), "running"))
	}
	var a, b, c, closed Pass
	for _, p := range []*Pass{&a, &b, &c, &closed} {
		tb.BeginPass(p)
	}
	tb.TakePass(&a, 2, 1<<20)      // parked on p-2
	tb.TakePass(&b, 2, 1<<20)      // parked on p-2
	tb.TakePass(&c, 4, 1<<20)      // parked on p-4
	tb.TakePass(&closed, 2, 1<<20) // parked on p-2, then closed
	tb.ClosePass(&closed)
	remove(t, tb, FromBroker, "p-2")
	rest := func(p *Pass) (ids []string) {
		for {
			lines, done := tb.TakePass(p, 1, 1<<20)
			for _, l := range lines {
				ids = append(ids, fmt.Sprint(strings.Contains(string(l), `"p-3"`), strings.Contains(string(l), `"p-4"`), strings.Contains(string(l), `"p-5"`)))
			}
			if done {
				return ids
			}
		}
	}
	want3 := []string{"true false false", "false true false", "false false true"}
	for name, p := range map[string]*Pass{"a": &a, "b": &b} {
		if got := rest(p); fmt.Sprint(got) != fmt.Sprint(want3) {
			t.Fatalf("pass %s parked on the removed run went on with %v, want p-3, p-4, p-5", name, got)
		}
	}
	if got := rest(&c); fmt.Sprint(got) != fmt.Sprint(want3[1:]) {
		t.Fatalf("a pass parked elsewhere went on with %v, want p-4, p-5", got)
	}
	if closed.next != nil || closed.parkedPrev != nil || closed.parkedNext != nil {
		t.Fatal("a closed pass is still parked")
	}
}

// BenchmarkRunLeavesWithPassesInProgress removes a run (and adds one
// back) while passes are in progress, one per reachable member, parked
// elsewhere: the cost must not grow with the passes (unlinkPass moves only
// the passes parked on the run that leaves).
func BenchmarkRunLeavesWithPassesInProgress(b *testing.B) {
	for _, passes := range []int{1, 2000} {
		b.Run(fmt.Sprintf("passes=%d", passes), func(b *testing.B) {
			tb, _, _ := newTable(b, func(c *Config) { c.MaxLive, c.MaxLiveBytes, c.Journal = 1<<20, 1<<30, nil })
			commit(b, tb, FromBroker, event(b, "first", "running"))
			ps := make([]Pass, passes)
			for i := range ps {
				tb.BeginPass(&ps[i])
				tb.TakePass(&ps[i], 0, 0) // placed, parked on "first"
			}
			up := event(b, "churn", "running")
			b.ResetTimer()
			for range b.N {
				commit(b, tb, FromBroker, up)
				remove(b, tb, FromBroker, "churn")
			}
		})
	}
}

// BenchmarkCommit commits to a table of 100,000 runs: a renewal of a held
// run (the lease renewal's path) and churn (a new run in, an old one
// removed), with 8 members; its heap bytes per entry are what each held run costs.
func BenchmarkCommit(b *testing.B) {
	const size = 100_000
	evs := make([]*wireframe.Lifecycle, size)
	for i := range evs {
		evs[i] = event(b, fmt.Sprintf("job-%06d", i), "running", `"requesterId":"bench"`)
	}
	b.Run("renew", func(b *testing.B) {
		tb, _, _ := newTable(b, func(c *Config) { c.MaxLive, c.MaxLiveBytes, c.Journal = size, 1<<30, nil })
		for range 8 {
			tb.Join(fmt.Sprintf("m-%d", len(tb.members)))
		}
		for _, ev := range evs {
			tb.Commit(&Frame{Source: FromProducer, Life: ev, LeaseSeconds: 60})
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			tb.Commit(&Frame{Source: FromProducer, Life: evs[i%64], LeaseSeconds: 60})
			i++
		}
	})
}

func TestAnEndPastItsRetentionNoLongerHoldsItsRun(t *testing.T) {
	tb, c, _ := newTable(t)
	m := tb.Join("peer")
	commit(t, tb, FromProducer, event(t, "j", "completed"))
	if o := commit(t, tb, FromProducer, event(t, "j", "running")); o != Stale {
		t.Fatalf("a late running frame within the retention: %s, want stale", o)
	}
	c.advance(retention)
	tb.Prune()
	if tb.HoldsRun(wireframe.WorkloadKey{Origin: self, Engine: "e", RunID: "r-j", ID: "j"}) {
		t.Fatal("the end still holds its run past its retention")
	}
	if o := commit(t, tb, FromProducer, event(t, "j", "running")); o != Applied {
		t.Fatalf("a frame for the run past the retention: %s, want applied", o)
	}
	if got := sent(t, tb, m); !slices.Equal(got, []string{"j:running"}) {
		t.Fatalf("the peer that lacked the end is sent %v, want the newer state alone", got)
	}
	if sz := tb.Sizes(); sz.Runs != 1 || sz.EndedBytes != 0 {
		t.Fatalf("sizes %+v: want one live run and no end", sz)
	}
}

func TestAMembersLagIsTheAgeOfTheOldestChangeItLacks(t *testing.T) {
	tb, c, _ := newTable(t)
	m := tb.Join("peer")
	if lag := tb.Lag(m); lag != 0 {
		t.Fatalf("lag of a member of an empty table: %v", lag)
	}
	commit(t, tb, FromBroker, event(t, "a", "running"))
	c.advance(5 * time.Second)
	commit(t, tb, FromBroker, event(t, "b", "running"))
	if lag := tb.Lag(m); lag != 5*time.Second {
		t.Fatalf("lag %v, want the 5 s since the oldest change it lacks", lag)
	}
	sent(t, tb, m)
	if lag := tb.Lag(m); lag != 0 {
		t.Fatalf("lag %v of a caught-up member, want 0", lag)
	}
}

// An end corrected again and again while a member is away leaves no trail:
// the table's queue of ends stays bounded by the ends it holds.
func TestAnEndCorrectedWhileAMemberIsAwayKeepsItsQueueBounded(t *testing.T) {
	tb, _, _ := newTable(t)
	tb.Join("away")
	// An older end the member lacks holds the front of the queue.
	commit(t, tb, FromProducer, event(t, "older", "completed"))
	for i := range 20_000 {
		state := []string{"completed", "failed"}[i%2]
		commit(t, tb, FromProducer, event(t, "j", state))
	}
	tb.mu.Lock()
	n := len(tb.ends.items)
	tb.mu.Unlock()
	if n > 2*endQueueSweepFloor {
		t.Fatalf("the queue of ends holds %d items for one end", n)
	}
}

// A held run keeps its key in bytes of its own, not the frame's: the
// frame's strings (its model, state, requester...) come in one allocation
// that a key sharing it would keep alive for as long as the run is held.
func TestAHeldRunKeepsItsKeyNotItsFramesStrings(t *testing.T) {
	tb, _, _ := newTable(t)
	ev := event(t, "j", "running", `"scheduledOn":"`+strings.Repeat("n", 200)+`"`)
	commit(t, tb, FromProducer, ev)
	framed := func(s string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		lo := uintptr(unsafe.Pointer(unsafe.StringData(ev.Info.ID)))
		return p >= lo && p < lo+512 || s == ""
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for k, e := range tb.byKey {
		for _, s := range []string{k.ID, k.RunID, k.Engine, e.key.ID, e.key.RunID, e.key.Engine} {
			if framed(s) {
				t.Errorf("the held key's %q is in the frame's allocation", s)
			}
		}
		if k.Origin != self || unsafe.StringData(k.Origin) != unsafe.StringData(tb.cfg.Self) {
			t.Errorf("origin %q does not share the node id's bytes", k.Origin)
		}
	}
	for r := range tb.byRef {
		if framed(r.ID) {
			t.Errorf("the workload's index keeps %q in the frame's allocation", r.ID)
		}
	}
}

func TestARunIDThatIsTheIDSharesItsBytes(t *testing.T) {
	tb, _, _ := newTable(t)
	k := tb.ownKey(wireframe.WorkloadKey{Origin: "other", Engine: "e", RunID: "same", ID: strings.Clone("same")})
	if k != (wireframe.WorkloadKey{Origin: "other", Engine: "e", RunID: "same", ID: "same"}) {
		t.Fatalf("key %+v", k)
	}
	if unsafe.StringData(k.RunID) != unsafe.StringData(k.ID) {
		t.Error("a run id equal to the id has bytes of its own")
	}
	if k := tb.ownKey(wireframe.WorkloadKey{Origin: self, Engine: "llamacpp", RunID: "r-1", ID: "job-1"}); k != (wireframe.WorkloadKey{Origin: self, Engine: "llamacpp", RunID: "r-1", ID: "job-1"}) {
		t.Errorf("a distinct run id: %+v", k)
	}
}

// discardJournal takes every record, as a journal that copies it does.
type discardJournal struct{}

func (discardJournal) Append([]byte) (uint64, error) { return 1, nil }

// A put's record is built in the table's own buffer, which the journal
// copies from: a renewal allocates its kept line and nothing per record.
func TestAPutBuildsItsRecordInTheTablesBuffer(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled values (the line's buffers)")
	}
	tb, _, _ := newTable(t, func(c *Config) { c.Journal = discardJournal{} })
	ev := event(t, "j", "running")
	f := &Frame{Source: FromProducer, Life: ev, LeaseSeconds: 60}
	tb.Commit(f)
	if n := testing.AllocsPerRun(100, func() { tb.Commit(f) }); n > 1 {
		t.Errorf("a renewal allocates %v times, want 1: its re-assertion line, which the run keeps", n)
	}
}

// A run's line is built in pooled buffers and copied out once, at its
// exact length: the one allocation is the line the run keeps.
func TestAReassertionLineIsOneAllocation(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled values")
	}
	params := json.RawMessage(`{"workloadInfo":{"id":"j","runId":"j","seq":2,"model":"m","engine":"e","state":"running","originatedFrom":"` + self + `"}}`)
	ReassertionLine(wireframe.MethodStarted, params)
	if n := testing.AllocsPerRun(100, func() { ReassertionLine(wireframe.MethodStarted, params) }); n != 1 {
		t.Errorf("a line costs %v allocations, want 1", n)
	}
	line := ReassertionLine(wireframe.MethodStarted, params)
	if want := `{"jsonrpc":"2.0","method":"workload:started","params":{"resync":true,"workloadInfo":`; !strings.HasPrefix(string(line), want) {
		t.Errorf("line %s", line)
	}
}

// HoldsRun reports whether the table holds run k within its retention.
func (t *Table) HoldsRun(k wireframe.WorkloadKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byKey[k]
	return e != nil && !e.retired
}
