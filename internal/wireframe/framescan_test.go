package wireframe

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// The single pass (framescan.go) is held to encoding/json twice: its
// grammar to json.Valid, and its decision on a whole peer frame to
// encoding/json decoding the frame into the workload's own Go types, the
// broker's rules written as those types' UnmarshalJSON (below).

func TestScanGrammarIsJSONValid(t *testing.T) {
	for _, doc := range []string{
		`{}`, ` {"a":1} `, `{"a":[1,2,{"b":null}],"c":"\u00e9\"\\\/\b\f\n\r\t"}`, `{"a":-0.5e+10}`, `[1]`, `"s"`, `1`, `null`,
		`{"a":1,}`, `{"a"}`, `{"a":}`, `{,}`, `{"a":1}}`, `{"a":1} {}`, `{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":1e}`,
		`{"a":-}`, `{"a":tru}`, `{"a":nul}`, `{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\x01\"}", `{"a":[1,]}`, `{"a":[1}`,
		`{"a":{"b":1]}`, `{"a" 1}`, `{1:1}`, ``, ` `, `{"a":"x`, `{"a":[`, `{"a":1`, `{"a":+1}`, `{"a":"\ud800"}`,
	} {
		var s Scan
		got := s.ScanFrame([]byte(doc)) == nil
		if want := json.Valid([]byte(doc)); got != want {
			t.Errorf("scan(%q) valid=%v, json.Valid=%v", doc, got, want)
		}
	}
}

func TestScanHoldsEncodingJSONsNestingLimit(t *testing.T) {
	for _, depth := range []int{maxJSONDepth - 1, maxJSONDepth, maxJSONDepth + 1} {
		for _, open := range []string{"[", `{"params":`, `{"x":`} {
			close := map[string]string{"[": "]", `{"params":`: "}", `{"x":`: "}"}[open]
			doc := []byte(strings.Repeat(open, depth) + "1" + strings.Repeat(close, depth))
			var s Scan
			got := s.ScanFrame(doc) == nil
			if want := json.Valid(doc); got != want {
				t.Errorf("depth %d of %q: scan valid=%v, json.Valid=%v", depth, open, got, want)
			}
		}
	}
}

func TestParseJSONIntegerIsStrconvOnJSONNumbers(t *testing.T) {
	for _, v := range []string{"0", "-0", "1", "-1", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
		"-9223372036854775809", "10000000000000000000", "123456789012345678901", "1.0", "1e3", "-", "01"} {
		n, ok := parseJSONInteger([]byte(v))
		want, err := strconv.ParseInt(v, 10, 64)
		if json.Valid([]byte(v)) {
			if ok != (err == nil) || (ok && n != want) {
				t.Errorf("parseJSONInteger(%q) = %d, %v; strconv %d, %v", v, n, ok, want, err)
			}
		} else if ok {
			t.Errorf("parseJSONInteger(%q) accepted text that is not a JSON number", v)
		}
	}
}

func TestTypedFieldIndexesFollowTheirLists(t *testing.T) {
	for name, idx := range map[string]int{"id": wfID, "model": wfModel, "engine": wfEngine, "state": wfState,
		"originatedFrom": wfOrigin, "runId": wfRunID, "scheduledOn": wfScheduledOn, "createdAt": wfCreatedAt,
		"startedAt": wfStartedAt, "completedAt": wfCompletedAt, "error": wfError, "requesterId": wfRequesterID, "seq": wfSeq} {
		if f := workloadTypedFields[foldKey(name)]; f.name != name || f.index != idx {
			t.Errorf("workload field %q: %+v, want index %d", name, f, idx)
		}
	}
	for name, idx := range map[string]int{"workloadId": rfWorkloadID, "originatedFrom": rfOrigin} {
		if f := removalTypedFields[foldKey(name)]; f.name != name || f.index != idx {
			t.Errorf("removal field %q: %+v, want index %d", name, f, idx)
		}
	}
	if len(workloadTypedFields) > maxTypedFields {
		t.Errorf("%d workload fields, typedValues holds %d", len(workloadTypedFields), maxTypedFields)
	}
}

func TestAppendUnquotedIsEncodingJSON(t *testing.T) {
	for _, q := range []string{`""`, `"abc"`, `"\u00e9\"\\\/\b\f\n\r\t"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00x"`,
		`"\ud83d\u0041"`, `"é"`, `"\uD83D\uDE00"`} {
		var want string
		if err := json.Unmarshal([]byte(q), &want); err != nil {
			t.Fatal(err)
		}
		if got := string(appendUnquoted(nil, []byte(q))); got != want {
			t.Errorf("appendUnquoted(%s) = %q, encoding/json %q", q, got, want)
		}
	}
}

// FuzzScanMatchesJSONValid: the scanner accepts exactly what json.Valid
// accepts.
func FuzzScanMatchesJSONValid(f *testing.F) {
	for _, s := range []string{benchSeedFrame, benchSeedParams, `{"a":[1,{"b":"\u00e9"}]}`, `{"a":1,}`, `[[[]]]`, `{"a":-0.5e+1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		var s Scan
		err := s.ScanFrame(doc)
		if valid := json.Valid(doc); (err == nil) != valid {
			t.Fatalf("scan error %v, json.Valid %v", err, valid)
		}
	})
}

// FuzzSinglePassMatchesTypedDecode: the single pass over a peer frame
// makes the decision encoding/json makes decoding the frame into the
// workload's types, for the same class of reason, and reads the same
// values.
func FuzzSinglePassMatchesTypedDecode(f *testing.F) {
	for _, s := range []string{
		benchSeedFrame,
		string(benchPeerFrame(nil, benchNodeID, 7)),
		`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"j","originatedFrom":"n"}}`,
		`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"j"}}`,
		`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"j","originatedFrom":"n","OriginatedFrom":null}}`,
		`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","model":"m","engine":"e","state":"s","originatedFrom":"n","createdAt":null,"seq":null}}}`,
		`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","model":"m","engine":"e","state":"s","originatedFrom":"n","seq":4,"SEQ":null}}}`,
		`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","model":"m","engine":"e","state":"s","originatedFrom":"n","ID":"k","runId":"r","RUNID":null}}}`,
		`{"jsonrpc":"2.0","method":"workload:started","params":{"resync":true,"Resync":null,"workloadInfo":{"id":"j","model":"m","engine":"e","state":"s","originatedFrom":"n","seq":9223372036854775807}}}`,
		`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"\ud800","model":"m","engine":"e","state":"s","originatedFrom":"n"}}}`,
		`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","model":"m","engine":"e","state":"s","originatedFrom":"n","createdAt":1.0}}}`,
		`{"jsonrpc":"2.0","method":"workload:started","Params":{"workloadInfo":{}},"params":{"workloadInfo":{"id":"j","model":"m","engine":"e","state":"s","originatedFrom":"n"}}}`,
		`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"` + strings.Repeat("a", 257) + `","model":"m","engine":"e","state":"s","originatedFrom":"n"}}}`,
		`{"jsonrpc":null,"JSONRPC":"2.0","method":"workload:started","params":{"workloadInfo":null}}`,
		`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","model":"m","engine":"e","state":"s","originatedFrom":"n"}},"PARAMS":{}}`,
		`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","model":"m","engine":"e","state":"s","originatedFrom":"n"}},"Params":5}`,
		`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","model":"m","engine":"e","state":"s","originatedFrom":"n"},"WorkloadInfo":"x"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// The workload byte bound is not the decoder's to hold: the
		// differential reads frames of any size.
		ev, err := parsePeerFrame(body, math.MaxInt)
		want, wantClass := typedDecodePeerFrame(body)
		if class := parseErrorClass(err); class != wantClass {
			t.Fatalf("single pass: %v (%s); typed decode: %s", err, class, wantClass)
		}
		if err != nil {
			return
		}
		if ev.isRemoval {
			if got := (typedPeerEvent{removal: true, id: ev.removal.Ref.ID, origin: ev.removal.Ref.Origin}); got != want {
				t.Fatalf("single pass read %+v, typed decode %+v", got, want)
			}
			return
		}
		i := ev.life.Info
		got := typedPeerEvent{id: i.ID, origin: i.OriginatedFrom, model: i.Model, engine: i.Engine, state: i.State,
			runID: i.RunID, scheduledOn: i.ScheduledOn, seq: i.Seq, hasSeq: i.HasSeq, resync: ev.life.Resync}
		if got != want {
			t.Fatalf("single pass read %+v, typed decode %+v", got, want)
		}
	})
}

// The classes of reason a frame is refused for.
const (
	classAccepted = "accepted"
	classUTF8     = "not UTF-8"
	classSyntax   = "not JSON"
	classBound    = "a field over its bound"
	classRule     = "a type or a rule"
)

func parseErrorClass(err error) string {
	var tooLong *FieldTooLongError
	var syntax *json.SyntaxError
	switch {
	case err == nil:
		return classAccepted
	case errors.Is(err, errFrameNotUTF8):
		return classUTF8
	case errors.As(err, &syntax), errors.Is(err, errScanSyntax):
		return classSyntax
	case errors.As(err, &tooLong):
		return classBound
	}
	return classRule
}

// typedPeerEvent is what either reading takes from a frame.
type typedPeerEvent struct {
	removal                                              bool
	id, origin, model, engine, state, runID, scheduledOn string
	seq                                                  int64
	hasSeq, resync                                       bool
}

// typedDecodePeerFrame is the reference: UTF-8 first, then encoding/json
// into the envelope, the params and the workload (or removal) types.
func typedDecodePeerFrame(body []byte) (typedPeerEvent, string) {
	if !utf8.Valid(body) {
		return typedPeerEvent{}, classUTF8
	}
	if !json.Valid(body) {
		return typedPeerEvent{}, classSyntax
	}
	var env struct {
		JSONRPC string          `json:"jsonrpc"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(body, &env); err != nil || env.JSONRPC != "2.0" {
		return typedPeerEvent{}, classRule
	}
	if !isJSONObject(env.Params) {
		return typedPeerEvent{}, classRule
	}
	if env.Method == MethodRemove {
		// originatedFrom is optional, as in the stock peers' decode: an
		// older sender's removal names none.
		var r struct {
			WorkloadID     tdString     `json:"workloadId"`
			OriginatedFrom tdNullString `json:"originatedFrom"`
		}
		if err := json.Unmarshal(env.Params, &r); err != nil {
			return typedPeerEvent{}, tdClass(err)
		}
		if r.WorkloadID.v == "" {
			return typedPeerEvent{}, classRule
		}
		return typedPeerEvent{removal: true, id: r.WorkloadID.v, origin: r.OriginatedFrom.v}, classAccepted
	}
	if !IsLifecycleMethod(env.Method) {
		return typedPeerEvent{}, classRule
	}
	var p struct {
		WorkloadInfo json.RawMessage `json:"workloadInfo"`
		Resync       bool            `json:"resync"`
	}
	if err := json.Unmarshal(env.Params, &p); err != nil || !isJSONObject(p.WorkloadInfo) {
		return typedPeerEvent{}, classRule
	}
	var w struct {
		ID             tdString     `json:"id"`
		Model          tdString     `json:"model"`
		Engine         tdString     `json:"engine"`
		State          tdState      `json:"state"`
		OriginatedFrom tdString     `json:"originatedFrom"`
		RunID          tdNullString `json:"runId"`
		ScheduledOn    tdNullString `json:"scheduledOn"`
		CreatedAt      tdNullMillis `json:"createdAt"`
		StartedAt      tdNullMillis `json:"startedAt"`
		CompletedAt    tdNullMillis `json:"completedAt"`
		Error          tdNullText   `json:"error"`
		RequesterID    tdNullString `json:"requesterId"`
		Seq            tdSeq        `json:"seq"`
	}
	if err := json.Unmarshal(p.WorkloadInfo, &w); err != nil {
		return typedPeerEvent{}, tdClass(err)
	}
	if w.ID.v == "" || w.Model.v == "" || w.Engine.v == "" || w.State.v == "" || w.OriginatedFrom.v == "" {
		return typedPeerEvent{}, classRule
	}
	return typedPeerEvent{id: w.ID.v, origin: w.OriginatedFrom.v, model: w.Model.v, engine: w.Engine.v, state: w.State.v,
		runID: w.RunID.v, scheduledOn: w.ScheduledOn.v, seq: w.Seq.v, hasSeq: w.Seq.set, resync: p.Resync}, classAccepted
}

