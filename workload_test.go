package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseLifecycleRejectsAMissingOrEmptyRequiredField(t *testing.T) {
	for _, field := range []string{"id", "model", "engine", "state", "originatedFrom"} {
		for _, how := range []struct {
			name string
			v    any // nil deletes the field
		}{{"missing", nil}, {"empty", ""}, {"null", json.RawMessage("null")}} {
			t.Run(field+"/"+how.name, func(t *testing.T) {
				w := workload("job-1", "running", "node-a")
				if how.v == nil {
					delete(w, field)
				} else {
					w[field] = how.v
				}
				_, err := parseLifecycle(methodStarted, lifecycleParamsJSON(t, w, nil))
				if err == nil {
					t.Fatalf("workloadInfo with %s %s accepted", field, how.name)
				}
				if !strings.Contains(err.Error(), field) {
					t.Fatalf("error %q does not name the field %q", err, field)
				}
			})
		}
	}
}

func TestParseLifecycleRejectsMalformedFrames(t *testing.T) {
	valid := `{"id":"j","model":"m","engine":"e","state":"running","originatedFrom":"o"}`
	for _, tc := range []struct {
		name, method, params string
		wantInErr            string
	}{
		{"params is an array", methodStarted, `[` + valid + `]`, "params"},
		{"params is a string", methodStarted, `"x"`, "params"},
		{"params is null", methodStarted, `null`, "params"},
		{"params is a number", methodStarted, `5`, "params"},
		{"params is empty", methodStarted, ``, "params"},
		{"workloadInfo missing", methodStarted, `{"other":` + valid + `}`, "workloadInfo"},
		{"workloadInfo null", methodStarted, `{"workloadInfo":null}`, "workloadInfo"},
		{"workloadInfo an array", methodStarted, `{"workloadInfo":[` + valid + `]}`, "workloadInfo"},
		{"workloadInfo a string", methodStarted, `{"workloadInfo":"` + strings.ReplaceAll(valid, `"`, `\"`) + `"}`, "workloadInfo"},
		{"id a number", methodStarted, `{"workloadInfo":{"id":42,"model":"m","engine":"e","state":"running","originatedFrom":"o"}}`, "workloadInfo"},
		{"state a number", methodStarted, `{"workloadInfo":{"id":"j","model":"m","engine":"e","state":1,"originatedFrom":"o"}}`, "workloadInfo"},
		{"resync a string", methodStarted, `{"workloadInfo":` + valid + `,"resync":"true"}`, "params"},
		{"unknown method", "workload:paused", `{"workloadInfo":` + valid + `}`, "workload:paused"},
		{"removal method", methodRemove, `{"workloadInfo":` + valid + `}`, "workloads:remove"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseLifecycle(tc.method, json.RawMessage(tc.params))
			if err == nil {
				t.Fatalf("parseLifecycle(%s, %s) accepted", tc.method, tc.params)
			}
			if !strings.Contains(err.Error(), tc.wantInErr) {
				t.Fatalf("error %q does not mention %q", err, tc.wantInErr)
			}
		})
	}
}

func TestParseLifecycleSeqMustBeANonNegativeInt64(t *testing.T) {
	for _, tc := range []struct {
		seq  string // raw JSON, "" = absent
		ok   bool
		want int64
	}{
		{"", true, 0},
		{"3", true, 3},
		{"0", true, 0},
		{"9223372036854775807", true, 9223372036854775807},
		{"9223372036854775808", false, 0},
		{"12345678901234567890", false, 0},
		{"1.5e3", false, 0},
		{"1e3", false, 0},
		{"1.0", false, 0},
		{"-1", false, 0},
		{"null", false, 0}, // null is not an integer
		{`"3"`, false, 0},
		{`""`, false, 0},
		{`true`, false, 0},
		{`[3]`, false, 0},
		{`{"n":3}`, false, 0},
	} {
		t.Run("seq="+tc.seq, func(t *testing.T) {
			info := `{"id":"j","model":"m","engine":"e","state":"running","originatedFrom":"o"`
			if tc.seq != "" {
				info += `,"seq":` + tc.seq
			}
			info += `}`
			ev, err := parseLifecycle(methodStarted, json.RawMessage(`{"workloadInfo":`+info+`}`))
			if tc.ok && err != nil {
				t.Fatalf("seq %s rejected: %v", tc.seq, err)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), "seq")) {
				t.Fatalf("seq %s: error = %v, want a rejection naming seq", tc.seq, err)
			}
			if tc.ok && (ev.info.hasSeq != (tc.seq != "") || ev.info.seqNum != tc.want) {
				t.Fatalf("seq %s parsed as hasSeq=%v seqNum=%d, want %d", tc.seq, ev.info.hasSeq, ev.info.seqNum, tc.want)
			}
		})
	}
}

