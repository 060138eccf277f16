package wireframe

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

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
		{"own origin, known state", MethodStarted, info(""), true},
		{"256-byte id", MethodStarted, `{"workloadInfo":{"id":"` + long[:256] + `","model":"m","engine":"e","state":"running","originatedFrom":"` + node + `"}}`, true},
		{"resync false", MethodStarted, `{"resync":false,"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"running","originatedFrom":"` + node + `"}}`, true},
		{"own removal", MethodRemove, `{"workloadId":"job-1","originatedFrom":"` + node + `"}`, true},
		{"256-byte removal id", MethodRemove, `{"workloadId":"` + long[:256] + `","originatedFrom":"` + node + `"}`, true},

		{"foreign origin", MethodStarted, `{"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"running","originatedFrom":"` + ifxForeign + `"}}`, false},
		{"foreign origin in a variant spelling", MethodStarted, info(`,"originatedfrom":"` + ifxForeign + `"`), false},
		{"unknown state", MethodStarted, `{"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"weird","originatedFrom":"` + node + `"}}`, false},
		{"unknown state in a long-s spelling", MethodStarted, info(",\"\u017ftate\":\"weird\""), false},
		{"resync true", MethodStarted, `{"resync":true,"workloadInfo":{"id":"job-1","model":"m","engine":"e","state":"running","originatedFrom":"` + node + `"}}`, false},
		{"resync true in a long-s spelling", MethodStarted, "{\"re\u017fync\":true," + info("")[1:], false},
		{"foreign removal", MethodRemove, `{"workloadId":"job-1","originatedFrom":"` + ifxForeign + `"}`, false},
		{"foreign removal in a variant spelling", MethodRemove, `{"workloadId":"job-1","originatedFrom":"` + node + `","OriginatedFrom":"` + ifxForeign + `"}`, false},
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

// parsedFrame parses a frame as every path does, without the ingress's own
// rules, for checkIngressValues to look at.
func parsedFrame(method string, params json.RawMessage) (Ingress, error) {
	if method == MethodRemove {
		r, err := ParseRemove(params)
		return Ingress{Method: method, Params: r.Params, Removal: r}, err
	}
	ev, err := ParseLifecycle(method, params)
	return Ingress{Method: method, Params: ev.Params, Life: ev}, err
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
			f, err := ParseIngress([]byte(body), node, DefaultWorkloadMaxBytes)
			if err != nil {
				t.Fatal(err)
			}
			if string(f.Params) != want {
				t.Fatalf("relayed params\n%s\nwant\n%s", f.Params, want)
			}
			// The object written to the broker is the relayed one, whole.
			if raw := string(f.Life.Raw); !strings.Contains(string(f.Params), `"workloadInfo":`+raw) ||
				!strings.HasPrefix(raw, "{ ") || !strings.HasSuffix(raw, "}") || !strings.Contains(raw, node) {
				t.Fatalf("workload object %s is not the relayed params' own", raw)
			}
			if f.Life.Info.OriginatedFrom != node || f.Life.Info.ID != "jé-1" {
				t.Fatalf("decoded origin %q, id %q", f.Life.Info.OriginatedFrom, f.Life.Info.ID)
			}
		})
	}
}

