package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// Tests of the ingress frame rules (internal/wireframe/ingressframe.go), mostly through
// ingestLocal on a node that is not started: a rejected frame must leave
// nothing at the broker, in the re-sync set, in the peer queue or in the
// removal memory. The HTTP status codes are localingress_test.go's.

// ifxForeign is a node id that is not the test node's.
const ifxForeign = "5f0c1c1e-2b7d-4a1e-8f00-00000000f0e1"

func TestIngressFrameStampsOriginOnLifecycleFrames(t *testing.T) {
	for _, tc := range []struct {
		name   string
		member string // the originatedFrom member, if any; NODE is the node's id
	}{
		{"absent", ""},
		{"empty", `"originatedFrom":""`},
		{"null", `"originatedFrom":null`},
		{"this node's own id, accepted", `"originatedFrom":"NODE"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, q := ifxNode(t)
			var extra []string
			if tc.member != "" {
				extra = append(extra, strings.ReplaceAll(tc.member, "NODE", n.id))
			}
			if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", "", extra...)))); err != nil {
				t.Fatalf("ingestLocal: %v", err)
			}
			up := n.broker.WaitMethod(wireframe.MethodUpsert, 1)
			ifxWantOneOrigin(t, "the broker's upsert", ifxObjectAt(t, up[0].Params, "workloadInfo"), n.id)
			frames := ifxDrain(q)
			if len(frames) != 1 || frames[0].method != wireframe.MethodStarted {
				t.Fatalf("queued %s, want one workload:started", ifxDescribe(frames))
			}
			ifxWantOneOrigin(t, "the peer frame", ifxObjectAt(t, ifxParams(t, frames[0]), "workloadInfo"), n.id)
			if !ifxIsTracked(n, n.id, "job-1") {
				t.Error("the workload is not tracked under this node's id")
			}
		})
	}
}

func TestIngressFrameStampsOriginOnRemovalFrames(t *testing.T) {
	for _, tc := range []struct {
		name   string
		member string
	}{
		{"absent", ""},
		{"empty", `,"originatedFrom":""`},
		{"null", `,"originatedFrom":null`},
		{"this node's own id, accepted", `,"originatedFrom":"NODE"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, q := ifxNode(t)
			ifxOwn(t, n, q, "job-1") // a removal is remembered for an owned workload
			body := `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-1"` +
				strings.ReplaceAll(tc.member, "NODE", n.id) + `}}`
			if _, err := n.m.ingestLocal([]byte(body)); err != nil {
				t.Fatalf("ingestLocal: %v", err)
			}
			rm := n.broker.WaitMethod(wireframe.MethodRemove, 1)
			ifxWantOneOrigin(t, "the broker's removal", rm[0].Params, n.id)
			frames := ifxDrain(q)
			if len(frames) != 1 || frames[0].method != wireframe.MethodRemove {
				t.Fatalf("queued %s, want one workloads:remove", ifxDescribe(frames))
			}
			ifxWantOneOrigin(t, "the peer frame", ifxParams(t, frames[0]), n.id)
			if !ifxRemembers(n, n.id, "job-1") {
				t.Error("the removal is not remembered under this node's id")
			}
		})
	}
}

func TestIngressFrameRejectsForeignOriginLeavingNothing(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"lifecycle", testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", ifxForeign))},
		{"removal", string(testframe.Removal("job-1", ifxForeign))},
		{"lifecycle, origin not a string", testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("job-1", "running", "", `"originatedFrom":42`))},
		{"removal, origin not a string", `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-1","originatedFrom":["x"]}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, q := ifxNode(t)
			ifxWantRejected(t, n, q, tc.body)
		})
	}
}

func TestIngressFrameRejectsMissingWorkloadInfo(t *testing.T) {
	for _, tc := range []struct{ name, params string }{
		{"no workloadInfo", `{}`},
		{"workloadInfo null", `{"workloadInfo":null}`},
		{"workloadInfo a string", `{"workloadInfo":"job-1"}`},
		{"workloadInfo an array", `{"workloadInfo":[]}`},
		{"workloadInfo empty", `{"workloadInfo":{}}`},
		{"workloadId instead", `{"workloadId":"job-1"}`},
		{"params null", `null`},
		{"params an array", `[]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, q := ifxNode(t)
			ifxWantRejected(t, n, q, `{"jsonrpc":"2.0","method":"workload:started","params":`+tc.params+`}`)
		})
	}
	t.Run("no params", func(t *testing.T) {
		n, q := ifxNode(t)
		ifxWantRejected(t, n, q, `{"jsonrpc":"2.0","method":"workload:started"}`)
	})
}

