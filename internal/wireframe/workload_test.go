package wireframe

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
				_, err := ParseLifecycle(MethodStarted, lifecycleParamsJSON(t, w, nil))
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
		{"params is an array", MethodStarted, `[` + valid + `]`, "params"},
		{"params is a string", MethodStarted, `"x"`, "params"},
		{"params is null", MethodStarted, `null`, "params"},
		{"params is a number", MethodStarted, `5`, "params"},
		{"params is empty", MethodStarted, ``, "params"},
		{"workloadInfo missing", MethodStarted, `{"other":` + valid + `}`, "workloadInfo"},
		{"workloadInfo null", MethodStarted, `{"workloadInfo":null}`, "workloadInfo"},
		{"workloadInfo an array", MethodStarted, `{"workloadInfo":[` + valid + `]}`, "workloadInfo"},
		{"workloadInfo a string", MethodStarted, `{"workloadInfo":"` + strings.ReplaceAll(valid, `"`, `\"`) + `"}`, "workloadInfo"},
		{"id a number", MethodStarted, `{"workloadInfo":{"id":42,"model":"m","engine":"e","state":"running","originatedFrom":"o"}}`, "workloadInfo"},
		{"state a number", MethodStarted, `{"workloadInfo":{"id":"j","model":"m","engine":"e","state":1,"originatedFrom":"o"}}`, "workloadInfo"},
		{"resync a string", MethodStarted, `{"workloadInfo":` + valid + `,"resync":"true"}`, "params"},
		{"unknown method", "workload:paused", `{"workloadInfo":` + valid + `}`, "workload:paused"},
		{"removal method", MethodRemove, `{"workloadInfo":` + valid + `}`, "workloads:remove"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseLifecycle(tc.method, json.RawMessage(tc.params))
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
		{"null", true, 0}, // the stock peers' int64 takes null as 0: it leaves seq unset
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
			ev, err := ParseLifecycle(MethodStarted, json.RawMessage(`{"workloadInfo":`+info+`}`))
			if tc.ok && err != nil {
				t.Fatalf("seq %s rejected: %v", tc.seq, err)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), "seq")) {
				t.Fatalf("seq %s: error = %v, want a rejection naming seq", tc.seq, err)
			}
			if tc.ok && (ev.Info.HasSeq != (tc.seq != "" && tc.seq != "null") || ev.Info.Seq != tc.want) {
				t.Fatalf("seq %s parsed as hasSeq=%v seqNum=%d, want %d", tc.seq, ev.Info.HasSeq, ev.Info.Seq, tc.want)
			}
		})
	}
}

func TestParseLifecycleAcceptsAnyNonEmptyStateOnThisPath(t *testing.T) {
	// The stdio and peer paths do not check the state against the method or
	// the five known states; only the ingress does.
	for _, tc := range []struct{ method, state string }{
		{MethodSubmitted, "queued"}, {MethodStarted, "running"}, {MethodCompleted, "completed"},
		{MethodErrored, "failed"}, {MethodErrored, "cancelled"},
		{MethodSubmitted, "completed"}, {MethodStarted, "paused"}, {MethodCompleted, "RUNNING"}, {MethodErrored, "ſomething"},
	} {
		ev, err := ParseLifecycle(tc.method, lifecycleParamsJSON(t, workload("j", tc.state, "o"), nil))
		if err != nil {
			t.Errorf("%s with state %q rejected: %v", tc.method, tc.state, err)
			continue
		}
		if ev.Info.State != tc.state || ev.Method != tc.method {
			t.Errorf("parsed state %q method %q, want %q %q", ev.Info.State, ev.Method, tc.state, tc.method)
		}
	}
}

func TestParseLifecycleKeepsTheWorkloadObjectByteForByte(t *testing.T) {
	// Unknown fields, odd spacing, escapes, nesting and key order all survive:
	// ev.raw is the object exactly as it appeared in the frame.
	info := "{ \"zeta\" : [1, 2.50, {\"n\":null}],\n\t\"id\":\"job-\\u00e9<&>\", \"model\":\"m\",\"engine\":\"vllm\" ,\"state\":\"running\"," +
		"\"originatedFrom\":\"node-a\",\"runId\":\"r1\",\"seq\":7,\"error\":\"line1\\nline2\",\"custom\":{\"deep\":{\"x\":true}} }"
	params := `{"extra":"kept", "workloadInfo": ` + info + ` , "more":[1]}`
	ev, err := ParseLifecycle(MethodStarted, json.RawMessage(params))
	if err != nil {
		t.Fatal(err)
	}
	if string(ev.Raw) != info {
		t.Fatalf("ev.raw =\n%s\nwant the input object byte for byte:\n%s", ev.Raw, info)
	}
	if string(ev.Params) != params {
		t.Fatalf("ev.params = %s, want the input params byte for byte", ev.Params)
	}
	if ev.Info.ID != "job-é<&>" || ev.Info.Engine != "vllm" || ev.Info.RunID != "r1" || !ev.Info.HasSeq || ev.Info.Seq != 7 {
		t.Fatalf("decoded info = %+v", ev.Info)
	}
	if ev.Resync {
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
		ev, err := ParseLifecycle(MethodStarted, lifecycleParamsJSON(t, w, tc.extra))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Resync != tc.want {
			t.Errorf("params extra %v: resync = %v, want %v", tc.extra, ev.Resync, tc.want)
		}
	}
}