// The ingress's own rules on a producer's frame (issue 21): its method
// agrees with its state, its times are epoch milliseconds, and createdAt
// and seq are not null. Each refusal names the field; the same frames
// pass every other path (TestThePeerAndBrokerPathsKeepTheStockPeersTolerance).
func TestIngressRefusesAMethodAgainstItsStateTimesInSecondsAndNullNumbers(t *testing.T) {
	const node = fuzzNodeID
	frame := func(method, state string, members ...string) string {
		info := `{"id":"job-1","model":"m","engine":"e","state":"` + state + `"`
		for _, m := range members {
			info += "," + m
		}
		return `{"jsonrpc":"2.0","method":"` + method + `","params":{"workloadInfo":` + info + `}}}`
	}
	const ms = `"createdAt":1789661457000`
	for _, tc := range []struct {
		name, body, reason string // reason "" = accepted
	}{
		{"submitted queued", frame(MethodSubmitted, "queued", ms), ""},
		{"started running", frame(MethodStarted, "running", ms), ""},
		{"completed completed", frame(MethodCompleted, "completed", ms), ""},
		{"errored failed", frame(MethodErrored, "failed", ms), ""},
		{"errored cancelled", frame(MethodErrored, "cancelled", ms), ""},
		{"started completed", frame(MethodStarted, "completed", ms),
			`workloadInfo.state "completed" does not agree with method workload:started, which carries state running`},
		{"submitted running", frame(MethodSubmitted, "running", ms),
			`workloadInfo.state "running" does not agree with method workload:submitted, which carries state queued`},
		{"completed failed", frame(MethodCompleted, "failed", ms),
			`workloadInfo.state "failed" does not agree with method workload:completed, which carries state completed`},
		{"errored completed", frame(MethodErrored, "completed", ms),
			`workloadInfo.state "completed" does not agree with method workload:errored, which carries state failed or cancelled`},
		{"errored queued", frame(MethodErrored, "queued", ms),
			`workloadInfo.state "queued" does not agree with method workload:errored, which carries state failed or cancelled`},
		{"times at the bound", frame(MethodCompleted, "completed", `"createdAt":1000000000000`, `"startedAt":1000000000000`, `"completedAt":1000000000000`), ""},
		{"times absent or null", frame(MethodStarted, "running", `"startedAt":null`, `"completedAt":null`), ""},
		{"createdAt in seconds", frame(MethodStarted, "running", `"createdAt":1789661457`),
			"workloadInfo.createdAt is 1789661457, below 1000000000000: it looks like seconds; send epoch milliseconds"},
		{"startedAt in seconds", frame(MethodStarted, "running", ms, `"startedAt":1789661458`),
			"workloadInfo.startedAt is 1789661458, below 1000000000000: it looks like seconds"},
		{"completedAt in seconds", frame(MethodCompleted, "completed", ms, `"completedAt":1789661459`),
			"workloadInfo.completedAt is 1789661459, below 1000000000000: it looks like seconds"},
		{"createdAt one below the bound", frame(MethodStarted, "running", `"createdAt":999999999999`),
			"workloadInfo.createdAt is 999999999999, below 1000000000000"},
		{"createdAt zero", frame(MethodStarted, "running", `"createdAt":0`), "workloadInfo.createdAt is 0, below 1000000000000"},
		{"createdAt negative", frame(MethodStarted, "running", `"createdAt":-1789661457000`), "workloadInfo.createdAt is -1789661457000, below"},
		{"createdAt null", frame(MethodStarted, "running", `"createdAt":null`),
			"workloadInfo.createdAt must be an integer (epoch milliseconds); the ingress takes no null"},
		{"seq null", frame(MethodStarted, "running", ms, `"seq":null`),
			"workloadInfo.seq must be an integer from 0 to 9223372036854775807; the ingress takes no null"},
		{"seq zero", frame(MethodStarted, "running", ms, `"seq":0`), ""},
		// The ingress takes no null in createdAt or seq: its answer to a
		// value of another type does not offer one.
		{"createdAt with an exponent", frame(MethodStarted, "running", `"createdAt":1.7e12`),
			"workloadInfo.createdAt must be an integer (epoch milliseconds); the ingress takes no null"},
		{"createdAt a word", frame(MethodStarted, "running", `"createdAt":"now"`),
			"workloadInfo.createdAt must be an integer (epoch milliseconds); the ingress takes no null"},
		{"seq a fraction", frame(MethodStarted, "running", ms, `"seq":1.5`),
			"workloadInfo.seq must be an integer from 0 to 9223372036854775807; the ingress takes no null"},
		{"seq negative", frame(MethodStarted, "running", ms, `"seq":-1`),
			"workloadInfo.seq must be an integer from 0 to 9223372036854775807; the ingress takes no null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseIngress([]byte(tc.body), node, DefaultWorkloadMaxBytes)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.reason != "" && (err == nil || !strings.Contains(err.Error(), tc.reason)):
				t.Fatalf("error = %v, want one containing %q", err, tc.reason)
			}
		})
	}
}

// What the ingress refuses of its own rules, every other path takes as the
// stock peers do: their decode has no such rules, and a stock peer relays
// what its broker sent it.
func TestThePeerAndBrokerPathsKeepTheStockPeersTolerance(t *testing.T) {
	for _, tc := range []struct{ method, info string }{
		{MethodStarted, `{"id":"j","model":"m","engine":"e","state":"completed","originatedFrom":"n","createdAt":1789661457}`},
		{MethodErrored, `{"id":"j","model":"m","engine":"e","state":"running","originatedFrom":"n","createdAt":null,"seq":null}`},
		{MethodCompleted, `{"id":"j","model":"m","engine":"e","state":"completed","originatedFrom":"n","startedAt":5,"completedAt":0}`},
	} {
		if _, err := ParseLifecycle(tc.method, json.RawMessage(`{"workloadInfo":`+tc.info+`}`)); err != nil {
			t.Errorf("%s %s refused: %v", tc.method, tc.info, err)
		}
	}
}
