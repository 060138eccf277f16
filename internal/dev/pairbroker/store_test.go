package pairbroker

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const (
	self = "self-node"
	peer = "peer-node"
)

// ev builds an incoming workload of origin/id in state at generation
// createdAt with seq (0: none) and scheduledOn on.
func ev(origin, id, state string, createdAt, seq int64, on string) Incoming {
	m := map[string]any{"id": id, "model": "m", "engine": "e", "runId": "r", "state": state,
		"originatedFrom": origin, "scheduledOn": on, "createdAt": createdAt}
	if seq > 0 {
		m["seq"] = seq
	}
	b, _ := json.Marshal(m)
	in, err := Parse(b)
	if err != nil {
		panic(err)
	}
	return in
}

// clock is a settable time source for a store.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newClockStore() (*Store, *clock) {
	c := &clock{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	return New(c.now), c
}

// TestApplyMergesLikePAIRsBroker holds each merge rule of PAIR's broker
// store: the first event's outcome and the state the store ends with.
func TestApplyMergesLikePAIRsBroker(t *testing.T) {
	type step struct {
		in       Incoming
		inferred bool
		want     Outcome
	}
	cases := []struct {
		name      string
		steps     []step
		wantState string
		wantInfer bool
	}{
		{"a new workload is added",
			[]step{{ev(peer, "j", "queued", 100, 0, peer), false, Added}}, "queued", false},
		{"a newer generation replaces, even a terminal record",
			[]step{{ev(peer, "j", "completed", 100, 0, peer), false, Added}, {ev(peer, "j", "queued", 200, 0, peer), false, NewerGeneration}}, "queued", false},
		{"an older generation is rejected",
			[]step{{ev(peer, "j", "queued", 200, 0, peer), false, Added}, {ev(peer, "j", "completed", 100, 0, peer), false, OlderGeneration}}, "queued", false},
		{"an older generation is rejected even inferred over inferred",
			[]step{{ev(peer, "j", "failed", 200, 0, peer), true, Added}, {ev(peer, "j", "failed", 100, 0, peer), true, OlderGeneration}}, "failed", true},
		{"the origin's event overrides a guess, even of a lower rank",
			[]step{{ev(peer, "j", "running", 100, 2, peer), false, Added}, {ev(peer, "j", "failed", 100, 2, peer), true, InferredFailed},
				{ev(peer, "j", "running", 100, 2, peer), false, OverInferred}}, "running", false},
		{"a guess keeps its record's seq: the origin's delayed lower one does not override it",
			[]step{{ev(peer, "j", "running", 100, 2, peer), false, Added}, {ev(peer, "j", "failed", 100, 2, peer), true, InferredFailed},
				{ev(peer, "j", "queued", 100, 1, peer), false, OlderThanGuess}}, "failed", true},
		{"a guess fails a live record",
			[]step{{ev(peer, "j", "running", 100, 0, peer), false, Added}, {ev(peer, "j", "failed", 100, 0, peer), true, InferredFailed}}, "failed", true},
		{"a guess never rewrites a terminal record",
			[]step{{ev(peer, "j", "completed", 100, 0, peer), false, Added}, {ev(peer, "j", "failed", 100, 0, peer), true, InferredOnTerminal}}, "completed", false},
		{"terminal posted before queued: the queued is rejected by seq",
			[]step{{ev(peer, "j", "completed", 100, 3, peer), false, Added}, {ev(peer, "j", "queued", 100, 1, peer), false, SeqNotHigher}}, "completed", false},
		{"terminal posted before queued, no seq: the queued is rejected by rank",
			[]step{{ev(peer, "j", "completed", 100, 0, peer), false, Added}, {ev(peer, "j", "queued", 100, 0, peer), false, LowerRank}}, "completed", false},
		{"running posted before queued: rejected by seq",
			[]step{{ev(peer, "j", "running", 100, 2, peer), false, Added}, {ev(peer, "j", "queued", 100, 1, peer), false, SeqNotHigher}}, "running", false},
		{"a higher seq replaces where the rank disagrees",
			[]step{{ev(peer, "j", "running", 100, 2, peer), false, Added}, {ev(peer, "j", "queued", 100, 3, peer), false, HigherSeq}}, "queued", false},
		{"an equal seq is a duplicate",
			[]step{{ev(peer, "j", "running", 100, 2, peer), false, Added}, {ev(peer, "j", "running", 100, 2, "other"), false, SeqNotHigher}}, "running", false},
		{"a terminal record is final even against a higher seq",
			[]step{{ev(peer, "j", "failed", 100, 3, peer), false, Added}, {ev(peer, "j", "completed", 100, 4, peer), false, SeqNotHigher}}, "failed", false},
		{"without seq a higher rank replaces",
			[]step{{ev(peer, "j", "queued", 100, 0, peer), false, Added}, {ev(peer, "j", "running", 100, 0, peer), false, HigherRank}}, "running", false},
		{"seq on one side only: the rank decides",
			[]step{{ev(peer, "j", "running", 100, 0, peer), false, Added}, {ev(peer, "j", "queued", 100, 5, peer), false, LowerRank}}, "running", false},
		{"an unknown state ranks below queued",
			[]step{{ev(peer, "j", "queued", 100, 0, peer), false, Added}, {ev(peer, "j", "paused", 100, 0, peer), false, LowerRank}}, "queued", false},
		{"an equal rank with another scheduledOn is applied",
			[]step{{ev(peer, "j", "running", 100, 0, peer), false, Added}, {ev(peer, "j", "running", 100, 0, "other"), false, Repointed}}, "running", false},
		{"an equal rank with the same scheduledOn is not",
			[]step{{ev(peer, "j", "running", 100, 0, peer), false, Added}, {ev(peer, "j", "running", 100, 0, peer), false, Unchanged}}, "running", false},
		{"two terminal states rank equal: the first stays",
			[]step{{ev(peer, "j", "cancelled", 100, 0, peer), false, Added}, {ev(peer, "j", "completed", 100, 0, peer), false, Unchanged}}, "cancelled", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, _ := newClockStore()
			for i, st := range c.steps {
				var got Outcome
				if st.inferred {
					got = s.ApplyInferred(st.in)
				} else {
					got = s.Apply(st.in)
				}
				if got != st.want {
					t.Fatalf("step %d (%s, inferred %v): %v, want %v", i, st.in.State, st.inferred, got, st.want)
				}
			}
			r, ok := s.Get(peer, "j")
			if !ok || r.State != c.wantState || r.Inferred != c.wantInfer {
				t.Fatalf("record %+v, want state %s inferred %v", r, c.wantState, c.wantInfer)
			}
		})
	}
}

