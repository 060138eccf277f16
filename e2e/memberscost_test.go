package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// TestStateTableABrokerFrameCostsTheJournalNoRecordPerMember: A relays
// broker frames to 5 members, each frame taken by every member before the
// next. A broker-owned live run is not journaled, and a member's
// acknowledgment writes no record of its own (spec 5.1, 5.4): the marks
// that moved go together in one record per prune tick (a second). So A's
// journal takes at most one record per second of the run, however many
// members took however many frames; each acknowledgment written alone
// would be 5 a frame.
func TestStateTableABrokerFrameCostsTheJournalNoRecordPerMember(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	const members, frames = 5, 30
	nodes := writeCluster(t, members+1)
	a := startNode(t, nodes[0], "--metrics", "127.0.0.1:0")
	a.WaitMethod("discovery:subscribe", 1)
	var listed []map[string]any
	for _, n := range nodes[1:] {
		p := startNode(t, n)
		listed = append(listed, map[string]any{
			"hostUuid": n.ID, "name": "node-" + n.ID[:8], "ip": "127.0.0.1", "clusterUuid": n.ID, "trusted": true,
			"services": map[string]any{"wl": map[string]any{"port": p.port}},
		})
	}
	snap, err := json.Marshal(map[string]any{"nodes": listed})
	if err != nil {
		t.Fatal(err)
	}
	a.send(string(wireframe.EncodeNotification("discovery:nodes", snap)))
	a.waitLog("broadcast targets changed", fmt.Sprintf("total=%d", members))
	metrics := a.loggedValue("metrics endpoint listening", "addr")
	taken := func() (n float64) {
		for series, v := range testkit.ScrapeAddr(t, metrics) {
			if strings.HasPrefix(series, "nvpair_wlm_peer_deliveries_succeeded_total{") {
				n += v
			}
		}
		return n
	}
	records0 := testkit.ScrapeValue(t, metrics, "nvpair_wlm_journal_records_total")
	start := time.Now()
	for i := range frames {
		a.send(testframe.LifecycleLine(fmt.Sprintf("cost-%d", i), "running", nodes[0].ID))
		testkit.Eventually(t, fmt.Sprintf("frame %d taken by every member", i), func() bool { return taken() >= float64((i+1)*members) })
	}
	// The marks are written, together, at the next tick.
	testkit.Eventually(t, "the members' marks written", func() bool {
		return testkit.ScrapeValue(t, metrics, "nvpair_wlm_member_marks_written_total") >= members
	})
	elapsed := time.Since(start)
	records := testkit.ScrapeValue(t, metrics, "nvpair_wlm_journal_records_total") - records0
	ticks := elapsed.Seconds() + 2
	if records < 1 || records > ticks || records >= frames*members {
		t.Fatalf("%d broker frames taken by %d members in %v wrote %.0f journal records, want the marks' own, at most one per prune tick (%.0f)", frames, members, elapsed.Round(time.Millisecond), records, ticks)
	}
	t.Logf("%d broker frames x %d members in %v: %.0f journal records (%.2f per frame)", frames, members, elapsed.Round(time.Millisecond), records, records/frames)
}
