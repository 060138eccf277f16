package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/peersend"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/wireframe"
)

// originDiscover sends h's node a discovery snapshot of entries
// (clusterUuid, hostUuid) and waits until its read loop has applied it.
func originDiscover(t *testing.T, h *netPeerHarness, pairs ...[2]string) {
	t.Helper()
	var nodes []map[string]any
	for _, p := range pairs {
		nodes = append(nodes, map[string]any{"clusterUuid": p[0], "hostUuid": p[1], "name": "n-" + p[1], "ip": "127.0.0.1"})
	}
	h.n.broker.sendFrame("discovery:nodes", map[string]any{"nodes": nodes})
	netBarrier(t, h.n)
}

func TestAPeerFrameNamingThisNodeAsItsOriginIsRefused403AndNothingReachesTheBroker(t *testing.T) {
	h := newNetPeerHarness(t)
	self := h.n.id
	cases := []struct {
		name string
		body []byte
	}{
		{"lifecycle frame", testframe.Lifecycle(testframe.Workload("mine", "running", self), nil)},
		{"re-assertion", testframe.Lifecycle(testframe.Workload("mine", "running", self), map[string]any{"resync": true})},
		{"removal", testframe.Removal("mine", self)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, text := netPostAnswer(t, h.c, h.addr, c.body)
			if st != http.StatusForbidden || !strings.HasPrefix(text, peerwire.OriginRefusalPrefix) || !strings.Contains(text, "is this node") {
				t.Fatalf("POST = %d %q, want 403 %q...", st, text, peerwire.OriginRefusalPrefix)
			}
		})
	}
	h.barrier(t)
	if got := netRelayed(h); len(got) != 0 {
		t.Fatalf("a frame in this node's name reached the broker: %v", got)
	}
	if got := h.n.m.peers.OriginRefusalsSelf(); got != uint64(len(cases)) {
		t.Fatalf("refusals counted = %d, want %d", got, len(cases))
	}
	// One warning for the three, not one each: a peer can send thousands.
	if n := strings.Count(h.n.logs.String(), "peer frames refused for their origin"); n != 1 {
		t.Fatalf("%d warnings for %d refusals in one interval, want 1; logs:\n%s", n, len(cases), h.n.logs)
	}
}

func TestOnceDiscoveryListsAPrincipalItMaySpeakOnlyForItsOwnNodes(t *testing.T) {
	h := newNetPeerHarness(t)
	p := h.client.Principal
	post := func(id, origin string) (int, string) {
		return netPostAnswer(t, h.c, h.addr, testframe.Lifecycle(testframe.Workload(id, "running", origin), nil))
	}
	remove := func(id, origin string) int {
		st, _ := netPostAnswer(t, h.c, h.addr, testframe.Removal(id, origin))
		return st
	}
	steps := []struct {
		name      string
		discovery [][2]string // nil: no snapshot sent at this step
		origin    string
		want      int
	}{
		{"before any snapshot, any other node", nil, "host-other", http.StatusOK},
		{"a snapshot that does not list the principal", [][2]string{{"someone-else", "host-x"}}, "host-other", http.StatusOK},
		{"listed: its own node", [][2]string{{p, "host-p"}, {"someone-else", "host-x"}}, "host-p", http.StatusOK},
		{"listed: another member", nil, "host-x", http.StatusForbidden},
		{"listed: a node discovery does not know", nil, "host-unknown", http.StatusForbidden},
		{"listed for two hosts: the first", [][2]string{{p, "host-p"}, {p, "host-p2"}}, "host-p", http.StatusOK},
		{"listed for two hosts: the second", nil, "host-p2", http.StatusOK},
		{"listed for two hosts: a third", nil, "host-x", http.StatusForbidden},
		{"no longer listed: accepted as before", [][2]string{{"someone-else", "host-x"}}, "host-x", http.StatusOK},
	}
	var wantRelayed []string
	for i, s := range steps {
		if s.discovery != nil {
			originDiscover(t, h, s.discovery...)
		}
		id := "w" + itoa(i)
		st, text := post(id, s.origin)
		if st != s.want {
			t.Fatalf("%s: POST naming %s = %d %q, want %d", s.name, s.origin, st, text, s.want)
		}
		if rst := remove(id, s.origin); rst != s.want {
			t.Fatalf("%s: removal naming %s = %d, want %d", s.name, s.origin, rst, s.want)
		}
		if st == http.StatusOK {
			wantRelayed = append(wantRelayed, "upsert:"+id, "remove:"+id)
			continue
		}
		if !strings.HasPrefix(text, peerwire.OriginRefusalPrefix) || !strings.Contains(text, p) {
			t.Fatalf("%s: reason %q, want it to start %q and name the principal", s.name, text, peerwire.OriginRefusalPrefix)
		}
	}
	h.barrier(t)
	if got := netRelayed(h); strings.Join(got, " ") != strings.Join(wantRelayed, " ") {
		t.Fatalf("relayed\n got %v\nwant %v", got, wantRelayed)
	}
	if got := h.n.m.peers.OriginRefusalsOther(); got != 6 {
		t.Fatalf("refusals (claim=other) counted = %d, want 6", got)
	}
}

