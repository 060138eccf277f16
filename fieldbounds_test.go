package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/wireframe"
)

// longNoteWorkload is longErrorWorkload with its long text in a member the
// daemon does not know instead of error. The ingress bounds a producer's
// error text (wireframe.MaxIngressErrorBytes) but passes unknown members through, so
// this is how a producer's frame can still be over the broker's line limit.
func longNoteWorkload(id, origin string) map[string]any {
	w := testframe.Workload(id, "failed", origin, map[string]any{"note": strings.Repeat("n", longErrorBytes)})
	if origin == "" {
		delete(w, "originatedFrom")
	}
	return w
}

// longNoteFrame is the workload:errored notification of longNoteWorkload.
func longNoteFrame(t testing.TB, id, origin string) []byte {
	t.Helper()
	p, err := json.Marshal(map[string]any{"workloadInfo": longNoteWorkload(id, origin)})
	if err != nil {
		t.Fatal(err)
	}
	return wireframe.EncodeNotification(wireframe.MethodErrored, p)
}

// --- field bounds -------------------------------------------------------------

// boundedWorkloadFields are the workload object's fields held to
// wireframe.MaxKeyFieldBytes on every path.
var boundedWorkloadFields = []string{"id", "runId", "engine", "model", "scheduledOn", "originatedFrom", "requesterId"}

// fieldOf is a `"name":"value"` member, value written as it is (escapes
// and all).
func fieldOf(name, value string) string { return `"` + name + `":"` + value + `"` }

// overBound is the reason a field over its bound is refused with.
func overBound(field string, size int) string {
	return field + " is " + itoa(size) + " bytes, over its " + itoa(wireframe.MaxKeyFieldBytes) + "-byte bound"
}

// fieldBoundViolations are workload object members one byte (or more) over
// their bound, each with the reason the daemon gives; every path refuses
// them. The bound is on the decoded value, so a value whose escapes make it
// long on the wire but short decoded is not here but in fieldsAtTheirBound.
func fieldBoundViolations() []struct{ name, member, reason string } {
	var out []struct{ name, member, reason string }
	for _, f := range boundedWorkloadFields {
		out = append(out, struct{ name, member, reason string }{
			f + " 257 bytes", fieldOf(f, strings.Repeat("a", 257)), overBound("workloadInfo."+f, 257)})
	}
	return append(out,
		struct{ name, member, reason string }{"engine 86 three-byte runes (258 bytes)",
			fieldOf("engine", strings.Repeat("€", 86)), overBound("workloadInfo.engine", 258)},
		struct{ name, member, reason string }{"engine 128 escaped two-byte runes and one byte (257 bytes decoded)",
			fieldOf("engine", strings.Repeat(`\u00e9`, 128)+"x"), overBound("workloadInfo.engine", 257)},
		struct{ name, member, reason string }{"runId 900 KB",
			fieldOf("runId", strings.Repeat("r", 900_000)), overBound("workloadInfo.runId", 900_000)},
	)
}

// fieldsAtTheirBound are members exactly at their bound, which every path
// accepts.
func fieldsAtTheirBound() []struct{ name, member string } {
	var out []struct{ name, member string }
	for _, f := range boundedWorkloadFields {
		out = append(out, struct{ name, member string }{f + " 256 bytes", fieldOf(f, strings.Repeat("a", 256))})
	}
	return append(out,
		struct{ name, member string }{"engine 128 two-byte runes", fieldOf("engine", strings.Repeat("é", 128))},
		struct{ name, member string }{"engine 128 escaped two-byte runes (768 bytes escaped)", fieldOf("engine", strings.Repeat(`\u00e9`, 128))},
		struct{ name, member string }{"engine 64 escaped surrogate pairs (256 bytes decoded)", fieldOf("engine", strings.Repeat(`\ud83d\ude80`, 64))},
		struct{ name, member string }{"engine 256 escaped solidi", fieldOf("engine", strings.Repeat(`\/`, 256))},
		struct{ name, member string }{"state 300 bytes (in no key's bound)", fieldOf("state", strings.Repeat("s", 300))},
		struct{ name, member string }{"an unknown member of 100 KB", fieldOf("note", strings.Repeat("n", 100<<10))},
	)
}