func TestParseLifecycleAcceptsAnyNonEmptyStateOnThisPath(t *testing.T) {
	// The stdio and peer paths do not check the state against the method or
	// the five known states; only the ingress does.
	for _, tc := range []struct{ method, state string }{
		{methodSubmitted, "queued"}, {methodStarted, "running"}, {methodCompleted, "completed"},
		{methodErrored, "failed"}, {methodErrored, "cancelled"},
		{methodSubmitted, "completed"}, {methodStarted, "paused"}, {methodCompleted, "RUNNING"}, {methodErrored, "ſomething"},
	} {
		ev, err := parseLifecycle(tc.method, lifecycleParamsJSON(t, workload("j", tc.state, "o"), nil))
		if err != nil {
			t.Errorf("%s with state %q rejected: %v", tc.method, tc.state, err)
			continue
		}
		if ev.info.State != tc.state || ev.method != tc.method {
			t.Errorf("parsed state %q method %q, want %q %q", ev.info.State, ev.method, tc.state, tc.method)
		}
	}
}

func TestParseLifecycleKeepsTheWorkloadObjectByteForByte(t *testing.T) {
	// Unknown fields, odd spacing, escapes, nesting and key order all survive:
	// ev.raw is the object exactly as it appeared in the frame.
	info := "{ \"zeta\" : [1, 2.50, {\"n\":null}],\n\t\"id\":\"job-\\u00e9<&>\", \"model\":\"m\",\"engine\":\"vllm\" ,\"state\":\"running\"," +
		"\"originatedFrom\":\"node-a\",\"runId\":\"r1\",\"seq\":7,\"error\":\"line1\\nline2\",\"custom\":{\"deep\":{\"x\":true}} }"
	params := `{"extra":"kept", "workloadInfo": ` + info + ` , "more":[1]}`
	ev, err := parseLifecycle(methodStarted, json.RawMessage(params))
	if err != nil {
		t.Fatal(err)
	}
	if string(ev.raw) != info {
		t.Fatalf("ev.raw =\n%s\nwant the input object byte for byte:\n%s", ev.raw, info)
	}
	if string(ev.params) != params {
		t.Fatalf("ev.params = %s, want the input params byte for byte", ev.params)
	}
	if ev.info.ID != "job-é<&>" || ev.info.Engine != "vllm" || ev.info.RunID != "r1" || !ev.info.hasSeq || ev.info.seqNum != 7 {
		t.Fatalf("decoded info = %+v", ev.info)
	}
	if ev.resync {
		t.Fatal("frame without a resync member parsed as a re-assertion")
	}
}

func TestParseLifecycleReadsTheResyncMarker(t *testing.T) {
	w := workload("j", "running", "o")
	for _, tc := range []struct {
		extra map[string]any
		want  bool
	}{
		{nil, false},
		{map[string]any{"resync": true}, true},
		{map[string]any{"resync": false}, false},
	} {
		ev, err := parseLifecycle(methodStarted, lifecycleParamsJSON(t, w, tc.extra))
		if err != nil {
			t.Fatal(err)
		}
		if ev.resync != tc.want {
			t.Errorf("params extra %v: resync = %v, want %v", tc.extra, ev.resync, tc.want)
		}
	}
}

