package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

var resyncT0 = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

func TestResyncSetTracksTheLatestEventPerRun(t *testing.T) {
	s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
	s.trackT(ptr(mustLifecycle(t, workload("job-1", "queued", "node-a"), nil)), resyncT0)
	s.trackT(ptr(mustLifecycle(t, workload("job-1", "running", "node-a", map[string]any{"seq": 2}), nil)), resyncT0)
	s.trackT(ptr(mustLifecycle(t, workload("job-2", "queued", "node-a"), nil)), resyncT0)

	got := snapshotStates(t, s, resyncT0)
	want := map[string]string{"job-1": "running/" + wireframe.MethodStarted, "job-2": "queued/" + wireframe.MethodSubmitted}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("snapshot = %v, want %v", got, want)
	}
	if s.len() != 2 {
		t.Fatalf("len = %d, want 2", s.len())
	}
}

func TestResyncSetKeysOnOriginEngineRunAndID(t *testing.T) {
	s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
	for _, w := range []map[string]any{
		workload("job-1", "running", "node-a"),
		workload("job-1", "running", "node-b"),                                                 // other origin
		workload("job-1", "running", "node-a", map[string]any{"engine": "vllm"}),               // other engine
		workload("job-1", "running", "node-a", map[string]any{"runId": "run-2"}),               // other run
		workload("job-1", "running", "node-a", map[string]any{"runId": nil}),                   // no run id
		workload("job-1", "completed", "node-a", map[string]any{"seq": 9, "scheduledOn": "x"}), // same key as the first
	} {
		if !s.trackT(ptr(mustLifecycle(t, w, nil)), resyncT0) {
			t.Fatalf("track(%v) refused", w)
		}
	}
	if s.len() != 5 {
		t.Fatalf("len = %d, want 5 distinct runs", s.len())
	}
}

func TestResyncSetKeepsATerminalEntryForTheRetentionWindowThenPrunesIt(t *testing.T) {
	const retention = 60 * time.Second
	s := newResyncSet(retention, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
	live := mustLifecycle(t, workload("live", "running", "node-a"), nil)
	done := mustLifecycle(t, workload("done", "completed", "node-a"), nil)
	s.trackT(&live, resyncT0)
	s.trackT(&done, resyncT0.Add(10*time.Second))
	doneAt := resyncT0.Add(10 * time.Second)

	for _, tc := range []struct {
		at   time.Time
		want []string
	}{
		{doneAt, []string{"done", "live"}},
		{doneAt.Add(retention / 2), []string{"done", "live"}},
		{doneAt.Add(retention - time.Nanosecond), []string{"done", "live"}},
		{doneAt.Add(retention), []string{"live"}},
		{doneAt.Add(24 * time.Hour), []string{"live"}}, // a live workload never ages out
	} {
		if got := snapshotIDs(t, s, tc.at); !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("snapshot at +%v after the terminal event = %v, want %v", tc.at.Sub(doneAt), got, tc.want)
		}
	}
	if s.len() != 1 || len(s.byRef) != 1 {
		t.Fatalf("after pruning: %d entries, %d refs; want 1 and 1", s.len(), len(s.byRef))
	}
}

func TestResyncSetTerminalStates(t *testing.T) {
	for _, tc := range []struct {
		state    string
		terminal bool
	}{
		{"completed", true}, {"failed", true}, {"cancelled", true},
		{"queued", false}, {"running", false}, {"unknown-state", false},
	} {
		t.Run(tc.state, func(t *testing.T) {
			s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
			s.trackT(ptr(mustLifecycle(t, workload("job", tc.state, "node-a"), nil)), resyncT0)
			kept := len(snapshotIDs(t, s, resyncT0.Add(time.Hour))) == 1
			if kept == tc.terminal {
				t.Fatalf("state %q an hour later: kept=%v, want terminal=%v", tc.state, kept, tc.terminal)
			}
		})
	}
}

