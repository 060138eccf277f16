package e2e

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
)

// A peer answering 503 with Retry-After: 2 (its broker stalled, its body
// budget full): the real daemon sends it at most one request per 2 s, on
// any lane, and once it answers 200 every frame arrives, once, in order.
// Before, it was retried about four times a second and each frame was
// dropped after its three attempts.
func TestProcessPeerAnswering503RetryAfterIsSentOneRequestPerWaitThenEveryFrameInOrder(t *testing.T) {
	nodes := writeCluster(t, 2)
	// The stand-in presents the second node's identity, which the first
	// pins, on a port of its own.
	peer := testkit.NewDeferringPeer(t, nodes[1].Identity, false, 0, "")
	a := startNode(t, nodes[0], "--metrics", "127.0.0.1:0")
	a.WaitMethod("discovery:subscribe", 1)
	port, _ := strconv.Atoi(portOf(t, peer.Addr))
	a.discover(nodes[1], port)
	a.waitLog("broadcast targets changed", "total=1")
	metrics := a.loggedValue("metrics endpoint listening", "addr")

	peer.SetDefer(3, "2")
	want := ids("deferred", 20)
	for _, id := range want {
		a.send(testframe.LifecycleLine(id, "running", nodes[0].ID))
	}
	// The wait for them is the tests' usual, plus the 6 s the peer asks for.
	if !testkit.HoldsWithin(testkit.WaitTimeout+6*time.Second, func() bool { return len(peer.Accepted()) >= len(want) }) {
		t.Fatalf("the peer took %d of %d frames", len(peer.Accepted()), len(want))
	}
	if got := peer.Accepted(); !slices.Equal(got, want) {
		t.Fatalf("the peer took %v, want %v once each, in order", got, want)
	}
	if n := peer.CheckWaitsHonoured(t, 2*time.Second); n != 3 {
		t.Fatalf("%d requests answered 503, want 3", n)
	}
	reqs := peer.Log()
	t.Logf("%d requests, the first 200 %v after the first 503", len(reqs), reqs[3].At.Sub(reqs[0].At).Round(time.Millisecond))
	series := `{peer="` + nodes[1].ID + `"}`
	if got := testkit.ScrapeValue(t, metrics, "nvpair_wlm_peer_retry_after_waits_total"+series); got != 3 {
		t.Fatalf("nvpair_wlm_peer_retry_after_waits_total = %v, want 3", got)
	}
	if got := testkit.ScrapeValue(t, metrics, "nvpair_wlm_peer_deliveries_dropped_total"+series); got != 0 {
		t.Fatalf("nvpair_wlm_peer_deliveries_dropped_total = %v, want 0", got)
	}
	a.waitLog("peer asked to wait (Retry-After)", "wait=2s")
}