func TestParseStepBoundsEveryKeyFieldOfAWorkload(t *testing.T) {
	for _, tc := range fieldBoundViolations() {
		t.Run(tc.name, func(t *testing.T) {
			info := testframe.WorkloadJSON("job-1", "running", "node-a", tc.member)
			_, err := wireframe.ParseLifecycle(wireframe.MethodStarted, json.RawMessage(`{"workloadInfo":`+info+`}`))
			var tooLong *wireframe.FieldTooLongError
			if !errors.As(err, &tooLong) || err.Error() != tc.reason {
				t.Fatalf("parseLifecycle = %v, want %q", err, tc.reason)
			}
		})
	}
	for _, tc := range fieldsAtTheirBound() {
		t.Run(tc.name, func(t *testing.T) {
			info := testframe.WorkloadJSON("job-1", "running", "node-a", tc.member)
			if _, err := wireframe.ParseLifecycle(wireframe.MethodStarted, json.RawMessage(`{"workloadInfo":`+info+`}`)); err != nil {
				t.Fatalf("parseLifecycle refused a field at its bound: %v", err)
			}
		})
	}
	// A spelling encoding/json folds to the field is held to its bound, and
	// named as sent.
	_, err := wireframe.ParseLifecycle(wireframe.MethodStarted, json.RawMessage(`{"workloadInfo":`+testframe.WorkloadJSON("job-1", "running", "node-a", fieldOf("ENGINE", strings.Repeat("a", 257)))+`}`))
	if want := overBound("workloadInfo.engine", 257) + ` (sent as "ENGINE")`; err == nil || err.Error() != want {
		t.Fatalf("a variant spelling over the bound: %v, want %q", err, want)
	}
}