func TestIngressFrameRejectsUnknownStates(t *testing.T) {
	for _, state := range []string{"weird", "Running", "RUNNING", "running ", "canceled", "error", "done", "ſtarted", ""} {
		t.Run(fmt.Sprintf("%q", state), func(t *testing.T) {
			n, q := ifxNode(t)
			body := fmt.Sprintf(`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":%q}}}`, state)
			ifxWantRejected(t, n, q, body)
		})
	}
}

func TestIngressFrameAcceptsEveryKnownState(t *testing.T) {
	for _, state := range []string{"queued", "running", "completed", "failed", "cancelled"} {
		t.Run(state, func(t *testing.T) {
			n, q := ifxNode(t)
			if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor(state), testframe.WorkloadJSON("job-1", state, "")))); err != nil {
				t.Fatalf("state %s refused: %v", state, err)
			}
			up := n.broker.WaitMethod(wireframe.MethodUpsert, 1)
			if got := ifxInfoString(t, up[0].Params, "state"); got != state {
				t.Errorf("broker upsert state = %q, want %q", got, state)
			}
			frames := ifxDrain(q)
			if len(frames) != 1 || frames[0].method != testframe.MethodFor(state) || ifxInfoString(t, ifxParams(t, frames[0]), "state") != state {
				t.Errorf("queued %s, want one %s with state %s", ifxDescribe(frames), testframe.MethodFor(state), state)
			}
			if !ifxIsTracked(n, n.id, "job-1") {
				t.Error("not tracked")
			}
		})
	}
}

// The ingress's state rule is its own: the broker's frames validate as
// before, and any non-empty state passes.
func TestIngressFrameRulesLeaveStdioPathAcceptingAnyState(t *testing.T) {
	for _, state := range []string{"weird", "Running", "paused"} {
		t.Run(state, func(t *testing.T) {
			n, q := ifxNode(t)
			n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor(state), testframe.WorkloadJSON("job-1", state, n.id))))
			frames := ifxDrain(q)
			if len(frames) != 1 || ifxInfoString(t, ifxParams(t, frames[0]), "state") != state {
				t.Errorf("the broker's frame with state %q: queued %s, want it", state, ifxDescribe(frames))
			}
			if !ifxIsTracked(n, n.id, "job-1") {
				t.Errorf("the broker's frame with state %q is not tracked", state)
			}
		})
	}
}

func TestIngressFrameWorkloadIDLengthBound(t *testing.T) {
	ids := []struct {
		name string
		id   string
		ok   bool
	}{
		{"256 ASCII bytes", strings.Repeat("a", 256), true},
		{"257 ASCII bytes", strings.Repeat("a", 257), false},
		{"128 two-byte runes (256 bytes)", strings.Repeat("é", 128), true},
		{"86 three-byte runes (258 bytes, 86 runes)", strings.Repeat("€", 86), false},
		{"128 two-byte runes and one byte (257 bytes)", strings.Repeat("é", 128) + "x", false},
	}
	for _, kind := range []string{"upsert", "removal"} {
		for _, tc := range ids {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				n, q := ifxNode(t)
				body, method := testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON(tc.id, "running", "")), wireframe.MethodUpsert
				if kind == "removal" {
					body, method = string(testframe.Removal(tc.id, "")), wireframe.MethodRemove
				}
				if !tc.ok {
					ifxWantRejected(t, n, q, body)
					return
				}
				if _, err := n.m.ingestLocal([]byte(body)); err != nil {
					t.Fatalf("a %d-byte id refused: %v", len(tc.id), err)
				}
				got := n.broker.WaitMethod(method, 1)
				if !bytes.Contains(got[0].Params, []byte(`"`+tc.id+`"`)) {
					t.Errorf("the broker's %s does not carry the whole id: %s", method, got[0].Params)
				}
				if frames := ifxDrain(q); len(frames) != 1 {
					t.Errorf("queued %s, want one frame", ifxDescribe(frames))
				}
			})
		}
	}
}

