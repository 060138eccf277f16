package e2e

import (
	"bytes"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// Adversarial tests against the real binary: a pinned peer that sends
// frames whose every key field is as long as the bounds allow, and one byte
// longer. Before the bounds, 1,500 frames each with a distinct 900 KB engine
// grew the receiving daemon from 15 MB to 2.09 GB; now a field over its
// bound is refused, and the dedup holds a fixed-size digest per key.

// advFrames is how many maximum-length frames the pinned peer sends.
const advFrames = 2000

// advBatch is how many of them go in one batch: 200 frames of some 2.3 KB
// are well within a batch's 256 frames and 1 MiB.
const advBatch = 200

func TestAdversarialMaximumLengthFieldsThroughAPinnedPeerKeepTheDedupWithinItsByteBound(t *testing.T) {
	nodes := writeCluster(t, 2)
	peer, receiver := nodes[0], nodes[1]
	d := startNode(t, receiver, "--metrics", "127.0.0.1:0")
	d.WaitMethod("discovery:subscribe", 1) // listening
	metrics := d.loggedValue("metrics endpoint listening", "addr")
	c := testkit.PeerClient(t, &peer.Identity, receiver.Identity.DER)
	addr := "127.0.0.1:" + itoa(d.port)
	rssBefore := advRSS(d)

	for start := 0; start < advFrames; start += advBatch {
		elems := make([][]byte, 0, advBatch)
		for i := start; i < start+advBatch; i++ {
			elems = append(elems, []byte(testframe.MaxLengthFrame(i, peer.ID)))
		}
		ans := netPostBatch(t, c, addr, elems...)
		if ans.status != http.StatusOK || len(ans.results) != len(elems) {
			t.Fatalf("batch at %d: %d %q", start, ans.status, ans.text)
		}
		for i, r := range ans.results {
			if r.Status != http.StatusOK {
				t.Fatalf("frame %d: %d %q, want 200", start+i, r.Status, r.Reason)
			}
		}
	}
	d.WaitMethod(wireframe.MethodUpsert, advFrames)
	m := testkit.ScrapeAddr(t, metrics)
	keys, size := m["nvpair_wlm_dedup_keys"], m["nvpair_wlm_dedup_bytes"]
	if keys != advFrames || size != advFrames*dedupEntryBytes || size > dedupMaxBytes {
		t.Fatalf("after %d maximum-length frames the dedup reports %v keys and %v bytes; want %d keys, %d bytes, within its bound of %d",
			advFrames, keys, size, advFrames, advFrames*dedupEntryBytes, dedupMaxBytes)
	}
	t.Logf("%d frames of maximum-length fields: dedup %v keys, %v bytes (bound %d); receiver RSS %d -> %d KiB",
		advFrames, keys, size, dedupMaxBytes, rssBefore, advRSS(d))

	// One byte over, in any bounded field: 400 naming the field and its
	// bound, and nothing reaches the broker or the dedup.
	for _, f := range boundedWorkloadFields {
		members := []string{fieldOf("id", "over-"+f), fieldOf(f, strings.Repeat("a", wireframe.MaxKeyFieldBytes+1))}
		status, reason := netPostAnswer(t, c, addr, []byte(testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", peer.ID, members...))))
		if want := overBound("workloadInfo."+f, wireframe.MaxKeyFieldBytes+1); status != http.StatusBadRequest || reason != want {
			t.Errorf("%s one byte over: %d %q, want 400 %q", f, status, reason, want)
		}
	}
	for _, tc := range []struct{ body, field string }{
		{string(testframe.Removal(strings.Repeat("w", wireframe.MaxKeyFieldBytes+1), peer.ID)), "params.workloadId"},
		{string(testframe.Removal("job-1", strings.Repeat("o", wireframe.MaxKeyFieldBytes+1))), "params.originatedFrom"},
	} {
		status, reason := netPostAnswer(t, c, addr, []byte(tc.body))
		if want := overBound(tc.field, wireframe.MaxKeyFieldBytes+1); status != http.StatusBadRequest || reason != want {
			t.Errorf("removal with %s one byte over: %d %q, want 400 %q", tc.field, status, reason, want)
		}
	}
	m = testkit.ScrapeAddr(t, metrics)
	if got, want := m[`nvpair_wlm_field_bound_refusals_total{source="peer"}`], float64(len(boundedWorkloadFields)+2); got != want {
		t.Errorf("field bound refusals counted: %v, want %v", got, want)
	}
	if m["nvpair_wlm_dedup_keys"] != advFrames {
		t.Errorf("the dedup holds %v keys after the refusals, want %d", m["nvpair_wlm_dedup_keys"], advFrames)
	}

	// Legitimate traffic still flows: a frame at the bounds, with escapes in
	// its id, reaches the broker byte for byte, and its removal names the
	// workload in the same bytes.
	id, origin := `"a\u00e9\/b"`, `"`+peer.ID+`"`
	info := `{"id":` + id + `,"model":"m","engine":"` + strings.Repeat("e", wireframe.MaxKeyFieldBytes) + `","state":"running","originatedFrom":` + origin + `,"custom":{"k":[1,2.50]}}`
	if status, reason := netPostAnswer(t, c, addr, []byte(testframe.LifecycleJSON(wireframe.MethodStarted, info))); status != http.StatusOK {
		t.Fatalf("a frame at the bounds: %d %q", status, reason)
	}
	rm := `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":` + id + `,"originatedFrom":` + origin + `}}`
	if status, reason := netPostAnswer(t, c, addr, []byte(rm)); status != http.StatusOK {
		t.Fatalf("its removal: %d %q", status, reason)
	}
	removals := d.WaitMethod(wireframe.MethodRemove, 1)
	upserts := d.WithMethod(wireframe.MethodUpsert)
	if got, want := string(upserts[len(upserts)-1].Params), `{"workloadInfo":`+info+`}`; got != want {
		t.Fatalf("the broker's upsert params are\n%s\nwant\n%s", got, want)
	}
	if got, want := string(removals[0].Params), `{"originatedFrom":`+origin+`,"workloadId":`+id+`}`; got != want {
		t.Fatalf("the broker's removal params are %s, want %s", got, want)
	}
	if d.exitedYet() {
		t.Fatal("the daemon exited")
	}
}

// advRSS is the daemon's resident set in KiB, from /proc; 0 where there is
// no /proc (it is only logged).
func advRSS(d *daemonProc) int {
	b, err := os.ReadFile("/proc/" + itoa(d.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(string(rest)), " kB"))
			return n
		}
	}
	return 0
}

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