func TestResyncSetIgnoresANonTerminalEventAfterATerminalOne(t *testing.T) {
	for _, final := range []string{"completed", "failed", "cancelled"} {
		for _, late := range []string{"queued", "running"} {
			t.Run(final+"/"+late, func(t *testing.T) {
				s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
				s.trackT(ptr(mustLifecycle(t, workload("job", "running", "node-a"), nil)), resyncT0)
				s.trackT(ptr(mustLifecycle(t, workload("job", final, "node-a"), nil)), resyncT0)
				if s.trackT(ptr(mustLifecycle(t, workload("job", late, "node-a"), nil)), resyncT0.Add(time.Second)) {
					t.Fatalf("a %s event after %s was tracked", late, final)
				}
				got := snapshotStates(t, s, resyncT0.Add(time.Second))
				if got["job"] != final+"/"+methodFor(final) {
					t.Fatalf("snapshot = %v, want the %s event kept", got, final)
				}
				// The stale event did not revive the entry either: it still ages out.
				if ids := snapshotIDs(t, s, resyncT0.Add(time.Minute)); len(ids) != 0 {
					t.Fatalf("terminal entry still held after retention: %v", ids)
				}
			})
		}
	}
}

func TestResyncSetStaleRuleIsPerRun(t *testing.T) {
	// A new run (other runId) of a finished workload is live work, not stale.
	s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
	s.trackT(ptr(mustLifecycle(t, workload("job", "completed", "node-a", map[string]any{"runId": "r1"}), nil)), resyncT0)
	if !s.trackT(ptr(mustLifecycle(t, workload("job", "running", "node-a", map[string]any{"runId": "r2"}), nil)), resyncT0) {
		t.Fatal("a running event of another run was refused")
	}
}

func TestResyncSetTerminalAfterTerminalReplacesTheEntry(t *testing.T) {
	s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
	s.trackT(ptr(mustLifecycle(t, workload("job", "failed", "node-a"), nil)), resyncT0)
	if !s.trackT(ptr(mustLifecycle(t, workload("job", "cancelled", "node-a"), nil)), resyncT0.Add(30*time.Second)) {
		t.Fatal("a terminal event after a terminal one was refused")
	}
	if got := snapshotStates(t, s, resyncT0.Add(70*time.Second)); got["job"] != "cancelled/"+wireframe.MethodErrored {
		t.Fatalf("snapshot = %v, want the cancelled event, retained from its own time", got)
	}
}

func TestResyncSetUntrackDropsEveryRunOfTheWorkload(t *testing.T) {
	s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
	for _, w := range []map[string]any{
		workload("job-1", "running", "node-a", map[string]any{"runId": "r1"}),
		workload("job-1", "running", "node-a", map[string]any{"runId": "r2"}),
		workload("job-1", "completed", "node-a", map[string]any{"runId": "r3", "engine": "vllm"}),
		workload("job-2", "running", "node-a"),
		workload("job-1", "running", "node-b"),
	} {
		s.trackT(ptr(mustLifecycle(t, w, nil)), resyncT0)
	}
	s.untrack(wireframe.WorkloadRef{Origin: "node-a", ID: "job-1"})

	var got []string
	for _, e := range s.snapshot(resyncT0) {
		info := entryInfo(t, e)
		got = append(got, info["originatedFrom"].(string)+"/"+info["id"].(string))
	}
	sort.Strings(got)
	if want := []string{"node-a/job-2", "node-b/job-1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after untrack(node-a, job-1) the set holds %v, want %v", got, want)
	}
	if _, ok := s.byRef[wireframe.WorkloadRef{Origin: "node-a", ID: "job-1"}]; ok {
		t.Fatal("the removed workload's ref index survived untrack")
	}
	s.untrack(wireframe.WorkloadRef{Origin: "node-a", ID: "never-tracked"}) // a no-op, not a panic
	if s.len() != 2 {
		t.Fatalf("len = %d, want 2", s.len())
	}
}

