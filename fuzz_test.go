package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// The fuzz targets' seed corpora live in testdata/fuzz/<target>/: every
// bypass the ingress design names (the Host forms of issue 5 are fuzzed
// beside the Host check, in internal/httpguard).
// .ci/run runs each target for a bounded time after the tests.

const fuzzNodeID = "11111111-2222-4333-8444-555555555555"

// FuzzIngressFrame feeds arbitrary bodies to the ingress frame path. An
// accepted frame must be one the peers can trust: its origin is this node,
// as encoding/json itself decodes the body; its state is one of the five;
// its id is at most 256 bytes; and no name at a checked level folds to
// resync or to a known field spelt another way.
func FuzzIngressFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		fr, err := parseIngressFrame(body, fuzzNodeID, defaultWorkloadMaxBytes)
		if err != nil {
			return
		}
		if n := len(fr.params); n > defaultWorkloadMaxBytes+len(`,"originatedFrom":""`)+len(fuzzNodeID) {
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
			if fr.removal.ref.origin != fuzzNodeID || len(fr.removal.ref.id) > maxKeyFieldBytes {
				t.Fatalf("accepted removal %+v", fr.removal.ref)
			}
		} else {
			var p struct {
				Params struct {
					WorkloadInfo workloadInfo
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
			if p.Params.Resync || fr.life.resync {
				t.Fatal("accepted a frame that decodes as a re-assertion")
			}
			if _, ok := workloadStates[fr.life.info.State]; !ok {
				t.Fatalf("accepted state %q", fr.life.info.State)
			}
			if fr.life.info.OriginatedFrom != fuzzNodeID || len(fr.life.info.ID) > maxKeyFieldBytes {
				t.Fatalf("accepted workload %+v", fr.life.info)
			}
		}
		assertNamesClean(t, body)
	})
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
// longer line is one errLineTooLong, and nothing is buffered past the limit.
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
		lr := newLineReader(bytes.NewReader(input), limit)
		var got []string
		for {
			line, err := lr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if errors.Is(err, errLineTooLong) {
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

// The targets below hold the ingress's fast paths to the slow ones they
// replace: the member scanner to encoding/json's Decoder, the inline
// spelling check to the map one, and the resync pre-check to a full decode.

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
			if got[i].name != want[i].name || !bytes.Equal(got[i].value, want[i].value) {
				t.Fatalf("member %d: %q=%s, decoder %q=%s", i, got[i].name, got[i].value, want[i].name, want[i].value)
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

// FuzzMayHoldResyncIsConservative: when the pre-check says params cannot
// hold a resync member, encoding/json finds none.
func FuzzMayHoldResyncIsConservative(f *testing.F) {
	for _, s := range []string{`{"resync":true}`, `{"ReSyNc":1}`, `{"reſync":1}`, `{"r\u0065sync":1}`, `{"workloadInfo":{}}`, `{"x":"resync"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var m map[string]json.RawMessage
		if json.Unmarshal(p, &m) != nil || mayHoldResync(p) {
			return
		}
		for k := range m {
			if strings.EqualFold(k, "resync") {
				t.Fatalf("mayHoldResync missed %q in %s", k, p)
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
	s := new(frameScan)
	if err := s.scanParams(doc); err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	return &s.levels[levelParams]
}
