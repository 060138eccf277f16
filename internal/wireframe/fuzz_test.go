package wireframe

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// The fuzz targets' seed corpora live in testdata/fuzz/<target>/: every
// bypass the ingress design names. .ci/run runs each target for a bounded
// time after the tests.

// FuzzIngressFrame feeds arbitrary bodies to the ingress frame path. An
// accepted frame must be one the peers can trust: its origin is this node,
// as encoding/json itself decodes the body; its state is one of the five
// and the one its method carries; its times, as encoding/json decodes
// them, are epoch milliseconds, and createdAt and seq are not null; its id
// is at most 256 bytes; and no name at a checked level folds to resync or
// to a known field spelt another way.
func FuzzIngressFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		fr, err := ParseIngress(body, fuzzNodeID, DefaultWorkloadMaxBytes)
		if err != nil {
			return
		}
		if n := len(fr.Params); n > DefaultWorkloadMaxBytes+len(`,"originatedFrom":""`)+len(fuzzNodeID) {
			t.Fatalf("accepted params of %d bytes, over the workload bound and the stamp", n)
		}
		if fr.isRemoval() {
			var p struct {
				Params struct{ WorkloadID, OriginatedFrom string }
			}
			if err := json.Unmarshal(body, &p); err != nil {
				t.Fatalf("accepted a removal encoding/json cannot decode: %v", err)
			}
			if p.Params.OriginatedFrom != "" && p.Params.OriginatedFrom != fuzzNodeID {
				t.Fatalf("accepted a removal that encoding/json decodes as from %q", p.Params.OriginatedFrom)
			}
			if fr.Removal.Ref.Origin != fuzzNodeID || len(fr.Removal.Ref.ID) > MaxKeyFieldBytes {
				t.Fatalf("accepted removal %+v", fr.Removal.Ref)
			}
		} else {
			var p struct {
				Method string
				Params struct {
					WorkloadInfo WorkloadInfo
					Resync       bool
				}
			}
			if err := json.Unmarshal(body, &p); err != nil {
				t.Fatalf("accepted a frame encoding/json cannot decode: %v", err)
			}
			w := p.Params.WorkloadInfo
			if w.OriginatedFrom != "" && w.OriginatedFrom != fuzzNodeID {
				t.Fatalf("accepted a frame that encoding/json decodes as from %q", w.OriginatedFrom)
			}
			if p.Params.Resync || fr.Life.Resync {
				t.Fatal("accepted a frame that decodes as a re-assertion")
			}
			if _, ok := workloadStates[fr.Life.Info.State]; !ok {
				t.Fatalf("accepted state %q", fr.Life.Info.State)
			}
			if !methodAgrees(fr.Method, fr.Life.Info.State) || fr.Method != p.Method || !methodAgrees(p.Method, w.State) {
				t.Fatalf("accepted state %q on method %s", fr.Life.Info.State, fr.Method)
			}
			assertIngressNumbers(t, body)
			if fr.Life.Info.OriginatedFrom != fuzzNodeID || len(fr.Life.Info.ID) > MaxKeyFieldBytes {
				t.Fatalf("accepted workload %+v", fr.Life.Info)
			}
		}
		assertNamesClean(t, body)
	})
}