func TestWithResyncAddsTheMarkerAndKeepsEveryMember(t *testing.T) {
	for _, in := range []string{
		`{}`,
		` { } `,
		"\n{\n}\n",
		`{"a":1}`,
		`{"workloadInfo":{"id":"j","resync":false},"extra":[1,{"b":null}],"s":"}{,"}`,
		` {"x":"y"} `,
	} {
		out := withResync(json.RawMessage(in))
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("withResync(%q) = %q: not JSON: %v", in, out, err)
		}
		if got["resync"] != true {
			t.Fatalf("withResync(%q) = %s: resync is %v, want true", in, out, got["resync"])
		}
		delete(got, "resync")
		var want map[string]any
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("withResync(%q) changed the other members: %v, want %v", in, got, want)
		}
	}
}

func TestResyncSetStoresParamsWithoutAnyResyncMember(t *testing.T) {
	// Whatever resync member a tracked frame carried, in whatever spelling and
	// with whatever value, the stored params carry none, so the heartbeat's
	// marker is the only one and decodes as true.
	for _, member := range []string{
		`"resync":true`,
		`"resync":false`,
		`"Resync":false`,
		`"RESYNC":false`,
		`"reſync":false`,
		`"re\u0073ync":false`,
		`"resync":false,"Resync":false`,
		`"resync":true,"reſync":false`,
	} {
		t.Run(member, func(t *testing.T) {
			params := `{"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"running","originatedFrom":"node-a","custom":"<&>"},` +
				member + `,"other":{"resync":false}}`
			s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
			s.trackT(ptr(mustLifecycleRaw(t, wireframe.MethodStarted, params)), resyncT0)
			entries := s.snapshot(resyncT0)
			if len(entries) != 1 {
				t.Fatalf("%d entries, want 1", len(entries))
			}
			var stored map[string]json.RawMessage
			if err := json.Unmarshal(entries[0].params(), &stored); err != nil {
				t.Fatalf("stored params %s: %v", entries[0].params(), err)
			}
			for k := range stored {
				if strings.EqualFold(k, "resync") {
					t.Fatalf("stored params keep a resync member %q: %s", k, entries[0].params())
				}
			}

			out := withResync(entries[0].params())
			var p struct { // decodes the way a stock peer does
				WorkloadInfo json.RawMessage
				Resync       bool
			}
			if err := json.Unmarshal(out, &p); err != nil {
				t.Fatal(err)
			}
			if !p.Resync {
				t.Fatalf("re-assertion %s decodes with resync false", out)
			}
			ev, err := wireframe.ParseLifecycle(wireframe.MethodStarted, out)
			if err != nil || !ev.Resync {
				t.Fatalf("peer parse of the re-assertion: resync=%v err=%v", ev.Resync, err)
			}
			var got, want map[string]any
			_ = json.Unmarshal(out, &got)
			_ = json.Unmarshal([]byte(`{"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"running","originatedFrom":"node-a","custom":"<&>"},"other":{"resync":false}}`), &want)
			delete(got, "resync")
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("re-assertion members = %v, want %v", got, want)
			}
		})
	}
}

func TestResyncSetKeepsParamsWithoutAResyncMemberUnchanged(t *testing.T) {
	params := `{"workloadInfo": {"id":"job-1","model":"m","engine":"e","state":"running","originatedFrom":"node-a"} , "note":"x"}`
	s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
	s.trackT(ptr(mustLifecycleRaw(t, wireframe.MethodStarted, params)), resyncT0)
	if got := string(s.snapshot(resyncT0)[0].params()); got != params {
		t.Fatalf("stored params = %s, want them byte for byte: %s", got, params)
	}
}

func ptr[T any](v T) *T { return &v }

// snapshot returns the entries a heartbeat pass at now visits, in pass
// order: what is left once expired terminal entries are pruned.
func (s *resyncSet) snapshot(now time.Time) []*resyncEntry {
	for s.prune(now) {
	}
	var out []*resyncEntry
	for e := s.head; e != nil; e = e.next {
		out = append(out, e)
	}
	return out
}

// entryInfo decodes a re-sync entry's workload object.
func entryInfo(t *testing.T, e *resyncEntry) map[string]any {
	t.Helper()
	var p struct {
		WorkloadInfo map[string]any `json:"workloadInfo"`
	}
	if err := json.Unmarshal(e.params(), &p); err != nil {
		t.Fatalf("entry params %s: %v", e.params(), err)
	}
	return p.WorkloadInfo
}