func TestIngressFrameRejectsMalformedEnvelopes(t *testing.T) {
	info := `{"id":"job-1","model":"m","engine":"e","state":"running"}`
	for _, tc := range []struct{ name, body string }{
		{"empty body", ``},
		{"not JSON", `workload:started job-1`},
		{"truncated JSON", `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":` + info},
		{"a JSON array", `[{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":` + info + `}}]`},
		{"a JSON string", `"workload:started"`},
		{"two objects", `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":` + info + `}} {}`},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","method":"workload:started","params":{"workloadInfo":` + info + `}}`},
		{"jsonrpc a number", `{"jsonrpc":2.0,"method":"workload:started","params":{"workloadInfo":` + info + `}}`},
		{"jsonrpc missing", `{"method":"workload:started","params":{"workloadInfo":` + info + `}}`},
		{"method missing", `{"jsonrpc":"2.0","params":{"workloadInfo":` + info + `}}`},
		{"method not a string", `{"jsonrpc":"2.0","method":1,"params":{"workloadInfo":` + info + `}}`},
		{"method workloads:upsert", `{"jsonrpc":"2.0","method":"workloads:upsert","params":{"workloadInfo":` + info + `}}`},
		{"method discovery:nodes", `{"jsonrpc":"2.0","method":"discovery:nodes","params":{"nodes":[]}}`},
		{"method shutdown", `{"jsonrpc":"2.0","method":"shutdown"}`},
		{"method log/set-level", `{"jsonrpc":"2.0","method":"log/set-level","params":{"level":"debug"}}`},
		{"method in another case", `{"jsonrpc":"2.0","method":"Workload:Started","params":{"workloadInfo":` + info + `}}`},
		{"a required field missing", `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"job-1","engine":"e","state":"running"}}}`},
		{"seq a string", `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"running","seq":"1"}}}`},
		{"removal without workloadId", `{"jsonrpc":"2.0","method":"workloads:remove","params":{}}`},
		{"removal with empty workloadId", `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":""}}`},
		{"removal with workloadId null", `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":null}}`},
		{"removal with numeric workloadId", `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":42}}`},
		{"removal without params", `{"jsonrpc":"2.0","method":"workloads:remove"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, q := ifxNode(t)
			ifxWantRejected(t, n, q, tc.body)
		})
	}
}

// Every case-variant bypass found in review: encoding/json would decode each
// of these names as a field while an exact-key check would not see it. Each
// must be refused and leave nothing anywhere.
func TestIngressFrameRejectsCaseVariantBypasses(t *testing.T) {
	const base = `"id":"job-1","model":"m","engine":"e","state":"running"`
	lc := func(env, params, info string) string {
		return `{"jsonrpc":"2.0","method":"workload:started"` + env + `,"params":{"workloadInfo":{` + info + `}` + params + `}}`
	}
	rm := func(env, params string) string {
		return `{"jsonrpc":"2.0","method":"workloads:remove"` + env + `,"params":{` + params + `}}`
	}
	cases := []struct{ name, body string }{
		// originatedFrom
		{"originatedfrom beside originatedFrom", lc("", "", base+`,"originatedFrom":"NODE","originatedfrom":"FOREIGN"`)},
		{"originatedfrom before originatedFrom", lc("", "", base+`,"originatedfrom":"FOREIGN","originatedFrom":"NODE"`)},
		{"originatedfrom beside an empty originatedFrom", lc("", "", base+`,"originatedFrom":"","originatedfrom":"FOREIGN"`)},
		{"originatedfrom instead of originatedFrom", lc("", "", base+`,"originatedfrom":"FOREIGN"`)},
		{"originatedfrom naming this node", lc("", "", base+`,"originatedfrom":"NODE"`)},
		{"originatedfRom", lc("", "", base+`,"originatedfRom":"FOREIGN"`)},
		{"OriginatedFrom", lc("", "", base+`,"OriginatedFrom":"FOREIGN"`)},
		{"ORIGINATEDFROM beside originatedFrom", lc("", "", base+`,"originatedFrom":"NODE","ORIGINATEDFROM":"FOREIGN"`)},
		{"params-level originatedfrom on a lifecycle frame", lc("", `,"originatedfrom":"FOREIGN"`, base)},
		// workloadInfo
		{"a second top-level workloadinfo", lc("", `,"workloadinfo":{`+base+`,"originatedFrom":"FOREIGN"}`, base)},
		{"workloadinfo before workloadInfo", `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadinfo":{` + base +
			`,"originatedFrom":"FOREIGN"},"workloadInfo":{` + base + `}}}`},
		{"WorkloadInfo instead of workloadInfo", `{"jsonrpc":"2.0","method":"workload:started","params":{"WorkloadInfo":{` + base + `,"originatedFrom":"FOREIGN"}}}`},
		{"Kelvin sign in workloadInfo", "{\"jsonrpc\":\"2.0\",\"method\":\"workload:started\",\"params\":{\"wor\u212AloadInfo\":{" + base + "}}}"},
		{"Kelvin sign escaped in workloadInfo", `{"jsonrpc":"2.0","method":"workload:started","params":{"wor\u212aloadInfo":{` + base + `}}}`},
		// removal
		{"a remove frame's originatedfrom", rm("", `"workloadId":"job-1","originatedfrom":"FOREIGN"`)},
		{"a remove frame's originatedfrom beside originatedFrom", rm("", `"workloadId":"job-1","originatedFrom":"NODE","originatedfrom":"FOREIGN"`)},
		{"a remove frame's OriginatedFrom", rm("", `"workloadId":"job-1","OriginatedFrom":"FOREIGN"`)},
		{"WorkloadId", rm("", `"WorkloadId":"job-1"`)},
		{"workloadid beside workloadId", rm("", `"workloadId":"job-1","workloadid":"job-2"`)},
		{"Kelvin sign in workloadId", rm("", "\"wor\u212AloadId\":\"job-1\"")},
		// id and the envelope
		{"ID beside id", lc("", "", base+`,"ID":"job-2"`)},
		{"ID instead of id", lc("", "", `"ID":"job-1","model":"m","engine":"e","state":"running"`)},
		{"Id instead of id", lc("", "", `"Id":"job-1","model":"m","engine":"e","state":"running"`)},
		{"envelope ID", lc(`,"ID":1`, "", base)},
		{"envelope Method beside method", lc(`,"Method":"workloads:remove"`, "", base)},
		{"envelope JSONRPC beside jsonrpc", lc(`,"JSONRPC":"1.0"`, "", base)},
		{"envelope Params beside params", lc(`,"Params":{}`, "", base)},
		// state and the other workload fields
		{"long-s state instead of state", lc("", "", "\"id\":\"job-1\",\"model\":\"m\",\"engine\":\"e\",\"\u017ftate\":\"running\"")},
		{"long-s state beside state", lc("", "", base+",\"\u017ftate\":\"weird\"")},
		{"escaped long-s state beside state", lc("", "", base+`,"\u017ftate":"weird"`)},
		{"State instead of state", lc("", "", `"id":"job-1","model":"m","engine":"e","State":"running"`)},
		{"long-s scheduledOn", lc("", "", base+",\"\u017fcheduledOn\":\"NODE\"")},
		{"MODEL beside model", lc("", "", base+`,"MODEL":"other"`)},
		// names that fold together
		{"foo and FOO in workloadInfo", lc("", "", base+`,"foo":1,"FOO":2`)},
		{"foo and FOO in params", lc("", `,"foo":1,"FOO":2`, base)},
		{"foo and FOO in the envelope", lc(`,"foo":1,"FOO":2`, "", base)},
		{"foo and FOO in removal params", rm("", `"workloadId":"job-1","foo":1,"FOO":2`)},
		{"Kelvin-sign name and its k spelling in workloadInfo", lc("", "", base+",\"\u212Ax\":1,\"kx\":2")},
		{"Kelvin-sign name and its K spelling in params", lc("", ",\"Kx\":1,\"\u212Ax\":2", base)},
		{"long-s name and its s spelling in params", lc("", ",\"\u017fample\":1,\"sample\":2", base)},
		// exact repeats
		{"model repeated", lc("", "", base+`,"model":"m2"`)},
		{"originatedFrom repeated, the second foreign", lc("", "", base+`,"originatedFrom":"NODE","originatedFrom":"FOREIGN"`)},
		{"an unknown name repeated", lc("", "", base+`,"foo":1,"foo":1`)},
		{"workloadInfo repeated", lc("", `,"workloadInfo":{`+base+`,"originatedFrom":"FOREIGN"}`, base)},
		{"method repeated", lc(`,"method":"workloads:remove"`, "", base)},
		{"workloadId repeated", rm("", `"workloadId":"job-1","workloadId":"job-2"`)},
		{"a removal's originatedFrom repeated", rm("", `"workloadId":"job-1","originatedFrom":"NODE","originatedFrom":"FOREIGN"`)},
	}
	// resync, in any spelling, at every level a frame has.
	for _, spelling := range []string{`resync`, `Resync`, `RESYNC`, "re\u017fync", `re\u017fync`, `reſYNC`} {
		for _, value := range []string{"true", "false"} {
			m := `,"` + spelling + `":` + value
			cases = append(cases,
				struct{ name, body string }{"lifecycle envelope " + spelling + " " + value, lc(m, "", base)},
				struct{ name, body string }{"lifecycle params " + spelling + " " + value, lc("", m, base)},
				struct{ name, body string }{"lifecycle workloadInfo " + spelling + " " + value, lc("", "", base+m)},
				struct{ name, body string }{"remove envelope " + spelling + " " + value, rm(m, `"workloadId":"job-1"`)},
				struct{ name, body string }{"remove params " + spelling + " " + value, rm("", `"workloadId":"job-1"`+m)},
			)
		}
	}

	t.Run("control: the bases are accepted", func(t *testing.T) {
		for _, body := range []string{lc("", "", base), rm("", `"workloadId":"job-1"`)} {
			if _, err := wireframe.ParseIngress([]byte(body), "node", wireframe.DefaultWorkloadMaxBytes); err != nil {
				t.Fatalf("base frame %s refused: %v", body, err)
			}
		}
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, q := ifxNode(t)
			body := strings.NewReplacer("NODE", n.id, "FOREIGN", ifxForeign).Replace(tc.body)
			if !json.Valid([]byte(body)) {
				t.Fatalf("test body is not JSON: %s", body)
			}
			ifxWantRejected(t, n, q, body)
		})
	}
}