func TestParseStepBoundsARemovalsIdAndOrigin(t *testing.T) {
	long, at := strings.Repeat("a", 257), strings.Repeat("a", 256)
	for _, tc := range []struct {
		name, params, reason string
	}{
		{"workloadId 257 bytes", `{"workloadId":"` + long + `","originatedFrom":"node-a"}`, overBound("params.workloadId", 257)},
		{"originatedFrom 257 bytes", `{"workloadId":"job-1","originatedFrom":"` + long + `"}`, overBound("params.originatedFrom", 257)},
		{"a variant spelling of workloadId", `{"workloadId":"job-1","WorkloadID":"` + long + `","originatedFrom":"node-a"}`,
			overBound("params.workloadId", 257) + ` (sent as "WorkloadID")`},
		{"both at 256 bytes", `{"workloadId":"` + at + `","originatedFrom":"` + at + `"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := wireframe.ParseRemove(json.RawMessage(tc.params))
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("parseRemove refused fields at their bound: %v", err)
				}
				return
			}
			if err == nil || err.Error() != tc.reason {
				t.Fatalf("parseRemove = %v, want %q", err, tc.reason)
			}
		})
	}
}

func TestPeerPortRefusesAFieldOverItsBoundWith400NamingIt(t *testing.T) {
	// The field bounds are what is held here: the workload bound, which
	// would refuse a 900 KB field first (413), is raised out of the way.
	h := newNetPeerHarness(t, withWorkloadMaxBytes(wireframe.MaxWorkloadMaxBytes))
	origin := h.client.Principal
	cases := fieldBoundViolations()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, reason := netPostAnswer(t, h.c, h.addr, []byte(testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", origin, tc.member))))
			if status != http.StatusBadRequest || reason != httpguard.ClipReason(tc.reason) {
				t.Fatalf("status %d (%q), want 400 %q", status, reason, tc.reason)
			}
		})
	}
	// In a batch, each element is held to the bounds as if it came alone.
	ans := netPostBatch(t, h.c, h.addr,
		[]byte(testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", origin, fieldOf("engine", strings.Repeat("a", 257))))),
		[]byte(testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", origin, fieldOf("id", "in-batch"), fieldOf("engine", strings.Repeat("a", 256))))),
		testframe.Removal(strings.Repeat("w", 257), origin),
	)
	want := []peerwire.BatchResult{
		{Status: http.StatusBadRequest, Reason: overBound("workloadInfo.engine", 257)},
		{Status: http.StatusOK, Reason: ""},
		{Status: http.StatusBadRequest, Reason: overBound("params.workloadId", 257)},
	}
	if ans.status != http.StatusOK || !slices.Equal(ans.results, want) {
		t.Fatalf("batch answered %d %v, want 200 %v", ans.status, ans.results, want)
	}
	// A single removal too.
	if status, reason := netPostAnswer(t, h.c, h.addr, testframe.Removal("job-1", strings.Repeat("o", 257))); status != http.StatusBadRequest ||
		reason != overBound("params.originatedFrom", 257) {
		t.Fatalf("removal with a 257-byte origin: %d (%q), want 400 naming params.originatedFrom", status, reason)
	}
	h.barrier(t)
	if ids := netUpsertIDs(h.n); len(ids) != 2 || ids["in-batch"] != 1 {
		t.Fatalf("the broker got %v, want only in-batch and the barrier", ids)
	}
	if rm := h.n.broker.WithMethod(wireframe.MethodRemove); len(rm) != 0 {
		t.Fatalf("a refused removal reached the broker: %v", rm)
	}
	if got, want := h.n.m.fieldBoundRefusals.Get("peer"), uint64(len(cases)+3); got != want {
		t.Fatalf("field bound refusals counted for the peer port: %d, want %d", got, want)
	}
	if n := h.n.m.peers.DedupLen(); n != 2 {
		t.Fatalf("the dedup holds %d keys, want 2 (in-batch and the barrier)", n)
	}
}

func TestPeerPortAcceptsFieldsAtTheirBound(t *testing.T) {
	// Some fields at their bound are written with escapes, over 16 KiB of
	// text: the workload bound is raised out of the way.
	h := newNetPeerHarness(t, withWorkloadMaxBytes(wireframe.MaxWorkloadMaxBytes))
	for i, tc := range fieldsAtTheirBound() {
		t.Run(tc.name, func(t *testing.T) {
			// A distinct run per case, so none is a duplicate of another.
			members := []string{`"seq":` + itoa(i+1), tc.member}
			body := testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", h.client.Principal, members...))
			if status, reason := netPostAnswer(t, h.c, h.addr, []byte(body)); status != http.StatusOK || reason != "ok" {
				t.Fatalf("status %d (%q), want 200 ok", status, reason)
			}
		})
	}
}

func TestIngressRefusesAFieldOverItsBoundWith400NamingIt(t *testing.T) {
	// The field bounds are what is held here: the workload bound, which
	// would refuse a 900 KB field first (413), is raised out of the way.
	n, q := ifxNode(t, withWorkloadMaxBytes(wireframe.MaxWorkloadMaxBytes))
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	addr := n.m.IngressAddr()
	refused := 0
	for _, tc := range fieldBoundViolations() {
		if strings.HasPrefix(tc.name, "originatedFrom") {
			// The ingress takes only this node's id there, which is short;
			// a longer value is refused as not this node (its own rule).
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			status, reason := testkit.PostIngress(t, addr, testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", "", tc.member)))
			if status != http.StatusBadRequest || reason != httpguard.ClipReason("bad frame: "+tc.reason) {
				t.Fatalf("status %d (%q), want 400 naming %q", status, reason, tc.reason)
			}
		})
		refused++
	}
	status, reason := testkit.PostIngress(t, addr, string(testframe.Removal(strings.Repeat("w", 257), "")))
	if status != http.StatusBadRequest || !strings.Contains(reason, overBound("params.workloadId", 257)) {
		t.Fatalf("removal with a 257-byte id: %d (%q), want 400 naming params.workloadId", status, reason)
	}
	refused++
	ifxBrokerBarrier(t, n)
	if got := len(n.broker.WithMethod(wireframe.MethodUpsert)) + len(n.broker.WithMethod(wireframe.MethodRemove)); got != 0 {
		t.Fatalf("%d refused frames reached the broker", got)
	}
	if got := ifxDrain(q); len(got) != 0 || ifxTrackedCount(n) != 0 || ifxRememberedCount(n) != 0 {
		t.Fatalf("refused frames were queued (%s), tracked (%d) or remembered (%d)", ifxDescribe(got), ifxTrackedCount(n), ifxRememberedCount(n))
	}
	if got := n.m.fieldBoundRefusals.Get("ingress"); got != uint64(refused) {
		t.Fatalf("field bound refusals counted for the ingress: %d, want %d", got, refused)
	}
}

func TestIngressBoundsAProducersErrorTextTo4KiB(t *testing.T) {
	n, q := ifxNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	addr := n.m.IngressAddr()
	at := testframe.LifecycleJSON(testframe.MethodFor("failed"), testframe.WorkloadJSON("job-err-at", "failed", "", fieldOf("error", strings.Repeat("e", wireframe.MaxIngressErrorBytes))))
	if status, reason := testkit.PostIngress(t, addr, at); status != http.StatusOK {
		t.Fatalf("a 4096-byte error: %d (%q), want 200", status, reason)
	}
	// Escapes count decoded: 2048 é written as \u00e9 are 4096 bytes.
	escaped := testframe.LifecycleJSON(testframe.MethodFor("failed"), testframe.WorkloadJSON("job-err-escaped", "failed", "", fieldOf("error", strings.Repeat(`\u00e9`, wireframe.MaxIngressErrorBytes/2))))
	if status, reason := testkit.PostIngress(t, addr, escaped); status != http.StatusOK {
		t.Fatalf("a 4096-byte error written with escapes: %d (%q), want 200", status, reason)
	}
	over := testframe.LifecycleJSON(testframe.MethodFor("failed"), testframe.WorkloadJSON("job-err-over", "failed", "", fieldOf("error", strings.Repeat("e", wireframe.MaxIngressErrorBytes+1))))
	want := "bad frame: workloadInfo.error is 4097 bytes, over its 4096-byte bound"
	if status, reason := testkit.PostIngress(t, addr, over); status != http.StatusBadRequest || reason != want {
		t.Fatalf("a 4097-byte error: %d (%q), want 400 %q", status, reason, want)
	}
	n.broker.WaitUpserts("job-err-escaped", 1)
	ifxBrokerBarrier(t, n)
	if c := n.broker.UpsertCount("job-err-over"); c != 0 {
		t.Fatalf("the refused frame reached the broker %d time(s)", c)
	}
	for _, f := range ifxDrain(q) {
		if id, _ := ifxFrameWorkload(t, f); id == "job-err-over" {
			t.Fatal("the refused frame was queued for the peers")
		}
	}
	if got := n.m.fieldBoundRefusals.Get("ingress"); got != 1 {
		t.Fatalf("field bound refusals counted for the ingress: %d, want 1", got)
	}
}

// The broker's own frames keep their long error texts: error is in no key,
// and the bound on it is the ingress's alone (beside the workload bound,
// which holds the whole frame on every path, and is raised here to its
// most). Such a frame is tracked and broadcast as it arrived; so is a
// peer's relayed to the broker.
func TestLocalChannelAndPeerPortRelayALongErrorTextUntouched(t *testing.T) {
	long := strings.Repeat("E", 100<<10)
	n, q := ifxNode(t, withWorkloadMaxBytes(wireframe.MaxWorkloadMaxBytes))
	line := testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", n.id, fieldOf("id", "job-long-error"), fieldOf("error", long)))
	n.m.handleLine([]byte(line))
	frames := ifxDrain(q)
	if len(frames) != 1 || string(frames[0].line) != line {
		t.Fatalf("the broker's frame with a %d-byte error: queued %s, want it byte for byte", len(long), ifxDescribe(frames))
	}
	if !ifxIsTracked(n, n.id, "job-long-error") {
		t.Fatal("the broker's frame with a long error is not tracked")
	}

	h := newNetPeerHarness(t, withWorkloadMaxBytes(wireframe.MaxWorkloadMaxBytes))
	body := testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", h.client.Principal, fieldOf("id", "job-long-error"), fieldOf("error", long)))
	if status, reason := netPostAnswer(t, h.c, h.addr, []byte(body)); status != http.StatusOK {
		t.Fatalf("a peer's frame with a %d-byte error: %d (%q), want 200", len(long), status, reason)
	}
	h.n.broker.WaitUpserts("job-long-error", 1)
	if e, _ := h.n.Upserts()[0]["error"].(string); e != long {
		t.Fatalf("the broker got a %d-byte error text, want the %d bytes sent", len(e), len(long))
	}
}

func TestLocalChannelDropsAFrameWithAFieldOverItsBoundWithARateLimitedWarning(t *testing.T) {
	n, q := ifxNode(t)
	const frames = 5
	for i := range frames {
		n.m.handleLine([]byte(testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", n.id, fieldOf("id", "job-"+itoa(i)), fieldOf("engine", strings.Repeat("a", 257))))))
	}
	n.m.handleLine([]byte(ifxStdioRemoveJSON(strings.Repeat("w", 257), n.id)))
	if got := ifxDrain(q); len(got) != 0 {
		t.Fatalf("frames over a bound were queued for the peers: %s", ifxDescribe(got))
	}
	if got := ifxTrackedCount(n); got != 0 {
		t.Fatalf("frames over a bound left %d entries in the re-sync set", got)
	}
	logs := n.logs.String()
	if c := strings.Count(logs, "a field over its bound"); c != 1 || !n.logs.Contains("level=WARN", overBound("workloadInfo.engine", 257)) {
		t.Fatalf("want one warning naming the field for %d such frames, got %d; logs:\n%s", frames+1, c, logs)
	}
	if got := n.m.fieldBoundRefusals.Get("stdio"); got != frames+1 {
		t.Fatalf("field bound refusals counted for the local channel: %d, want %d", got, frames+1)
	}
	// A frame within the bounds after them is taken as ever.
	n.m.handleLine([]byte(testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", n.id, fieldOf("engine", strings.Repeat("a", 256))))))
	if got := ifxDrain(q); len(got) != 1 {
		t.Fatalf("the frame at the bound: queued %s, want it", ifxDescribe(got))
	}
}

// ifxStdioRemoveJSON is a removal line from the broker.
func ifxStdioRemoveJSON(id, origin string) string {
	return `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"` + id + `","originatedFrom":"` + origin + `"}}`
}

// --- dedup memory -------------------------------------------------------------

// --- one encoding per id --------------------------------------------------------

// idTokens are workload ids as JSON string tokens written in ways a
// re-encoding would change: escapes json.Marshal would not write, and raw
// characters it would escape.
var idTokens = []struct{ name, token string }{
	{"escapes", `"a\u00e9\/b"`},
	{"HTML characters raw", `"x<y>&z"`},
	{"a tab escaped", `"tab\there"`},
	{"an emoji raw", `"job-😀"`},
	{"an emoji as a surrogate pair", `"pair-\ud83d\ude00"`},
	{"U+2028 raw", "\"line\u2028sep\""},
}

// escapeFirst writes s as a JSON string token whose first character is a
// \u escape: the same string, other bytes.
func escapeFirst(s string) string {
	return fmt.Sprintf(`"\u%04x%s"`, s[0], s[1:])
}

func TestPeerRemovalReachesTheBrokerInTheTokensItsUpsertCarried(t *testing.T) {
	h := newNetPeerHarness(t)
	origin := escapeFirst(h.client.Principal)
	for _, tc := range idTokens {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.n.broker.WithMethod(wireframe.MethodRemove))
			info := `{"id":` + tc.token + `,"model":"m","engine":"e","state":"running","originatedFrom":` + origin + `}`
			if status, reason := netPostAnswer(t, h.c, h.addr, []byte(testframe.LifecycleJSON(wireframe.MethodStarted, info))); status != http.StatusOK {
				t.Fatalf("upsert: %d (%q)", status, reason)
			}
			rm := `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":` + tc.token + `,"originatedFrom":` + origin + `}}`
			if status, reason := netPostAnswer(t, h.c, h.addr, []byte(rm)); status != http.StatusOK {
				t.Fatalf("removal: %d (%q)", status, reason)
			}
			removals := h.n.broker.WaitMethod(wireframe.MethodRemove, before+1)
			upserts := h.n.broker.WithMethod(wireframe.MethodUpsert)
			wantUpsert := `{"workloadInfo":` + info + `}`
			if got := string(upserts[len(upserts)-1].Params); got != wantUpsert {
				t.Fatalf("the broker's upsert params are %s, want %s", got, wantUpsert)
			}
			wantRemove := `{"originatedFrom":` + origin + `,"workloadId":` + tc.token + `}`
			if got := string(removals[before].Params); got != wantRemove {
				t.Fatalf("the broker's removal params are %s, want %s: the tokens of the upsert", got, wantRemove)
			}
		})
	}
}

