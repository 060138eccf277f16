package wireframe

import (
	"encoding/json"
	"testing"
)

// The workload object's members must have the types the broker and the
// stock peers decode: what the daemon accepts is exactly what they can
// decode. Each case is one violation of one field, refused by the parse
// step all three paths share, with the reason it gives.
func TestParseLifecycleRefusesMembersTheBrokerCannotDecode(t *testing.T) {
	const (
		millis     = "must be an integer (epoch milliseconds) or null"
		millisNull = millis
		strNull    = "must be a string or null"
		seq        = "workloadInfo.seq must be an integer from 0 to 9223372036854775807 or null"
		text       = "must be valid UTF-8 with no lone surrogates"
	)
	for _, tc := range []struct {
		name   string
		member []string
		reason string
	}{
		{"createdAt a string", []string{`"createdAt":"2026-01-01T00:00:00Z"`}, "workloadInfo.createdAt " + millis},
		{"createdAt a fraction", []string{`"createdAt":1789661457000.5`}, "workloadInfo.createdAt " + millis},
		{"createdAt an exponent", []string{`"createdAt":1.789661457e12`}, "workloadInfo.createdAt " + millis},
		{"createdAt a whole number with an exponent", []string{`"createdAt":1e3`}, "workloadInfo.createdAt " + millis},
		{"createdAt above the int64 range", []string{`"createdAt":9223372036854775808`}, "workloadInfo.createdAt " + millis},
		{"createdAt below the int64 range", []string{`"createdAt":-9223372036854775809`}, "workloadInfo.createdAt " + millis},
		{"startedAt a word", []string{`"startedAt":"yesterday"`}, "workloadInfo.startedAt " + millisNull},
		{"startedAt a fraction", []string{`"startedAt":1.5`}, "workloadInfo.startedAt " + millisNull},
		{"completedAt a boolean", []string{`"completedAt":true`}, "workloadInfo.completedAt " + millisNull},
		{"error a number", []string{`"error":12`}, "workloadInfo.error " + strNull},
		{"requesterId an object", []string{`"requesterId":{"a":1}`}, "workloadInfo.requesterId " + strNull},
		{"runId a number", []string{`"runId":5`}, "workloadInfo.runId " + strNull},
		{"scheduledOn an array", []string{`"scheduledOn":[]`}, "workloadInfo.scheduledOn " + strNull},
		{"model a number", []string{`"model":5`}, "workloadInfo.model must be a string"},
		{"state null", []string{`"state":null`}, "workloadInfo.state must be a string"},
		{"seq -1", []string{`"seq":-1`}, seq},
		{"seq 1.5", []string{`"seq":1.5`}, seq},
		{"seq 1e3", []string{`"seq":1e3`}, seq},
		{`seq "3"`, []string{`"seq":"3"`}, seq},
		{"seq above the int64 range", []string{`"seq":9223372036854775808`}, seq},
		{"id a lone high surrogate", []string{`"id":"job-\ud800"`}, "workloadInfo.id " + text},
		{"id a high surrogate before a letter", []string{`"id":"job-\ud800x"`}, "workloadInfo.id " + text},
		{"id a high surrogate before a non-surrogate escape", []string{`"id":"job-\ud800\u0041"`}, "workloadInfo.id " + text},
		{"id two high surrogates", []string{`"id":"job-\ud800\ud800"`}, "workloadInfo.id " + text},
		{"id a lone low surrogate", []string{`"id":"job-\udc00"`}, "workloadInfo.id " + text},
		{"id a raw invalid byte", []string{"\"id\":\"job-\xff\""}, "workloadInfo.id " + text},
		{"id a surrogate encoded as raw UTF-8", []string{"\"id\":\"job-\xed\xa0\x80\""}, "workloadInfo.id " + text},
		{"error a lone surrogate", []string{`"error":"CUDA \udfff"`}, "workloadInfo.error " + text},
		{"a case variant of a known name", []string{`"CreatedAt":"x"`}, `workloadInfo.createdAt ` + millis + ` (sent as "CreatedAt")`},
		{"a folding variant of a known name (U+017F)", []string{`"ſeq":"3"`}, seq + ` (sent as "ſeq")`},
		{"a repeat whose second value is bad", []string{`"createdAt":1789661457000`, `"createdAt":"x"`}, "workloadInfo.createdAt " + millis},
		{"a repeat whose first value is bad", []string{`"createdAt":"x"`, `"createdAt":1789661457000`}, "workloadInfo.createdAt " + millis},
		{"a case-variant repeat whose second value is bad", []string{`"seq":1`, `"SEQ":-1`}, seq + ` (sent as "SEQ")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := `{"workloadInfo":` + workloadJSON("node-a", tc.member...) + `}`
			_, err := ParseLifecycle(MethodStarted, json.RawMessage(params))
			if err == nil {
				t.Fatalf("accepted %s", params)
			}
			if err.Error() != tc.reason {
				t.Fatalf("error = %q, want %q", err, tc.reason)
			}
		})
	}
}

func TestParseLifecycleAcceptsEveryShapeTheBrokerDecodes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		member []string
	}{
		{"optional members absent", nil},
		{"a producer's frame", []string{`"runId":"led-1789661457000-3"`, `"id":"led-1789661457000-3"`, `"engine":"gpu-lease"`,
			`"scheduledOn":null`, `"seq":1`, `"createdAt":1789661457000`, `"startedAt":null`, `"completedAt":null`,
			`"error":null`, `"requesterId":"offload-harness/sess-1"`}},
		{"null runId and scheduledOn", []string{`"runId":null`, `"scheduledOn":null`}},
		{"null startedAt and completedAt", []string{`"startedAt":null`, `"completedAt":null`}},
		{"a failed job with an error and no start", []string{`"state":"failed"`, `"startedAt":null`, `"completedAt":1789661458000`, `"error":"CUDA out of memory"`}},
		{"a requesterId with a slash", []string{`"requesterId":"offload-harness/sess-1"`}},
		{"integers at the int64 bounds", []string{`"createdAt":-9223372036854775808`, `"startedAt":9223372036854775807`, `"seq":9223372036854775807`}},
		{"zero", []string{`"createdAt":0`, `"seq":0`}},
		// The stock peers decode createdAt and seq as Go int64, which a null
		// leaves at 0: they relay such frames, and so must every path of
		// ours but the ingress.
		{"null createdAt and seq", []string{`"createdAt":null`, `"seq":null`}},
		{"a valid surrogate pair", []string{`"model":"qwen-\ud83d\ude80"`}},
		{"raw multi-byte UTF-8 and plain escapes", []string{`"model":"qwën-🚀 \"q\" \\ \/ \n \u00e9"`}},
		{"unknown members of any type", []string{`"note":[1,"\ud800",{"x":1.5e3}]`, `"cost":1e3`, `"tags":null`, `"Createdat2":"x"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := `{"workloadInfo":` + workloadJSON("node-a", tc.member...) + `}`
			if _, err := ParseLifecycle(MethodStarted, json.RawMessage(params)); err != nil {
				t.Fatalf("refused %s: %v", params, err)
			}
		})
	}
}

