package peerserver

import (
	"encoding/json"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/wireframe"
)

func TestDedupKeyDistinguishesEveryTupleMember(t *testing.T) {
	// Each case differs from base in one member of the dedup tuple, or is
	// built so that naive separator joining would collide with another.
	base := map[string]any{"id": "job-1", "model": "m", "engine": "llamacpp", "state": "running",
		"originatedFrom": "node-a", "scheduledOn": "node-b", "runId": "r1", "seq": 1}
	with := func(o map[string]any) map[string]any { return testframe.Override(base, o) }
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
		// Built from the fields, not parsed: some cases have an empty id,
		// which wireframe.ParseLifecycle would refuse, but the key must still be
		// injective.
		ev := wireframe.Lifecycle{Info: workloadInfoOf(w)}
		k := lifecycleDedupKey(&ev)
		if other, dup := keys[k]; dup {
			t.Errorf("cases %q and %q share the dedup key %x", name, other, k)
		}
		keys[k] = name
	}
	// A removal never shares a key with a lifecycle event.
	for _, r := range []wireframe.WorkloadRef{{Origin: "node-a", ID: "job-1"}, {Origin: "", ID: ""}} {
		rk := removalDedupKey(&wireframe.Removal{Ref: r})
		if other, dup := keys[rk]; dup {
			t.Errorf("removal %+v shares the key of lifecycle case %q", r, other)
		}
	}
	if removalDedupKey(&wireframe.Removal{Ref: wireframe.WorkloadRef{Origin: "a|b", ID: "c"}}) == removalDedupKey(&wireframe.Removal{Ref: wireframe.WorkloadRef{Origin: "a", ID: "b|c"}}) {
		t.Error("removal keys collide across the origin/id boundary")
	}
}

func TestDedupKeyIgnoresFieldsOutsideTheTuple(t *testing.T) {
	a := testframe.Workload("job-1", "running", "node-a", map[string]any{"scheduledOn": "node-b"})
	b := testframe.Workload("job-1", "running", "node-a", map[string]any{"scheduledOn": "node-b",
		"model": "other", "createdAt": 1, "startedAt": 2, "error": "boom", "custom": []int{1}})
	eva, err := wireframe.ParseLifecycle(wireframe.MethodStarted, lifecycleParamsJSON(t, a, nil))
	if err != nil {
		t.Fatal(err)
	}
	evb, err := wireframe.ParseLifecycle(wireframe.MethodErrored, lifecycleParamsJSON(t, b, map[string]any{"note": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	if lifecycleDedupKey(&eva) != lifecycleDedupKey(&evb) {
		t.Fatalf("same tuple, different keys: %q vs %q", lifecycleDedupKey(&eva), lifecycleDedupKey(&evb))
	}
}

// workloadInfoOf is the workloadInfo the typed decode reads from w, a
// workload object as a map of strings, nils and ints.
func workloadInfoOf(w map[string]any) wireframe.WorkloadInfo {
	str := func(k string) string { v, _ := w[k].(string); return v }
	i := wireframe.WorkloadInfo{ID: str("id"), Model: str("model"), Engine: str("engine"), State: str("state"),
		OriginatedFrom: str("originatedFrom"), ScheduledOn: str("scheduledOn"), RunID: str("runId")}
	if seq, ok := w["seq"].(int); ok {
		i.Seq, i.HasSeq = int64(seq), true
	}
	return i
}

// lifecycleParamsJSON renders params holding the workload w and the extra
// members beside it.
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
func mustLifecycle(t testing.TB, w map[string]any, extra map[string]any) wireframe.Lifecycle {
	t.Helper()
	state, _ := w["state"].(string)
	ev, err := wireframe.ParseLifecycle(testframe.MethodFor(state), lifecycleParamsJSON(t, w, extra))
	if err != nil {
		t.Fatalf("parseLifecycle: %v", err)
	}
	return ev
}

// mustLifecycleRaw parses a lifecycle frame from raw params JSON.
func mustLifecycleRaw(t testing.TB, method, params string) wireframe.Lifecycle {
	t.Helper()
	ev, err := wireframe.ParseLifecycle(method, json.RawMessage(params))
	if err != nil {
		t.Fatalf("parseLifecycle(%s): %v", params, err)
	}
	return ev
}