func TestParseRemove(t *testing.T) {
	for _, tc := range []struct {
		name, params string
		want         WorkloadRef
		wantInErr    string // "" = accepted
	}{
		{"valid", `{"workloadId":"job-1","originatedFrom":"node-a"}`, WorkloadRef{"node-a", "job-1"}, ""},
		{"unknown fields kept out of the ref", `{"workloadId":"job-1","originatedFrom":"node-a","why":"user"}`, WorkloadRef{"node-a", "job-1"}, ""},
		{"workloadId missing", `{"originatedFrom":"node-a"}`, WorkloadRef{}, "workloadId"},
		{"workloadId empty", `{"workloadId":"","originatedFrom":"node-a"}`, WorkloadRef{}, "workloadId"},
		{"workloadId null", `{"workloadId":null,"originatedFrom":"node-a"}`, WorkloadRef{}, "workloadId"},
		{"workloadId a number", `{"workloadId":5,"originatedFrom":"node-a"}`, WorkloadRef{}, "params"},
		// An older sender's removal names no origin: the stock peers take it
		// as a removal of ("", id), and so does every path but the ingress.
		{"originatedFrom missing", `{"workloadId":"job-1"}`, WorkloadRef{"", "job-1"}, ""},
		{"originatedFrom empty", `{"workloadId":"job-1","originatedFrom":""}`, WorkloadRef{"", "job-1"}, ""},
		{"originatedFrom null", `{"workloadId":"job-1","originatedFrom":null}`, WorkloadRef{"", "job-1"}, ""},
		{"originatedFrom a number", `{"workloadId":"job-1","originatedFrom":5}`, WorkloadRef{}, "params.originatedFrom must be a string or null"},
		{"params an array", `[{"workloadId":"job-1","originatedFrom":"node-a"}]`, WorkloadRef{}, "params"},
		{"params null", `null`, WorkloadRef{}, "params"},
		{"params a string", `"job-1"`, WorkloadRef{}, "params"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseRemove(json.RawMessage(tc.params))
			if tc.wantInErr == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				if r.Ref != tc.want || string(r.Params) != tc.params {
					t.Fatalf("parsed %+v (params %s), want ref %+v and the params unchanged", r.Ref, r.Params, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantInErr) {
				t.Fatalf("error = %v, want a rejection mentioning %q", err, tc.wantInErr)
			}
		})
	}
}

// The broker is written a removal's params from its tokens as they came;
// one that names no origin goes up as {"workloadId":...} alone, as a stock
// peer writes it, never with an empty originatedFrom.
func TestRemovalBrokerParamsNameTheOriginOnlyWhenTheRemovalHasOne(t *testing.T) {
	for _, tc := range []struct{ params, want string }{
		{`{"workloadId":"job-1","originatedFrom":"node-a"}`, `{"originatedFrom":"node-a","workloadId":"job-1"}`},
		{`{"originatedFrom":"n\u00e9","workloadId":"j\/1"}`, `{"originatedFrom":"n\u00e9","workloadId":"j\/1"}`},
		{`{"workloadId":"job-1"}`, `{"workloadId":"job-1"}`},
		{`{"workloadId":"job-\u00e9","originatedFrom":null}`, `{"workloadId":"job-\u00e9"}`},
		{`{"workloadId":"job-1","originatedFrom":""}`, `{"workloadId":"job-1"}`},
	} {
		r, err := ParseRemove(json.RawMessage(tc.params))
		if err != nil {
			t.Fatalf("%s: %v", tc.params, err)
		}
		if got := string(r.BrokerParams()); got != tc.want {
			t.Errorf("%s: broker params %s, want %s", tc.params, got, tc.want)
		}
	}
}

func TestIsTerminalState(t *testing.T) {
	for state, want := range map[string]bool{
		"completed": true, "failed": true, "cancelled": true,
		"queued": false, "running": false, "paused": false, "": false, "Completed": false, "canceled": false,
	} {
		if got := IsTerminalState(state); got != want {
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
func mustLifecycle(t testing.TB, w map[string]any, extra map[string]any) Lifecycle {
	t.Helper()
	state, _ := w["state"].(string)
	ev, err := ParseLifecycle(methodFor(state), lifecycleParamsJSON(t, w, extra))
	if err != nil {
		t.Fatalf("parseLifecycle: %v", err)
	}
	return ev
}

// mustLifecycleRaw parses a lifecycle frame from raw params JSON.
func mustLifecycleRaw(t testing.TB, method, params string) Lifecycle {
	t.Helper()
	ev, err := ParseLifecycle(method, json.RawMessage(params))
	if err != nil {
		t.Fatalf("parseLifecycle(%s): %v", params, err)
	}
	return ev
}