// encoding/json keeps the last of the members that fold to seq: the seq the
// daemon records is the same one.
func TestParseLifecycleRecordsTheSeqEncodingJSONWouldDecode(t *testing.T) {
	for _, tc := range []struct {
		members []string
		want    int64
	}{
		{[]string{`"seq":3`}, 3},
		{[]string{`"seq":3`, `"Seq":5`}, 5},
		{[]string{`"SEQ":7`, `"seq":2`}, 2},
		{[]string{`"seq":4`, `"seq":null`}, 4}, // a null leaves the earlier value in place
		{[]string{`"seq":null`, `"Seq":6`}, 6},
	} {
		ev, err := ParseLifecycle(MethodStarted, json.RawMessage(`{"workloadInfo":`+workloadJSON("node-a", tc.members...)+`}`))
		if err != nil {
			t.Fatal(err)
		}
		var viaJSON struct{ Seq int64 }
		if err := json.Unmarshal(ev.Raw, &viaJSON); err != nil {
			t.Fatal(err)
		}
		if !ev.Info.HasSeq || ev.Info.Seq != tc.want || viaJSON.Seq != tc.want {
			t.Errorf("%v: recorded seq %d (has %v), encoding/json decodes %d; want %d", tc.members, ev.Info.Seq, ev.Info.HasSeq, viaJSON.Seq, tc.want)
		}
	}
}

func TestParseRemoveRefusesMembersTheBrokerCannotDecode(t *testing.T) {
	const text = "must be valid UTF-8 with no lone surrogates"
	for _, tc := range []struct{ name, params, reason string }{
		{"workloadId a number", `{"workloadId":5,"originatedFrom":"node-a"}`, "params.workloadId must be a string"},
		{"workloadId a lone surrogate", `{"workloadId":"job-\ud800","originatedFrom":"node-a"}`, "params.workloadId " + text},
		{"workloadId a raw invalid byte", "{\"workloadId\":\"job-\xff\",\"originatedFrom\":\"node-a\"}", "params.workloadId " + text},
		{"originatedFrom a lone low surrogate", `{"workloadId":"job-1","originatedFrom":"\udc00"}`, "params.originatedFrom " + text},
		{"a case-variant repeat whose first value is bad", `{"WorkloadID":"\ud800","workloadId":"job-1","originatedFrom":"node-a"}`,
			`params.workloadId ` + text + ` (sent as "WorkloadID")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRemove(json.RawMessage(tc.params))
			if err == nil || err.Error() != tc.reason {
				t.Fatalf("parseRemove(%s) error = %v, want %q", tc.params, err, tc.reason)
			}
		})
	}
	if _, err := ParseRemove(json.RawMessage(`{"workloadId":"job-\ud83d\ude80","originatedFrom":"node-a","why":"\ud800"}`)); err != nil {
		t.Fatalf("a removal with a surrogate pair in its id and an unknown member refused: %v", err)
	}
}