// snapshotIDs returns the sorted workload ids of a snapshot taken at now.
func snapshotIDs(t *testing.T, s *resyncSet, now time.Time) []string {
	t.Helper()
	var ids []string
	for _, e := range s.snapshot(now) {
		ids = append(ids, entryInfo(t, e)["id"].(string))
	}
	sort.Strings(ids)
	return ids
}

// snapshotStates maps each workload id of a snapshot to "state/method".
func snapshotStates(t *testing.T, s *resyncSet, now time.Time) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range s.snapshot(now) {
		info := entryInfo(t, e)
		out[info["id"].(string)] = info["state"].(string) + "/" + e.method
	}
	return out
}

// A producer posts each frame on its own goroutine, so one run's frames
// arrive in any order. The re-sync set never regresses a run: a terminal
// entry is never replaced by a live frame; between live frames the higher
// seq wins when both carry one, and otherwise a queued frame does not
// replace a running entry. A state outside queued and running has no rank.
func TestResyncSetConvergesOnOutOfOrderFrames(t *testing.T) {
	type frame struct {
		state string
		seq   int // 0: no seq
	}
	for _, tc := range []struct {
		name     string
		frames   []frame
		recorded []bool // whether track recorded each frame
		want     frame  // the entry held at the end
	}{
		{"queued then running", []frame{{"queued", 0}, {"running", 0}}, []bool{true, true}, frame{"running", 0}},
		{"running then queued keeps running", []frame{{"running", 0}, {"queued", 0}}, []bool{true, false}, frame{"running", 0}},
		{"seq 3 then seq 2 keeps 3", []frame{{"running", 3}, {"running", 2}}, []bool{true, false}, frame{"running", 3}},
		{"seq decides over rank: queued seq 3 then running seq 2 keeps queued", []frame{{"queued", 3}, {"running", 2}}, []bool{true, false}, frame{"queued", 3}},
		{"a higher seq of a lower rank is recorded (a requeue)", []frame{{"running", 2}, {"queued", 3}}, []bool{true, true}, frame{"queued", 3}},
		{"an equal seq is recorded, as a resent frame", []frame{{"running", 2}, {"queued", 2}}, []bool{true, true}, frame{"queued", 2}},
		{"without seq on the new frame the rank decides", []frame{{"running", 3}, {"queued", 0}}, []bool{true, false}, frame{"running", 3}},
		{"without seq on the held entry the rank decides", []frame{{"running", 0}, {"queued", 5}}, []bool{true, false}, frame{"running", 0}},
		{"terminal then queued stays terminal", []frame{{"completed", 0}, {"queued", 0}}, []bool{true, false}, frame{"completed", 0}},
		{"terminal then running with a higher seq stays terminal", []frame{{"failed", 1}, {"running", 5}}, []bool{true, false}, frame{"failed", 1}},
		{"terminal, running, queued stays terminal", []frame{{"cancelled", 3}, {"running", 2}, {"queued", 1}}, []bool{true, false, false}, frame{"cancelled", 3}},
		{"a terminal frame with a lower seq still ends the run", []frame{{"running", 5}, {"completed", 2}}, []bool{true, true}, frame{"completed", 2}},
		{"unknown state after running: no rank", []frame{{"running", 0}, {"paused", 0}}, []bool{true, true}, frame{"paused", 0}},
		{"queued after an unknown state: no rank", []frame{{"paused", 0}, {"queued", 0}}, []bool{true, true}, frame{"queued", 0}},
		{"an unknown state still follows seq", []frame{{"paused", 3}, {"queued", 2}}, []bool{true, false}, frame{"paused", 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
			for i, f := range tc.frames {
				override := map[string]any{"seq": f.seq}
				if f.seq == 0 {
					override["seq"] = nil
				}
				got := s.trackT(ptr(mustLifecycle(t, workload("job", f.state, "node-a", override), nil)), resyncT0)
				if got != tc.recorded[i] {
					t.Fatalf("frame %d (%s seq %d): recorded = %v, want %v", i, f.state, f.seq, got, tc.recorded[i])
				}
			}
			entries := s.snapshot(resyncT0)
			if len(entries) != 1 {
				t.Fatalf("%d entries, want 1", len(entries))
			}
			info := entryInfo(t, entries[0])
			seq, _ := info["seq"].(float64)
			if info["state"] != tc.want.state || int(seq) != tc.want.seq || entries[0].method != methodFor(tc.want.state) {
				t.Fatalf("held %s (%v seq %v), want %s seq %d", entries[0].method, info["state"], info["seq"], tc.want.state, tc.want.seq)
			}
		})
	}
}