// The seed document's producer example, with a field of the producer's own
// in workloadInfo and another in params: accepted, origin stamped, and
// everything else passed through untouched to the broker (workloadInfo), the
// peers (params) and the re-sync set (params).
func TestIngressFramePassesHarnessFrameThroughWithProducerFields(t *testing.T) {
	n, q := ifxNode(t)
	body := `{
  "jsonrpc": "2.0", "method": "workload:started",
  "params": {"workloadInfo": {"id": "job-42", "runId": "job-42", "seq": 1, "model": "qwen3.5-9b", "engine": "llamacpp",
             "state": "running", "createdAt": 1789661457000, "startedAt": 1789661457000,
             "completedAt": null, "error": null, "requesterId": "my-scheduler",
             "harnessGpu": {"index": 0, "tags": ["a", "b"], "ratio": 0.25}},
             "traceId": "t-7f3a"}}`
	if _, err := n.m.ingestLocal([]byte(body)); err != nil {
		t.Fatalf("the harness-shaped frame was refused: %v", err)
	}
	var in struct {
		Params struct {
			WorkloadInfo json.RawMessage `json:"workloadInfo"`
		} `json:"params"`
	}
	if err := json.Unmarshal([]byte(body), &in); err != nil {
		t.Fatal(err)
	}

	up := n.broker.WaitMethod(wireframe.MethodUpsert, 1)
	ifxWantPassedThrough(t, "the broker's upsert", in.Params.WorkloadInfo, ifxObjectAt(t, up[0].Params, "workloadInfo"), n.id)

	frames := ifxDrain(q)
	if len(frames) != 1 {
		t.Fatalf("queued %s, want one frame", ifxDescribe(frames))
	}
	peer := ifxParams(t, frames[0])
	ifxWantPassedThrough(t, "the peer frame", in.Params.WorkloadInfo, ifxObjectAt(t, peer, "workloadInfo"), n.id)
	if got := string(ifxObjectAt(t, peer, "traceId")); got != `"t-7f3a"` {
		t.Errorf("the peer frame's params.traceId = %s, want the producer's", got)
	}

	var stored json.RawMessage
	for _, l := range passLines(n.m) {
		stored = statetable.RunLine(l).Params()
	}
	if stored == nil {
		t.Fatal("not tracked")
	}
	ifxWantPassedThrough(t, "the re-sync set", in.Params.WorkloadInfo, ifxObjectAt(t, stored, "workloadInfo"), n.id)
	if got := string(ifxObjectAt(t, stored, "traceId")); got != `"t-7f3a"` {
		t.Errorf("the re-sync set's params.traceId = %s, want the producer's", got)
	}
}