func TestABatchElementRefusedForItsOriginGetsItsOwn403AndTheRestAreAppliedInOrder(t *testing.T) {
	h := newNetPeerHarness(t)
	p := h.client.Principal
	originDiscover(t, h, [2]string{p, p})
	ok := func(id string) []byte { return testframe.Lifecycle(testframe.Workload(id, "running", p), nil) }
	a := netPostBatch(t, h.c, h.addr,
		ok("b1"),
		testframe.Lifecycle(testframe.Workload("mine", "running", h.n.id), nil),
		ok("b2"),
		testframe.Removal("theirs", "host-other"),
		ok("b3"),
	)
	if a.status != http.StatusOK || len(a.results) != 5 {
		t.Fatalf("batch = %d %q, want 200 with 5 results", a.status, a.text)
	}
	for i, want := range []int{200, 403, 200, 403, 200} {
		r := a.results[i]
		if r.Status != want || (want == 403) != peerwire.IsOriginRefusal(r.Status, r.Reason) {
			t.Fatalf("element %d: %+v, want %d", i, r, want)
		}
	}
	h.barrier(t)
	if got := netRelayed(h); strings.Join(got, " ") != "upsert:b1 upsert:b2 upsert:b3" {
		t.Fatalf("relayed: %v", got)
	}
	if strings.Contains(h.n.logs.String(), "peer batch elements rejected") {
		t.Fatalf("refusals for origin, logged rate-limited already, made the batch a warning too; logs:\n%s", h.n.logs)
	}
}

func TestAFreshFrameRefusedForItsOriginIsGivenUpWithoutRetries(t *testing.T) {
	for _, batching := range []bool{false, true} {
		t.Run(map[bool]string{false: "single-frame peer", true: "batching peer"}[batching], func(t *testing.T) {
			n := newTestNode(t, withResyncInterval(time.Hour))
			n.start()
			sink := testkit.NewHBSink(t, batching, 0)
			sink.RefuseOrigin = "spoofed"
			joinSink(t, sink, n)
			n.sendLifecycle(testframe.Workload("warm-up", "running", n.id)) // the sender learns the advertisement
			testkit.Eventually(t, "the warm-up at the peer", func() bool { return sink.Count("fresh", "warm-up") == 1 })
			n.sendLifecycle(testframe.Workload("spoofed", "running", n.id))
			n.sendLifecycle(testframe.Workload("after", "running", n.id))
			testkit.Eventually(t, "the frame after it at the peer", func() bool { return sink.Count("fresh", "after") == 1 })
			testkit.Eventually(t, "the refused frame given up", func() bool { return peerStatsOf(n, sink).Dropped.Load() == 1 })
			if got := sink.OriginRefusals("fresh"); got != 1 {
				t.Fatalf("the peer was sent the refused frame %d times, want once: a refusal for origin is final", got)
			}
		})
	}
}