func TestParseRemove(t *testing.T) {
	for _, tc := range []struct {
		name, params string
		want         workloadRef
		wantInErr    string // "" = accepted
	}{
		{"valid", `{"workloadId":"job-1","originatedFrom":"node-a"}`, workloadRef{"node-a", "job-1"}, ""},
		{"unknown fields kept out of the ref", `{"workloadId":"job-1","originatedFrom":"node-a","why":"user"}`, workloadRef{"node-a", "job-1"}, ""},
		{"workloadId missing", `{"originatedFrom":"node-a"}`, workloadRef{}, "workloadId"},
		{"workloadId empty", `{"workloadId":"","originatedFrom":"node-a"}`, workloadRef{}, "workloadId"},
		{"workloadId null", `{"workloadId":null,"originatedFrom":"node-a"}`, workloadRef{}, "workloadId"},
		{"workloadId a number", `{"workloadId":5,"originatedFrom":"node-a"}`, workloadRef{}, "params"},
		{"originatedFrom missing", `{"workloadId":"job-1"}`, workloadRef{}, "originatedFrom"},
		{"originatedFrom empty", `{"workloadId":"job-1","originatedFrom":""}`, workloadRef{}, "originatedFrom"},
		{"params an array", `[{"workloadId":"job-1","originatedFrom":"node-a"}]`, workloadRef{}, "params"},
		{"params null", `null`, workloadRef{}, "params"},
		{"params a string", `"job-1"`, workloadRef{}, "params"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseRemove(json.RawMessage(tc.params))
			if tc.wantInErr == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				if r.ref != tc.want || string(r.params) != tc.params {
					t.Fatalf("parsed %+v (params %s), want ref %+v and the params unchanged", r.ref, r.params, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantInErr) {
				t.Fatalf("error = %v, want a rejection mentioning %q", err, tc.wantInErr)
			}
		})
	}
}

