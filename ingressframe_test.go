package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// Tests of the ingress frame rules (ingressframe.go), mostly through
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
			if _, err := n.m.ingestLocal([]byte(ifxLifecycleJSON("job-1", "running", "", extra...))); err != nil {
				t.Fatalf("ingestLocal: %v", err)
			}
			up := n.broker.waitMethod(methodUpsert, 1)
			ifxWantOneOrigin(t, "the broker's upsert", ifxObjectAt(t, up[0].Params, "workloadInfo"), n.id)
			frames := ifxDrain(q)
			if len(frames) != 1 || frames[0].method != methodStarted {
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
			body := `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-1"` +
				strings.ReplaceAll(tc.member, "NODE", n.id) + `}}`
			if _, err := n.m.ingestLocal([]byte(body)); err != nil {
				t.Fatalf("ingestLocal: %v", err)
			}
			rm := n.broker.waitMethod(methodRemove, 1)
			ifxWantOneOrigin(t, "the broker's removal", rm[0].Params, n.id)
			frames := ifxDrain(q)
			if len(frames) != 1 || frames[0].method != methodRemove {
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
		{"lifecycle", ifxLifecycleJSON("job-1", "running", ifxForeign)},
		{"removal", ifxRemoveJSON("job-1", ifxForeign)},
		{"lifecycle, origin not a string", ifxLifecycleJSON("job-1", "running", "", `"originatedFrom":42`)},
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
			if _, err := n.m.ingestLocal([]byte(ifxLifecycleJSON("job-1", state, ""))); err != nil {
				t.Fatalf("state %s refused: %v", state, err)
			}
			up := n.broker.waitMethod(methodUpsert, 1)
			if got := ifxInfoString(t, up[0].Params, "state"); got != state {
				t.Errorf("broker upsert state = %q, want %q", got, state)
			}
			frames := ifxDrain(q)
			if len(frames) != 1 || frames[0].method != methodFor(state) || ifxInfoString(t, ifxParams(t, frames[0]), "state") != state {
				t.Errorf("queued %s, want one %s with state %s", ifxDescribe(frames), methodFor(state), state)
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
			n.m.handleLine([]byte(ifxStdioLifecycleJSON("job-1", state, n.id, false)))
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
				body, method := ifxLifecycleJSON(tc.id, "running", ""), methodUpsert
				if kind == "removal" {
					body, method = ifxRemoveJSON(tc.id, ""), methodRemove
				}
				if !tc.ok {
					ifxWantRejected(t, n, q, body)
					return
				}
				if _, err := n.m.ingestLocal([]byte(body)); err != nil {
					t.Fatalf("a %d-byte id refused: %v", len(tc.id), err)
				}
				got := n.broker.waitMethod(method, 1)
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
			if _, err := parseIngressFrame([]byte(body), "node", defaultWorkloadMaxBytes); err != nil {
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

// foldKey must fold two names together exactly when encoding/json would
// decode one into a field tagged with the other: if it folded less, a
// variant spelling would slip past the key check and be decoded as the field.
func TestIngressFrameFoldKeyAgreesWithEncodingJSON(t *testing.T) {
	canonicals := []string{"state", "originatedFrom", "workloadInfo", "workloadId", "id", "resync", "scheduledOn",
		"jsonrpc", "kx", "k", "σ", "i", "ß", "ǆ"}
	names := []string{
		// ASCII case variants
		"state", "STATE", "State", "sTaTe", "originatedfrom", "ORIGINATEDFROM", "originatedfRom", "OriginatedFrom",
		"workloadinfo", "WORKLOADINFO", "WorkloadId", "ID", "Id", "iD", "I", "Resync", "RESYNC", "JSONRPC", "KX", "Kx", "K",
		// long s, Kelvin sign
		"\u017ftate", "\u017fTATE", "re\u017fync", "\u017fcheduledOn", "wor\u212AloadInfo", "wor\u212AloadId", "\u212Ax", "\u212A",
		// Greek sigma forms
		"σ", "ς", "Σ",
		// dotless i and dotted capital I: no simple fold to i
		"ı", "İ", "ıd", "İd", "orıginatedFrom", "orİginatedFrom",
		// sharp s and its capital; "ss" is not a simple fold
		"ß", "ẞ", "ss", "SS",
		// a title-case digraph
		"Ǆ", "ǅ", "ǆ", "DŽ",
		// non-letters and near misses
		"st_ate", "st-ate", "state_", "_state", "state ", " state", "st ate", "1", "_", "-", "sta\u200bte",
		"ｓｔａｔｅ", "stat\u0435", "workload_info", "workload-id",
		// invalid UTF-8 and the replacement character
		"st\xffate", "\xff", "state\xc3", "\xed\xa0\x80", "\ufffd", "st\ufffdate",
	}
	for _, canon := range canonicals {
		typ := reflect.StructOf([]reflect.StructField{{
			Name: "F", Type: reflect.TypeFor[int](), Tag: reflect.StructTag(`json:"` + canon + `"`),
		}})
		if _, ok := typ.Field(0).Tag.Lookup("json"); !ok {
			t.Fatalf("tag for %q not set", canon)
		}
		for _, name := range append(names, canon) {
			doc := []byte(`{"` + name + `":1}`)
			// The name as a decoder reports it (invalid UTF-8 replaced):
			// what objectMembers hands to the key check.
			var asMap map[string]int
			if err := json.Unmarshal(doc, &asMap); err != nil || len(asMap) != 1 {
				t.Fatalf("%q: %v", doc, err)
			}
			var decoded string
			for k := range asMap {
				decoded = k
			}
			v := reflect.New(typ)
			if err := json.Unmarshal(doc, v.Interface()); err != nil {
				t.Fatalf("decode %q: %v", doc, err)
			}
			jsonMatched := v.Elem().Field(0).Int() == 1
			if folds := foldKey(decoded) == foldKey(canon); folds != jsonMatched {
				t.Errorf("name %q, field %q: foldKey says fold-equal=%v, encoding/json matched=%v", name, canon, folds, jsonMatched)
			}
		}
	}
	// And the key check acts on it: every fold-equal spelling of a known
	// workload field other than the canonical one is refused.
	for _, name := range names {
		var asMap map[string]int
		_ = json.Unmarshal([]byte(`{"`+name+`":1}`), &asMap)
		for decoded := range asMap {
			canon, known := workloadFields[foldKey(decoded)]
			err := checkSpelling("workloadInfo", levelOfNames(t, []string{decoded}), workloadFields)
			if want := known && canon != decoded || foldKey(decoded) == resyncFolded; (err != nil) != want {
				t.Errorf("checkSpelling(%q) = %v, want refused=%v", decoded, err, want)
			}
		}
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

	up := n.broker.waitMethod(methodUpsert, 1)
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

	n.m.activeMu.Lock()
	var stored json.RawMessage
	for _, e := range n.m.resync.entries {
		stored = e.params()
	}
	n.m.activeMu.Unlock()
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
	rm := n.broker.waitMethod(methodRemove, 1)
	if got := ifxStringAt(t, rm[0].Params, "workloadId"); got != "job-42" {
		t.Errorf("the broker's removal names %q", got)
	}
}

// checkIngressValues validates the decoded frame again, so the rules hold for
// a spelling the key check missed. These frames went through the shared
// local-frame parse only, never through the key check.
func TestIngressFrameCheckIngressValuesCatchesWhatTheKeyCheckMissed(t *testing.T) {
	const node = "3d0b8c4e-1f2a-4b6c-9d8e-7f6a5b4c3d2e"
	info := func(extra string) string {
		return `{"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"running","originatedFrom":"` + node + `"` + extra + `}}`
	}
	long := strings.Repeat("a", 257)
	for _, tc := range []struct {
		name, method, params string
		ok                   bool
	}{
		{"own origin, known state", methodStarted, info(""), true},
		{"256-byte id", methodStarted, `{"workloadInfo":{"id":"` + long[:256] + `","model":"m","engine":"e","state":"running","originatedFrom":"` + node + `"}}`, true},
		{"resync false", methodStarted, `{"resync":false,"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"running","originatedFrom":"` + node + `"}}`, true},
		{"own removal", methodRemove, `{"workloadId":"job-1","originatedFrom":"` + node + `"}`, true},
		{"256-byte removal id", methodRemove, `{"workloadId":"` + long[:256] + `","originatedFrom":"` + node + `"}`, true},

		{"foreign origin", methodStarted, `{"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"running","originatedFrom":"` + ifxForeign + `"}}`, false},
		{"foreign origin in a variant spelling", methodStarted, info(`,"originatedfrom":"` + ifxForeign + `"`), false},
		{"unknown state", methodStarted, `{"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"weird","originatedFrom":"` + node + `"}}`, false},
		{"unknown state in a long-s spelling", methodStarted, info(",\"\u017ftate\":\"weird\""), false},
		{"resync true", methodStarted, `{"resync":true,"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"running","originatedFrom":"` + node + `"}}`, false},
		{"resync true in a long-s spelling", methodStarted, "{\"re\u017fync\":true," + info("")[1:], false},
		{"foreign removal", methodRemove, `{"workloadId":"job-1","originatedFrom":"` + ifxForeign + `"}`, false},
		{"foreign removal in a variant spelling", methodRemove, `{"workloadId":"job-1","originatedFrom":"` + node + `","OriginatedFrom":"` + ifxForeign + `"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parsedFrame(tc.method, json.RawMessage(tc.params))
			if err != nil {
				t.Fatalf("parsedFrame: %v", err)
			}
			err = checkIngressValues(&f, node)
			if (err == nil) != tc.ok {
				t.Errorf("checkIngressValues = %v, want accepted=%v", err, tc.ok)
			}
		})
	}
	for _, state := range []string{"queued", "running", "completed", "failed", "cancelled"} {
		f, err := parsedFrame(methodFor(state), json.RawMessage(`{"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"`+state+`","originatedFrom":"`+node+`"}}`))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkIngressValues(&f, node); err != nil {
			t.Errorf("state %s refused: %v", state, err)
		}
	}
}

// --- helpers -------------------------------------------------------------------------

// parsedFrame parses a frame as every path does, without the ingress's own
// rules, for checkIngressValues to look at.
func parsedFrame(method string, params json.RawMessage) (ingressFrame, error) {
	if method == methodRemove {
		r, err := parseRemove(params)
		return ingressFrame{method: method, params: r.params, removal: r}, err
	}
	ev, err := parseLifecycle(method, params)
	return ingressFrame{method: method, params: ev.params, life: ev}, err
}

// ifxWantRejected ingests body and checks it is refused as the producer's
// mistake and leaves nothing at the broker, in the re-sync set, in the peer
// queue or in the removal memory.
func ifxWantRejected(t *testing.T, n *testNode, q *broadcaster, body string) {
	t.Helper()
	_, err := n.m.ingestLocal([]byte(body))
	if !errors.Is(err, errBadFrame) {
		t.Fatalf("ingestLocal(%s) = %v, want errBadFrame", body, err)
	}
	ifxBrokerBarrier(t, n)
	for _, f := range n.broker.all() {
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
	ms, err := objectMembers(obj)
	if err != nil {
		t.Fatalf("%s: %v", obj, err)
	}
	v, _ := member(ms, name)
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
	ms, err := objectMembers(obj)
	if err != nil {
		t.Fatalf("%s: %s: %v", where, obj, err)
	}
	count := 0
	for _, m := range ms {
		if foldKey(m.name) == foldKey("originatedFrom") {
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
	want, err := objectMembers(sent)
	if err != nil {
		t.Fatal(err)
	}
	have, err := objectMembers(got)
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
	want = append(want, jsonMember{name: "originatedFrom", value: stamped})
	if len(have) != len(want) {
		t.Fatalf("%s has %d members, want the producer's %d and originatedFrom: %s", where, len(have), len(want)-1, got)
	}
	for i := range want {
		if have[i].name != want[i].name || compact(have[i].value) != compact(want[i].value) {
			t.Errorf("%s member %d = %s:%s, want %s:%s", where, i, have[i].name, have[i].value, want[i].name, want[i].value)
		}
	}
}

func TestIngressRelaysTheBodysOwnTextWithOnlyTheOriginStamped(t *testing.T) {
	const node = fuzzNodeID
	info := func(origin string) string {
		return `{ "id" : "j\u00e9-1",  "model":"m", "engine":"e", "state":"running"` + origin + ` }`
	}
	for _, tc := range []struct {
		name, params, want string
	}{
		{"absent: added before the closing brace",
			`{"workloadInfo":` + info("") + `, "x": [1, 2]}`,
			`{"workloadInfo":` + info("") + `, "x": [1, 2]}`},
		{"empty: replaced in place",
			`{"workloadInfo":` + info(`, "originatedFrom" : ""`) + `}`,
			`{"workloadInfo":` + info(`, "originatedFrom" : "`+node+`"`) + `}`},
		{"null: replaced in place",
			`{"workloadInfo":` + info(`,"originatedFrom":null`) + `}`,
			`{"workloadInfo":` + info(`,"originatedFrom":"`+node+`"`) + `}`},
		{"this node: left as sent",
			`{"workloadInfo":` + info(`,"originatedFrom":"`+node+`"`) + `}`,
			`{"workloadInfo":` + info(`,"originatedFrom":"`+node+`"`) + `}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if strings.HasPrefix(tc.name, "absent") {
				// The member goes in right before the object's closing brace.
				at := strings.Index(want, ` }`) + 1
				want = want[:at] + `,"originatedFrom":"` + node + `"` + want[at:]
			}
			body := `{"jsonrpc":"2.0", "method":"workload:started", "params":` + tc.params + `}`
			f, err := parseIngressFrame([]byte(body), node, defaultWorkloadMaxBytes)
			if err != nil {
				t.Fatal(err)
			}
			if string(f.params) != want {
				t.Fatalf("relayed params\n%s\nwant\n%s", f.params, want)
			}
			// The object written to the broker is the relayed one, whole.
			if raw := string(f.life.raw); !strings.Contains(string(f.params), `"workloadInfo":`+raw) ||
				!strings.HasPrefix(raw, "{ ") || !strings.HasSuffix(raw, "}") || !strings.Contains(raw, node) {
				t.Fatalf("workload object %s is not the relayed params' own", raw)
			}
			if f.life.info.OriginatedFrom != node || f.life.info.ID != "jé-1" {
				t.Fatalf("decoded origin %q, id %q", f.life.info.OriginatedFrom, f.life.info.ID)
			}
		})
	}
}