// A frame the re-sync set does not record is still the producer's or the
// broker's word for now: it is written to the broker and relayed to the
// peers as always; only the re-assertions keep the later state.
func TestOutOfOrderFrameIsRelayedButTheHeartbeatReassertsTheLaterState(t *testing.T) {
	n, q := ifxNode(t)
	if _, err := n.m.ingestLocal([]byte(ifxLifecycleJSON("job-1", "running", ""))); err != nil {
		t.Fatal(err)
	}
	if _, err := n.m.ingestLocal([]byte(ifxLifecycleJSON("job-1", "queued", ""))); err != nil {
		t.Fatal(err)
	}
	n.m.handleLine([]byte(ifxStdioLifecycleJSON("job-2", "running", n.id, false)))
	n.m.handleLine([]byte(ifxStdioLifecycleJSON("job-2", "queued", n.id, false)))

	ifxBrokerBarrier(t, n)
	var atBroker []string
	for _, w := range n.upserts() {
		atBroker = append(atBroker, w["id"].(string)+"/"+w["state"].(string))
	}
	if want := []string{"job-1/running", "job-1/queued"}; !reflect.DeepEqual(atBroker, want) {
		t.Fatalf("upserts at the broker = %v, want %v", atBroker, want)
	}
	var relayed []string
	for _, f := range ifxDrain(q) {
		relayed = append(relayed, ifxInfoString(t, ifxParams(t, f), "id")+"/"+ifxInfoString(t, ifxParams(t, f), "state"))
	}
	if want := []string{"job-1/running", "job-1/queued", "job-2/running", "job-2/queued"}; !reflect.DeepEqual(relayed, want) {
		t.Fatalf("relayed to peers = %v, want %v", relayed, want)
	}
	for _, id := range []string{"job-1", "job-2"} {
		if held := resyncHeld(t, n, n.id, id); held["state"] != "running" {
			t.Errorf("the re-sync set holds %s as %v, want running", id, held["state"])
		}
	}
	for _, line := range passLines(n.m) {
		f := outboundFrame{method: wireframe.MethodStarted, line: line}
		if id, state := ifxInfoString(t, ifxParams(t, f), "id"), ifxInfoString(t, ifxParams(t, f), "state"); state != "running" {
			t.Errorf("the heartbeat re-asserted %s as %s, want running", id, state)
		}
	}
}

// trackT tracks ev under no limit pressure and reports whether it was
// recorded.
func (s *resyncSet) trackT(ev *wireframe.Lifecycle, now time.Time) bool {
	return s.track(ev, now, false) == tracked
}

func TestResyncSetPrunesABudgetAtATimeAndCatchesUp(t *testing.T) {
	s := newResyncSet(time.Minute, defaultMaxLiveWorkloads, defaultMaxLiveWorkloadBytes, "node-a")
	const ended = 3*pruneBudget + 10
	for i := range ended {
		s.trackT(ptr(mustLifecycle(t, workload(fmt.Sprintf("job-%d", i), "completed", "node-a"), nil)), resyncT0)
	}
	later := resyncT0.Add(2 * time.Minute)
	rounds := 0
	for s.prune(later) {
		rounds++
		if want := ended - rounds*pruneBudget; s.len() != want {
			t.Fatalf("after round %d the set holds %d, want %d: one prune drops at most %d", rounds, s.len(), want, pruneBudget)
		}
	}
	if s.len() != 0 || rounds != 3 {
		t.Fatalf("after %d rounds the set holds %d entries, want 0 after 3", rounds, s.len())
	}
}