func TestIngressFramePassesRemovalParamsThroughToPeers(t *testing.T) {
	n, q := ifxNode(t)
	body := `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-42","reason":{"code":"done"}}}`
	if _, err := n.m.ingestLocal([]byte(body)); err != nil {
		t.Fatal(err)
	}
	frames := ifxDrain(q)
	if len(frames) != 1 {
		t.Fatalf("queued %s, want the removal", ifxDescribe(frames))
	}
	p := ifxParams(t, frames[0])
	if got := string(ifxObjectAt(t, p, "reason")); got != `{"code":"done"}` {
		t.Errorf("the peer removal's params.reason = %s, want the producer's", got)
	}
	ifxWantOneOrigin(t, "the peer removal", p, n.id)
	rm := n.broker.WaitMethod(wireframe.MethodRemove, 1)
	if got := ifxStringAt(t, rm[0].Params, "workloadId"); got != "job-42" {
		t.Errorf("the broker's removal names %q", got)
	}
}

// --- helpers -------------------------------------------------------------------------

// ifxWantRejected ingests body and checks it is refused as the producer's
// mistake and leaves nothing at the broker, in the re-sync set, in the peer
// queue or in the removal memory.
func ifxWantRejected(t *testing.T, n *testNode, q *peerCapture, body string) {
	t.Helper()
	_, err := n.m.ingestLocal([]byte(body))
	if !errors.Is(err, ingress.ErrBadFrame) {
		t.Fatalf("ingestLocal(%s) = %v, want ingress.ErrBadFrame", body, err)
	}
	ifxBrokerBarrier(t, n)
	for _, f := range n.broker.All() {
		if f.Method != "test:barrier" {
			t.Errorf("a rejected frame reached the broker: %s %s", f.Method, f.Params)
		}
	}
	if got := ifxTrackedCount(n); got != 0 {
		t.Errorf("a rejected frame left %d entries in the re-sync set", got)
	}
	if got := ifxRememberedCount(n); got != 0 {
		t.Errorf("a rejected frame left %d entries in the removal memory", got)
	}
	if got := ifxDrain(q); len(got) != 0 {
		t.Errorf("a rejected frame was queued for peers: %s", ifxDescribe(got))
	}
}