// The key is (origin, engine, runId, id): the same id of another origin,
// engine or run is another workload.
func TestTheKeyIsOriginEngineRunAndID(t *testing.T) {
	s, _ := newClockStore()
	base := map[string]any{"id": "7", "model": "m", "engine": "e", "runId": "r", "state": "running", "originatedFrom": peer, "createdAt": 1}
	for _, change := range []map[string]any{{}, {"originatedFrom": self}, {"engine": "e2"}, {"runId": "r2"}} {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range change {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		in, err := Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Apply(in); got != Added {
			t.Errorf("%v: %v, want added as its own workload", change, got)
		}
	}
	if s.Len() != 4 {
		t.Fatalf("%d records, want 4", s.Len())
	}
	// A removal drops every record of (origin, id), whatever its engine,
	// run or generation, and nothing else.
	if n := s.Remove(peer, "7"); n != 3 {
		t.Fatalf("removed %d, want the 3 records of (%s, 7)", n, peer)
	}
	if _, ok := s.Get(self, "7"); !ok || s.Len() != 1 {
		t.Fatal("the removal took another origin's workload")
	}
	if n := s.Remove(peer, "7"); n != 0 {
		t.Errorf("a repeated removal removed %d", n)
	}
}

func TestParseRefusesAnObjectWithoutItsIdentityAndReadsNullsAsAbsent(t *testing.T) {
	for _, bad := range []string{`{}`, `{"id":"x","state":"queued"}`, `{"originatedFrom":"o","state":"queued"}`, `[]`} {
		if _, err := Parse(json.RawMessage(bad)); err == nil {
			t.Errorf("Parse(%s) accepted", bad)
		}
	}
	// A workload without a state is PAIR's broker's too (ParseIncoming asks
	// only for id and originatedFrom): it ranks below queued and is live.
	if in, err := Parse(json.RawMessage(`{"id":"x","originatedFrom":"o"}`)); err != nil || in.State != "" {
		t.Errorf("Parse without a state: %+v, %v", in, err)
	}
	in, err := Parse(json.RawMessage(`{"id":"x","state":"queued","originatedFrom":"o","runId":null,"scheduledOn":null,"createdAt":null,"seq":null}`))
	if err != nil || in.RunID != "" || in.CreatedAt != 0 || in.Seq != 0 {
		t.Fatalf("Parse with nulls: %+v, %v", in, err)
	}
}

// The sweep fails a foreign live record its origin has not re-asserted for
// the budget; the heartbeat's no-op re-assertions keep a record fresh; own
// records, terminal records and colliding (origin, id) pairs are left.
func TestSweepStaleFailsOnlySilentForeignLiveRecords(t *testing.T) {
	s, c := newClockStore()
	const budget = 10 * time.Second
	s.Apply(ev(peer, "silent", "running", 1, 0, peer))
	s.Apply(ev(peer, "heartbeat", "running", 1, 0, peer))
	s.Apply(ev(peer, "done", "completed", 1, 0, peer))
	s.Apply(ev(self, "mine", "running", 1, 0, self))
	s.Apply(ev(peer, "runs-here", "queued", 1, 0, self))
	// two live runs of one (origin, id): ambiguous to a client
	for _, run := range []string{"a", "b"} {
		b, _ := json.Marshal(map[string]any{"id": "twin", "engine": "e", "runId": run, "state": "running", "originatedFrom": peer, "createdAt": 1})
		in, _ := Parse(b)
		s.Apply(in)
	}
	c.t = c.t.Add(budget - time.Millisecond)
	if got := s.SweepStale(self, budget, "stale"); len(got) != 0 {
		t.Fatalf("swept %v before the budget", got)
	}
	if s.Apply(ev(peer, "heartbeat", "running", 1, 0, peer)) != Unchanged {
		t.Fatal("a re-assertion changed the record")
	}
	c.t = c.t.Add(time.Millisecond)
	got := s.SweepStale(self, budget, "origin silent")
	var ids []string
	for _, r := range got {
		ids = append(ids, r.ID)
		var w struct{ State, Error string }
		json.Unmarshal(r.Info, &w)
		if !r.Inferred || r.State != "failed" || w.State != "failed" || w.Error != "origin silent" {
			t.Errorf("swept %s as %+v (info %s), want an inferred failed with the reason", r.ID, r, r.Info)
		}
	}
	if fmt.Sprint(ids) != "[runs-here silent]" {
		t.Fatalf("swept %v, want [runs-here silent]", ids)
	}
	if got := s.SweepStale(self, budget, "again"); len(got) != 0 {
		t.Errorf("a second sweep failed %v again", got)
	}
	// The origin comes back: its word undoes the guess.
	if got := s.Apply(ev(peer, "silent", "running", 1, 0, peer)); got != OverInferred {
		t.Fatalf("the origin's re-assertion after the sweep: %v", got)
	}
}

// A guess never counts as a sighting: a record failed by inference and
// then re-asserted stays fresh only from the re-assertion on.
func TestAGuessIsNoSighting(t *testing.T) {
	s, c := newClockStore()
	s.Apply(ev(peer, "j", "running", 1, 0, peer))
	seen := c.t
	c.t = c.t.Add(time.Minute)
	s.ApplyInferred(ev(peer, "j", "failed", 1, 0, peer))
	if r, _ := s.Get(peer, "j"); !r.LastSeen.Equal(seen) {
		t.Fatalf("LastSeen %v after a guess, want the origin's %v", r.LastSeen, seen)
	}
	// An older generation is no sighting either.
	s2, c2 := newClockStore()
	s2.Apply(ev(peer, "j", "running", 500, 0, peer))
	seen = c2.t
	c2.t = c2.t.Add(time.Minute)
	s2.Apply(ev(peer, "j", "running", 100, 0, peer))
	if r, _ := s2.Get(peer, "j"); !r.LastSeen.Equal(seen) {
		t.Fatalf("LastSeen %v after an older generation, want %v", r.LastSeen, seen)
	}
}

// A node that leaves discovery has the live records it originated or runs
// failed by inference, this node's own that it ran included
// (workloadstore.ActiveForNode); its finished records stay.
func TestFailNodeFailsTheDepartedNodesLiveRecords(t *testing.T) {
	s, _ := newClockStore()
	s.Apply(ev(peer, "live", "running", 1, 0, peer))
	s.Apply(ev(peer, "queued", "queued", 1, 0, peer))
	s.Apply(ev(peer, "done", "completed", 1, 0, peer))
	s.Apply(ev("third", "runs-on-peer", "running", 1, 0, peer))
	s.Apply(ev(self, "mine-on-peer", "running", 1, 0, peer))
	s.Apply(ev("third", "elsewhere", "running", 1, 0, "third"))
	got := s.FailNode(peer, "node left")
	var ids []string
	for _, r := range got {
		ids = append(ids, r.ID)
	}
	if fmt.Sprint(ids) != "[live queued mine-on-peer runs-on-peer]" {
		t.Fatalf("failed %v", ids)
	}
	for id, want := range map[string]string{"done": "completed", "elsewhere": "running"} {
		for _, o := range []string{peer, "third"} {
			if r, ok := s.Get(o, id); ok && r.State != want {
				t.Errorf("%s is %s, want %s", id, r.State, want)
			}
		}
	}
	if r, _ := s.Get(self, "mine-on-peer"); r.State != "failed" || !r.Inferred {
		t.Errorf("own record run by the departed node not failed by inference: %+v", r)
	}
}

// The replay is every live own record and the own records finished on the
// origin's word within the window, oldest first: never a peer's, never a
// guess, never an older terminal.
func TestReplayIsOwnLiveAndRecentTerminalRecords(t *testing.T) {
	s, c := newClockStore()
	nowMs := c.t.UnixMilli()
	withDone := func(in Incoming, doneMs int64) Incoming {
		var m map[string]any
		json.Unmarshal(in.Info, &m)
		m["completedAt"] = doneMs
		b, _ := json.Marshal(m)
		out, _ := Parse(b)
		return out
	}
	s.Apply(ev(self, "live", "running", 3, 0, self))
	s.Apply(ev(self, "queued", "queued", 1, 0, self))
	s.Apply(withDone(ev(self, "recent", "completed", 2, 0, self), nowMs-59_000))
	s.Apply(withDone(ev(self, "old", "failed", 2, 0, self), nowMs-61_000))
	s.Apply(ev(self, "no-completedAt", "cancelled", 4, 0, self)) // finished now, by the store's clock
	s.Apply(ev(peer, "peers", "running", 1, 0, peer))
	s.Apply(ev(self, "guessed", "running", 1, 0, self))
	s.ApplyInferred(ev(self, "guessed", "failed", 1, 0, self))
	var got []string
	for _, r := range s.Replay(self, ReplayWindow) {
		got = append(got, r.ID+":"+ReplayMethod(r.State))
	}
	want := "[queued:workload:submitted recent:workload:completed live:workload:started no-completedAt:workload:errored]"
	if fmt.Sprint(got) != want {
		t.Fatalf("replay %v, want %s", got, want)
	}
	c.t = c.t.Add(ReplayWindow + time.Second)
	got = nil
	for _, r := range s.Replay(self, ReplayWindow) {
		got = append(got, r.ID)
	}
	if fmt.Sprint(got) != "[queued live]" {
		t.Fatalf("replay a window later %v, want only the live ones", got)
	}
}

func TestStopClosesStdinThenTerminatesThenKills(t *testing.T) {
	run := func(exitOn string) ([]string, StopResult) {
		done := make(chan struct{})
		var calls []string
		act := func(name string) func() error {
			return func() error {
				calls = append(calls, name)
				if name == exitOn {
					close(done)
				}
				return nil
			}
		}
		// A grace of 1 ms keeps the test quick; SignalGrace applies after
		// each signal.
		r := Stop(act("close"), act("term"), act("kill"), done, time.Millisecond)
		return calls, r
	}
	for _, c := range []struct {
		exitOn string
		want   string
		result StopResult
	}{
		{"close", "[close]", ExitedOnEOF},
		{"term", "[close term]", ExitedOnTerm},
		{"kill", "[close term kill]", Killed},
	} {
		calls, r := run(c.exitOn)
		if fmt.Sprint(calls) != c.want || r != c.result {
			t.Errorf("exit on %s: calls %v result %v, want %s %v", c.exitOn, calls, r, c.want, c.result)
		}
	}
	if StopGrace != 3*time.Second || SignalGrace != 2*time.Second {
		t.Errorf("graces %s/%s, want PAIR's 3s and 2s", StopGrace, SignalGrace)
	}
}

// PAIR's broker reads a line of LineMax bytes, newline included, and stops
// for good at a longer one: nothing after it is read.
func TestReadLinesStopsForGoodOnALineOverLineMax(t *testing.T) {
	fits := strings.Repeat("a", LineMax-1) + "\n"
	over := strings.Repeat("b", LineMax) + "\n"
	var got []int
	err := ReadLines(strings.NewReader("x\r\n"+fits+over+"after\n"), func(l []byte) { got = append(got, len(l)) })
	if !errors.Is(err, ErrLineTooLong) || fmt.Sprint(got) != fmt.Sprint([]int{1, LineMax - 1}) {
		t.Fatalf("read lines of %v, then %v; want [1 %d], then ErrLineTooLong", got, err, LineMax-1)
	}
	got = nil
	if err := ReadLines(strings.NewReader(fits+"last"), func(l []byte) { got = append(got, len(l)) }); err != nil || len(got) != 2 {
		t.Fatalf("read lines of %v, then %v; want two lines and no error", got, err)
	}
}