// assertIngressNumbers decodes an accepted lifecycle body's times and seq
// with encoding/json and fails on a null createdAt or seq, or a time below
// MinEpochMillis.
func assertIngressNumbers(t *testing.T, body []byte) {
	var p struct {
		Params struct {
			WorkloadInfo struct {
				CreatedAt, StartedAt, CompletedAt, Seq json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("accepted a frame encoding/json cannot decode: %v", err)
	}
	w := p.Params.WorkloadInfo
	if string(w.CreatedAt) == "null" || string(w.Seq) == "null" {
		t.Fatalf("accepted a null createdAt (%s) or seq (%s)", w.CreatedAt, w.Seq)
	}
	for _, v := range []json.RawMessage{w.CreatedAt, w.StartedAt, w.CompletedAt} {
		if v == nil || string(v) == "null" {
			continue
		}
		var n int64
		if err := json.Unmarshal(v, &n); err != nil || n < MinEpochMillis {
			t.Fatalf("accepted time %s (%v): not epoch milliseconds", v, err)
		}
	}
}

// assertNamesClean walks the envelope, params and workloadInfo levels of an
// accepted body with its own reading of the JSON (json.Decoder tokens, and
// strings.EqualFold rather than foldKey) and fails on a name that folds to
// resync, a known field spelt otherwise, or two names that fold together.
func assertNamesClean(t *testing.T, body []byte) {
	levels := []struct {
		path  []string
		known []string
	}{
		{nil, []string{"jsonrpc", "id", "method", "params"}},
		{[]string{"params"}, []string{"workloadInfo", "workloadId", "originatedFrom"}},
		{[]string{"params", "workloadInfo"}, []string{"id", "model", "engine", "state", "originatedFrom", "scheduledOn",
			"runId", "seq", "createdAt", "startedAt", "completedAt", "error", "requesterId"}},
	}
	for _, l := range levels {
		names, ok := namesAt(body, l.path)
		if !ok {
			continue
		}
		for i, n := range names {
			if strings.EqualFold(n, "resync") {
				t.Fatalf("accepted name %q at %v", n, l.path)
			}
			for _, k := range l.known {
				if strings.EqualFold(n, k) && n != k {
					t.Fatalf("accepted %q for %q at %v", n, k, l.path)
				}
			}
			for _, m := range names[:i] {
				if strings.EqualFold(n, m) {
					t.Fatalf("accepted colliding names %q and %q at %v", m, n, l.path)
				}
			}
		}
	}
}

// namesAt returns the member names of the object at path (each step an
// exact member name), in order with repeats, or false when there is none.
func namesAt(body []byte, path []string) ([]string, bool) {
	raw := json.RawMessage(body)
	for _, step := range path {
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil {
			return nil, false
		}
		var ok bool
		if raw, ok = m[step]; !ok {
			return nil, false
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		names = append(names, tok.(string))
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return nil, false
		}
	}
	return names, true
}

// FuzzLineReader checks the stdio line reader against a reference split:
// every line of at most the limit comes out intact and in order, every
// longer line is one ErrLineTooLong, and nothing is buffered past the limit.
func FuzzLineReader(f *testing.F) {
	const limit = 16
	f.Fuzz(func(t *testing.T, input []byte) {
		var want []string
		parts := bytes.Split(input, []byte("\n"))
		if len(parts[len(parts)-1]) == 0 {
			parts = parts[:len(parts)-1] // the input ended with a newline
		}
		for _, p := range parts {
			p = bytes.TrimSuffix(p, []byte("\r"))
			if len(p) > limit {
				want = append(want, "!too long")
			} else {
				want = append(want, string(p))
			}
		}
		lr := NewLineReader(bytes.NewReader(input), limit)
		var got []string
		for {
			line, err := lr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if errors.Is(err, ErrLineTooLong) {
				got = append(got, "!too long")
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(line) > limit {
				t.Fatalf("line of %d bytes over the limit %d", len(line), limit)
			}
			got = append(got, string(line))
		}
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") || len(got) != len(want) {
			t.Fatalf("lines %q, want %q", got, want)
		}
	})
}

// FuzzObjectMembersMatchesDecoder: the scanner splits every object exactly
// as the Decoder does, and refuses exactly what it refuses.
func FuzzObjectMembersMatchesDecoder(f *testing.F) {
	for _, s := range []string{benchSeedFrame, benchSeedParams, `{}`, ` { "a" : 1 , "b":[1,{"c":"}"}], "\u0041":"x\"y", "ſ":null } `,
		`{"a":1}{}`, `{"a":1} x`, `[1]`, `{"a":"\xff"}`, "{\"\xffa\":1}", `{"a\\b":-1.5e3,"t":true,"f":false}`, `{"a":{"b":{"c":[[],{}]}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, gerr := objectMembers(raw)
		want, werr := objectMembersDecoded(raw)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("errors differ: scanner %v, decoder %v", gerr, werr)
		}
		if gerr != nil {
			return
		}
		if len(got) != len(want) {
			t.Fatalf("%d members, decoder %d", len(got), len(want))
		}
		for i := range got {
			if got[i].Name != want[i].Name || !bytes.Equal(got[i].Value, want[i].Value) {
				t.Fatalf("member %d: %q=%s, decoder %q=%s", i, got[i].Name, got[i].Value, want[i].Name, want[i].Value)
			}
		}
	})
}

// FuzzCheckSpellingInlineMatchesMap: the allocation-free spelling check
// gives the map-based check's answer.
func FuzzCheckSpellingInlineMatchesMap(f *testing.F) {
	for _, s := range []string{"id\x00model", "id\x00ID", "reſync", "originatedfrom", "a\x00b\x00A", "ſ\x00S\x00s", "K\x00k"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var names []string
		for _, n := range bytes.Split([]byte(s), []byte{0}) {
			names = append(names, string(n))
		}
		ms := levelOfNames(t, names)
		for _, known := range []map[string]string{workloadFields, paramsFields, envelopeFields} {
			a, b := checkSpelling("x", ms, known), checkSpellingMap("x", ms, known)
			if (a == nil) != (b == nil) || (a != nil && a.Error() != b.Error()) {
				t.Fatalf("inline %v, map %v", a, b)
			}
		}
	})
}

// levelOfNames scans an object whose members have the given names (each
// encoded as encoding/json encodes it) and returns its level, as
// checkSpelling reads it.
func levelOfNames(t testing.TB, names []string) *scanLevel {
	t.Helper()
	doc := []byte{'{'}
	for i, n := range names {
		if i > 0 {
			doc = append(doc, ',')
		}
		doc = append(appendJSONString(doc, n), ":1"...)
	}
	doc = append(doc, '}')
	s := new(Scan)
	if err := s.scanParams(doc); err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	return &s.levels[levelParams]
}