// ifxObjectAt returns the raw value of one member of a JSON object.
func ifxObjectAt(t *testing.T, obj json.RawMessage, name string) json.RawMessage {
	t.Helper()
	ms, err := wireframe.ValidObjectMembers(obj)
	if err != nil {
		t.Fatalf("%s: %v", obj, err)
	}
	v, _ := wireframe.MemberNamed(ms, name)
	return v
}

func ifxStringAt(t *testing.T, obj json.RawMessage, name string) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(ifxObjectAt(t, obj, name), &s); err != nil {
		t.Fatalf("%s in %s: %v", name, obj, err)
	}
	return s
}

// ifxWantOneOrigin checks that obj has exactly one originatedFrom, node.
func ifxWantOneOrigin(t *testing.T, where string, obj json.RawMessage, node string) {
	t.Helper()
	ms, err := wireframe.ValidObjectMembers(obj)
	if err != nil {
		t.Fatalf("%s: %s: %v", where, obj, err)
	}
	count := 0
	for _, m := range ms {
		// Simple Unicode case folding: what encoding/json matches names by.
		if strings.EqualFold(m.Name, "originatedFrom") {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%s has %d originatedFrom members, want exactly one: %s", where, count, obj)
	}
	if got := ifxStringAt(t, obj, "originatedFrom"); got != node {
		t.Errorf("%s originatedFrom = %q, want this node %q", where, got, node)
	}
}

// ifxWantPassedThrough checks that got holds every member of sent, in order
// and with the same value, plus originatedFrom stamped with node, and
// nothing else.
func ifxWantPassedThrough(t *testing.T, where string, sent, got json.RawMessage, node string) {
	t.Helper()
	want, err := wireframe.ValidObjectMembers(sent)
	if err != nil {
		t.Fatal(err)
	}
	have, err := wireframe.ValidObjectMembers(got)
	if err != nil {
		t.Fatalf("%s: %s: %v", where, got, err)
	}
	compact := func(v json.RawMessage) string {
		var b bytes.Buffer
		if err := json.Compact(&b, v); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	stamped, _ := json.Marshal(node)
	want = append(want, wireframe.Member{Name: "originatedFrom", Value: stamped})
	if len(have) != len(want) {
		t.Fatalf("%s has %d members, want the producer's %d and originatedFrom: %s", where, len(have), len(want)-1, got)
	}
	for i := range want {
		if have[i].Name != want[i].Name || compact(have[i].Value) != compact(want[i].Value) {
			t.Errorf("%s member %d = %s:%s, want %s:%s", where, i, have[i].Name, have[i].Value, want[i].Name, want[i].Value)
		}
	}
}