func TestAHeartbeatPassGoesOnPastAnEntryRefusedForItsOrigin(t *testing.T) {
	waitsOutRealTime(t, "several heartbeat passes")
	for _, batching := range []bool{false, true} {
		t.Run(map[bool]string{false: "single-frame peer", true: "batching peer"}[batching], func(t *testing.T) {
			// One pass within the check below: the next is 2 s after it.
			n := newTestNode(t, withResyncInterval(2*time.Second))
			n.start()
			sink := testkit.NewHBSink(t, batching, 0)
			sink.RefuseOrigin = "hb-00001"
			// More entries than one request to a batching peer carries, so
			// the refused entry is not in the pass's last request.
			ids := trackRunning(t, n, 3*peersend.HeartbeatSlice)
			last := ids[len(ids)-1]
			joinSink(t, sink, n)
			testkit.Eventually(t, "the last entry re-asserted", func() bool { return sink.Count("resync", last) == 1 })
			if got := peerStatsOf(n, sink).PassesAbandoned.Load(); got != 0 {
				t.Fatalf("%d passes abandoned at an entry refused for its origin, want 0", got)
			}
			if got, refused := sink.Count("resync", ""), sink.OriginRefusals("resync"); got != len(ids)-1 || refused != 1 {
				t.Fatalf("%d re-assertions, %d refused; want every other entry once and the refused one tried once", got, refused)
			}
		})
	}
}

// peerStatsOf is n's sender statistics for sink.
func peerStatsOf(n *testNode, sink *testkit.HBSink) *peersend.Stats {
	for _, st := range n.m.bcast.StatsSnapshot() {
		if st.Peer == sink.Ident.Principal {
			return st
		}
	}
	return &peersend.Stats{}
}

// The origin rule and the two origins that name no other node (spec 3.3):
// the principal itself, which a stock peer stamps while its directory entry
// still shows the node id its scanner minted on a fresh host, and none at
// all, an older sender's removal, deduplicated on ("", id) and written to
// the broker as it came. Any other node is still refused.
func TestAPrincipalMayNameItselfAndARemovalMayNameNoOriginWhateverDiscoverySays(t *testing.T) {
	h := newNetPeerHarness(t)
	p := h.client.Principal
	post := func(body string) (int, string) { return netPostAnswer(t, h.c, h.addr, []byte(body)) }
	originLess := func(id string) string {
		return `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"` + id + `"}}`
	}
	// Before any snapshot, and then in the fresh host's window: discovery
	// lists the principal for the id its scanner minted.
	for i, snapshot := range [][][2]string{nil, {{p, "host-minted"}}} {
		if snapshot != nil {
			originDiscover(t, h, snapshot...)
		}
		id := "fresh-" + itoa(i)
		for _, body := range []string{
			string(testframe.Lifecycle(testframe.Workload(id, "running", p), nil)),
			string(testframe.Lifecycle(testframe.Workload(id, "running", p), map[string]any{"resync": true})),
			string(testframe.Removal(id, p)),
			originLess(id),
			originLess(id), // the same removal again: already seen
		} {
			if st, text := post(body); st != http.StatusOK {
				t.Fatalf("snapshot %v: %s = %d %q, want 200", snapshot, body, st, text)
			}
		}
	}
	// The rule still holds for every node the principal is not.
	if st, text := post(string(testframe.Lifecycle(testframe.Workload("x", "running", "host-x"), nil))); !peerwire.IsOriginRefusal(st, text) {
		t.Fatalf("a frame naming another node = %d %q, want 403 for origin", st, text)
	}
	if st, text := post(string(testframe.Removal("x", h.n.id))); !peerwire.IsOriginRefusal(st, text) {
		t.Fatalf("a removal naming this node = %d %q, want 403 for origin", st, text)
	}
	h.barrier(t)
	var removals []string
	for _, f := range h.n.broker.WithMethod(wireframe.MethodRemove) {
		removals = append(removals, string(f.Params))
	}
	want := []string{
		`{"originatedFrom":"` + p + `","workloadId":"fresh-0"}`, `{"workloadId":"fresh-0"}`,
		`{"originatedFrom":"` + p + `","workloadId":"fresh-1"}`, `{"workloadId":"fresh-1"}`,
	}
	if strings.Join(removals, " ") != strings.Join(want, " ") {
		t.Fatalf("removals at the broker\n got %v\nwant %v", removals, want)
	}
	if got := netUpsertIDs(h.n); got["fresh-0"] != 2 || got["fresh-1"] != 2 {
		t.Fatalf("upserts %v, want the frame and its re-assertion of each", got)
	}
}