func TestIngressRemovalReachesTheBrokerInTheTokenItsUpsertCarried(t *testing.T) {
	n, _ := ifxNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	addr := n.m.IngressAddr()
	for i, tc := range idTokens {
		t.Run(tc.name, func(t *testing.T) {
			up := `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":` + tc.token +
				`,"model":"m","engine":"e","state":"running"}}}`
			if status, reason := testkit.PostIngress(t, addr, up); status != http.StatusOK {
				t.Fatalf("upsert: %d (%q)", status, reason)
			}
			rm := `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":` + tc.token + `}}`
			if status, reason := testkit.PostIngress(t, addr, rm); status != http.StatusOK {
				t.Fatalf("removal: %d (%q)", status, reason)
			}
			removals := n.broker.WaitMethod(wireframe.MethodRemove, i+1)
			upserts := n.broker.WithMethod(wireframe.MethodUpsert)
			if got := string(ifxObjectAt(t, ifxObjectAt(t, upserts[i].Params, "workloadInfo"), "id")); got != tc.token {
				t.Fatalf("the broker's upsert names %s, want %s", got, tc.token)
			}
			if got := string(ifxObjectAt(t, removals[i].Params, "workloadId")); got != tc.token {
				t.Fatalf("the broker's removal names %s, want %s as its upsert did", got, tc.token)
			}
		})
	}
}

