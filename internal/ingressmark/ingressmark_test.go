package ingressmark

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/wireframe"
)

var run = wireframe.WorkloadKey{Origin: "11111111-2222-4333-8444-555555555555", Engine: "llamacpp", RunID: "run-1", ID: "job-1"}

func marker(t *testing.T, fill byte) *Marker {
	t.Helper()
	m, err := New(bytes.Repeat([]byte{fill}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// value is the member's value, the token a broker frame carries.
func value(t *testing.T, member []byte) []byte {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(append(append([]byte{'{'}, member...), '}'), &obj); err != nil {
		t.Fatalf("the member %s is not JSON: %v", member, err)
	}
	v, ok := obj[wireframe.IngressMarkName]
	if !ok || len(obj) != 1 {
		t.Fatalf("the member %s is not the mark alone", member)
	}
	return v
}

func TestAMarkChecksForItsRunWithItsLease(t *testing.T) {
	m := marker(t, 1)
	for _, lease := range []int{0, 5, 30, 86400} {
		member := m.Member(run, lease)
		if len(member)+1 > MaxMemberBytes {
			t.Fatalf("lease %d: the member %s and its comma are %d bytes, over MaxMemberBytes %d", lease, member, len(member)+1, MaxMemberBytes)
		}
		got, ok := m.Check(value(t, member), run)
		if !ok || got != lease {
			t.Fatalf("lease %d: Check = %d, %v", lease, got, ok)
		}
	}
}

// A mark is this node's word for one run: it does not check for any
// other run, under any other key, or with its lease changed.
func TestAMarkDoesNotCheckForAnotherRunKeyOrLease(t *testing.T) {
	m := marker(t, 1)
	v := value(t, m.Member(run, 30))
	others := map[string]wireframe.WorkloadKey{}
	for _, f := range []string{"Origin", "Engine", "RunID", "ID"} {
		k := run
		switch f {
		case "Origin":
			k.Origin = "22222222-2222-4333-8444-555555555555"
		case "Engine":
			k.Engine = "vllm"
		case "RunID":
			k.RunID = "run-2"
		case "ID":
			k.ID = "job-2"
		}
		others[f] = k
	}
	// Fields that run into each other: the lengths tell them apart.
	others["a shifted boundary"] = wireframe.WorkloadKey{Origin: run.Origin, Engine: "llamacppr", RunID: "un-1", ID: run.ID}
	for what, k := range others {
		if _, ok := m.Check(v, k); ok {
			t.Errorf("the mark checks for another %s", what)
		}
	}
	if _, ok := marker(t, 2).Check(v, run); ok {
		t.Error("the mark checks under another key")
	}
	changed := bytes.Replace(v, []byte(`"30.`), []byte(`"600.`), 1)
	if _, ok := m.Check(changed, run); ok {
		t.Error("the mark checks with its lease changed")
	}
}

func TestOnlyAMarkAsMemberWritesItChecks(t *testing.T) {
	m := marker(t, 1)
	v := string(value(t, m.Member(run, 30)))
	mac := strings.TrimSuffix(strings.SplitN(v, ".", 2)[1], `"`)
	// The MAC's 128 bits leave 4 unused in its last character: one of them
	// set is the same MAC written otherwise.
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	loose := mac[:21] + string(alphabet[strings.IndexByte(alphabet, mac[21])|1])
	for what, bad := range map[string]string{
		"not a string":          `30`,
		"no dot":                `"30` + mac + `"`,
		"a leading zero":        `"030.` + mac + `"`,
		"a sign":                `"+30.` + mac + `"`,
		"seven digits":          `"0000030.` + mac + `"`,
		"an escape":             `"\u00330.` + mac + `"`,
		"the MAC cut short":     `"30.` + mac[:21] + `"`,
		"the MAC padded":        `"30.` + mac + `=="`,
		"the MAC's unused bits": `"30.` + loose + `"`,
		"empty":                 `""`,
		"null":                  `null`,
		"one byte":              `"`,
	} {
		if _, ok := m.Check([]byte(bad), run); ok {
			t.Errorf("%s (%s) checks", what, bad)
		}
	}
}

func TestAKeyShorterThan128BitsIsRefused(t *testing.T) {
	if _, err := New(make([]byte, MinKeyBytes-1)); err == nil {
		t.Fatal("a 15-byte key was taken")
	}
}

// A mark is the HMAC-SHA256 the spec gives (3.5.3), whatever HMAC made it:
// a reused one, reset, writes the same mark as a fresh one, so a mark the
// broker holds from before a restart still checks.
func TestAMarkIsTheHMACOfItsMessageUnderTheKey(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	m, err := New(key)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range []wireframe.WorkloadKey{run, {Origin: "o", Engine: "e", RunID: "r", ID: strings.Repeat("i", 256)}, run} {
		var msg []byte
		for _, f := range []string{macDomain, k.Origin, k.Engine, k.RunID, k.ID, "30"} {
			msg = binary.AppendUvarint(msg, uint64(len(f)))
			msg = append(msg, f...)
		}
		h := hmac.New(sha256.New, key)
		h.Write(msg)
		want := `"` + wireframe.IngressMarkName + `":"30.` + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:macBytes]) + `"`
		if got := string(m.Member(k, 30)); got != want {
			t.Errorf("mark %d: %s, want %s", i, got, want)
		}
	}
}

// A mark is made for every ingress frame: its keyed HMAC is reused, so
// the one allocation is the member itself.
func TestAMarkCostsOneAllocation(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled values")
	}
	m := marker(t, 1)
	m.Member(run, 30)
	if n := testing.AllocsPerRun(100, func() { m.Member(run, 30) }); n > 1 {
		t.Errorf("a mark costs %v allocations, want 1", n)
	}
}

// The mark's cost on the ingress path (once per ingress frame, before
// ingestMu) and on the broker's replay (once per marked frame).
func BenchmarkMember(b *testing.B) {
	m, _ := New(bytes.Repeat([]byte{1}, 32))
	b.ReportAllocs()
	for b.Loop() {
		m.Member(run, 30)
	}
}

func BenchmarkCheck(b *testing.B) {
	m, _ := New(bytes.Repeat([]byte{1}, 32))
	member := m.Member(run, 30)
	v := member[len(`"`+wireframe.IngressMarkName+`":`):]
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := m.Check(v, run); !ok {
			b.Fatal("no check")
		}
	}
}