func TestDedupKeyDistinguishesEveryTupleMember(t *testing.T) {
	// Each case differs from base in one member of the dedup tuple, or is
	// built so that naive separator joining would collide with another.
	base := map[string]any{"id": "job-1", "model": "m", "engine": "llamacpp", "state": "running",
		"originatedFrom": "node-a", "scheduledOn": "node-b", "runId": "r1", "seq": 1}
	with := func(o map[string]any) map[string]any {
		w := map[string]any{}
		for k, v := range base {
			w[k] = v
		}
		for k, v := range o {
			if v == nil {
				delete(w, k)
			} else {
				w[k] = v
			}
		}
		return w
	}
	cases := map[string]map[string]any{
		"base":                      base,
		"other origin":              with(map[string]any{"originatedFrom": "node-c"}),
		"other engine":              with(map[string]any{"engine": "vllm"}),
		"other runId":               with(map[string]any{"runId": "r2"}),
		"no runId":                  with(map[string]any{"runId": nil}),
		"other id":                  with(map[string]any{"id": "job-2"}),
		"other state":               with(map[string]any{"state": "completed"}),
		"other scheduledOn":         with(map[string]any{"scheduledOn": "node-c"}),
		"no scheduledOn":            with(map[string]any{"scheduledOn": nil}),
		"other seq":                 with(map[string]any{"seq": 2}),
		"no seq":                    with(map[string]any{"seq": nil}),
		"seq 0":                     with(map[string]any{"seq": 0}),
		"seq 10":                    with(map[string]any{"seq": 10}),
		"runId+id split 1":          with(map[string]any{"runId": "a|b", "id": "c"}),
		"runId+id split 2":          with(map[string]any{"runId": "a", "id": "b|c"}),
		"origin+engine split1":      with(map[string]any{"originatedFrom": "n\x00x", "engine": "y"}),
		"origin+engine split2":      with(map[string]any{"originatedFrom": "n", "engine": "x\x00y"}),
		"length-prefix lookalike 1": with(map[string]any{"runId": "", "id": "2:ab"}),
		"length-prefix lookalike 2": with(map[string]any{"runId": "2:ab", "id": ""}),
		"engine+runId colon 1":      with(map[string]any{"engine": "e:1", "runId": "x"}),
		"engine+runId colon 2":      with(map[string]any{"engine": "e", "runId": "1:x"}),
	}
	keys := map[dedupDigest]string{} // key -> case name
	for name, w := range cases {
		b, _ := json.Marshal(w)
		// Decoded with the typed checks but not validated: some cases have an
		// empty id, which parseLifecycle would refuse, but the key must still
		// be injective.
		var s frameScan
		if err := s.scanParams([]byte(`{"workloadInfo":` + string(b) + `}`)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		vals, err := checkTypedMembers("workloadInfo", &s.levels[levelInfo], workloadTypedFields, "")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ev := lifecycleEvent{info: decodeWorkloadInfo(&vals, "")}
		k := lifecycleDedupKey(&ev)
		if other, dup := keys[k]; dup {
			t.Errorf("cases %q and %q share the dedup key %x", name, other, k)
		}
		keys[k] = name
	}
	// A removal never shares a key with a lifecycle event.
	for _, r := range []workloadRef{{"node-a", "job-1"}, {"", ""}} {
		rk := removalDedupKey(&removalEvent{ref: r})
		if other, dup := keys[rk]; dup {
			t.Errorf("removal %+v shares the key of lifecycle case %q", r, other)
		}
	}
	if removalDedupKey(&removalEvent{ref: workloadRef{"a|b", "c"}}) == removalDedupKey(&removalEvent{ref: workloadRef{"a", "b|c"}}) {
		t.Error("removal keys collide across the origin/id boundary")
	}
}

func TestDedupKeyIgnoresFieldsOutsideTheTuple(t *testing.T) {
	a := workload("job-1", "running", "node-a", map[string]any{"scheduledOn": "node-b"})
	b := workload("job-1", "running", "node-a", map[string]any{"scheduledOn": "node-b",
		"model": "other", "createdAt": 1, "startedAt": 2, "error": "boom", "custom": []int{1}})
	eva, err := parseLifecycle(methodStarted, lifecycleParamsJSON(t, a, nil))
	if err != nil {
		t.Fatal(err)
	}
	evb, err := parseLifecycle(methodErrored, lifecycleParamsJSON(t, b, map[string]any{"note": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	if lifecycleDedupKey(&eva) != lifecycleDedupKey(&evb) {
		t.Fatalf("same tuple, different keys: %q vs %q", lifecycleDedupKey(&eva), lifecycleDedupKey(&evb))
	}
}

func TestIsTerminalState(t *testing.T) {
	for state, want := range map[string]bool{
		"completed": true, "failed": true, "cancelled": true,
		"queued": false, "running": false, "paused": false, "": false, "Completed": false, "canceled": false,
	} {
		if got := isTerminalState(state); got != want {
			t.Errorf("isTerminalState(%q) = %v, want %v", state, got, want)
		}
	}
}

// lifecycleParamsJSON renders {"workloadInfo": w} plus extra params members.
func lifecycleParamsJSON(t testing.TB, w map[string]any, extra map[string]any) json.RawMessage {
	t.Helper()
	p := map[string]any{"workloadInfo": w}
	for k, v := range extra {
		p[k] = v
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mustLifecycle parses a lifecycle frame for w or fails the test. The method
// is chosen from the state.
func mustLifecycle(t testing.TB, w map[string]any, extra map[string]any) lifecycleEvent {
	t.Helper()
	state, _ := w["state"].(string)
	ev, err := parseLifecycle(methodFor(state), lifecycleParamsJSON(t, w, extra))
	if err != nil {
		t.Fatalf("parseLifecycle: %v", err)
	}
	return ev
}

// mustLifecycleRaw parses a lifecycle frame from raw params JSON.
func mustLifecycleRaw(t testing.TB, method, params string) lifecycleEvent {
	t.Helper()
	ev, err := parseLifecycle(method, json.RawMessage(params))
	if err != nil {
		t.Fatalf("parseLifecycle(%s): %v", params, err)
	}
	return ev
}