// For an id with nothing to escape, the common case, the removal's line is
// what json.Marshal of a map wrote before: byte for byte as ever.
func TestRemovalOfAPlainIdReachesTheBrokerByteForByteAsBefore(t *testing.T) {
	for _, ref := range []wireframe.WorkloadRef{{Origin: "3d0b8c4e-1f2a-4b6c-9d8e-7f6a5b4c3d2e", ID: "job-42"}, {Origin: "node-a", ID: "led-1789661457000-1"}} {
		params, err := json.Marshal(map[string]string{"workloadId": ref.ID, "originatedFrom": ref.Origin})
		if err != nil {
			t.Fatal(err)
		}
		r, err := wireframe.ParseRemove(json.RawMessage(`{ "workloadId" : "` + ref.ID + `", "originatedFrom": "` + ref.Origin + `", "reason":"x" }`))
		if err != nil {
			t.Fatal(err)
		}
		if got := string(r.BrokerParams()); got != string(params) {
			t.Fatalf("removal params %s, want %s as before", got, params)
		}
	}
}

// The peer port refuses a removal whose ids the broker could not decode
// unchanged, as the ingress does (workloadtypes_test.go): relayed, a lone
// surrogate would reach the broker as U+FFFD, a raw byte as text that is not
// UTF-8.
func TestPeerPortRefusesARemovalWhoseIdsAreNotWellFormed(t *testing.T) {
	h := newNetPeerHarness(t)
	const text = "must be valid UTF-8 with no lone surrogates"
	for _, tc := range []struct{ name, params, reason string }{
		{"workloadId a lone high surrogate", `{"workloadId":"job-\ud800","originatedFrom":"node-a"}`, "params.workloadId " + text},
		{"workloadId a lone low surrogate", `{"workloadId":"job-\udc00","originatedFrom":"node-a"}`, "params.workloadId " + text},
		{"originatedFrom a lone surrogate", `{"workloadId":"job-1","originatedFrom":"node-\udbff"}`, "params.originatedFrom " + text},
		{"workloadId a raw invalid byte", "{\"workloadId\":\"job-\xff\",\"originatedFrom\":\"node-a\"}", "frame is not valid UTF-8"},
		{"a variant spelling with a lone surrogate", `{"workloadId":"job-1","WorkloadId":"\ud800","originatedFrom":"node-a"}`, "params.workloadId " + text},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"jsonrpc":"2.0","method":"workloads:remove","params":` + tc.params + `}`
			if status, reason := netPostAnswer(t, h.c, h.addr, []byte(body)); status != http.StatusBadRequest || !strings.Contains(reason, tc.reason) {
				t.Fatalf("status %d (%q), want 400 naming %q", status, reason, tc.reason)
			}
		})
	}
	h.barrier(t)
	if rm := h.n.broker.WithMethod(wireframe.MethodRemove); len(rm) != 0 {
		t.Fatalf("a refused removal reached the broker: %v", rm)
	}
}