// errTDBound is the reference types' refusal of a string over its bound.
var errTDBound = errors.New("over its bound")

func tdClass(err error) string {
	if errors.Is(err, errTDBound) {
		return classBound
	}
	return classRule
}

// tdText decodes a string the broker can store: a string token (null
// only when nullable, when it leaves the value as it was) whose text is
// UTF-8 with no lone surrogate, at most limit decoded bytes (0: no bound).
func tdText(b []byte, nullable bool, limit int, dst *string) error {
	if string(b) == "null" {
		if nullable {
			return nil
		}
		return errors.New("null")
	}
	if !utf8.Valid(b) || !tdSurrogatesPaired(b) {
		return errors.New("not well-formed")
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if limit > 0 && len(s) > limit {
		return errTDBound
	}
	*dst = s
	return nil
}

// tdSurrogatesPaired reports whether every \u escape of a surrogate in the
// token is a high one followed by an escaped low one.
func tdSurrogatesPaired(b []byte) bool {
	s := string(b)
	for i := 0; i+6 <= len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		if s[i+1] != 'u' {
			i++ // an escaped character, a backslash included
			continue
		}
		r, err := strconv.ParseUint(s[i+2:i+6], 16, 32)
		if err != nil {
			return false
		}
		switch {
		case 0xdc00 <= r && r < 0xe000:
			return false
		case 0xd800 <= r && r < 0xdc00:
			if i+12 > len(s) || s[i+6] != '\\' || s[i+7] != 'u' {
				return false
			}
			low, err := strconv.ParseUint(s[i+8:i+12], 16, 32)
			if err != nil || low < 0xdc00 || low >= 0xe000 {
				return false
			}
			i += 11
		default:
			i += 5
		}
	}
	return true
}

type (
	tdString     struct{ v string } // a key field: a string, at most 256 bytes
	tdState      struct{ v string } // a string, unbounded
	tdNullString struct{ v string } // a key field that may be null
	tdNullText   struct{ v string } // a text that may be null, unbounded
	tdNullMillis struct{ v int64 }
	tdSeq        struct {
		v   int64
		set bool
	}
)

func (d *tdString) UnmarshalJSON(b []byte) error { return tdText(b, false, MaxKeyFieldBytes, &d.v) }
func (d *tdState) UnmarshalJSON(b []byte) error  { return tdText(b, false, 0, &d.v) }
func (d *tdNullString) UnmarshalJSON(b []byte) error {
	return tdText(b, true, MaxKeyFieldBytes, &d.v)
}
func (d *tdNullText) UnmarshalJSON(b []byte) error { return tdText(b, true, 0, &d.v) }

func (d *tdNullMillis) UnmarshalJSON(b []byte) error {
	var v *int64
	return json.Unmarshal(b, &v)
}

// A null seq is the stock peers' int64 left as it was: no seq.
func (d *tdSeq) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var v int64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if v < 0 {
		return errors.New("seq below 0")
	}
	d.v, d.set = v, true
	return nil
}
