package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// No head-of-line block (issue 37, spec 5.1): a frame a peer keeps failing
// while it takes the others is tried a bounded number of times and then
// skipped for that peer, and what is still live reaches it with the next
// heartbeat; a peer that fails everything keeps its mark and is backed off
// as before. The peer is a stand-in (testkit.HBSink) that answers as the
// peer port does: a frame whose broker write failed 500 "broker
// unavailable", and in a batch the elements after it 503, not attempted.

// boundedTriesWithin is how soon the frame behind one the peer keeps
// failing must reach it: the frame's FrameMaxTries tries take 0.75 s of
// backoff; the rest is room for a machine with both cores busy. Before,
// it never did (0 deliveries in 20 s).
const boundedTriesWithin = 5 * time.Second

// sinkNode starts a daemon with extra flags whose one broadcast target is
// sink, pinned, and returns it once it has taken the target.
func sinkNode(t *testing.T, sink *testkit.HBSink, extra ...string) *daemonProc {
	t.Helper()
	nodes := writeCluster(t, 1)
	testkit.Must(t, devpki.PinIdentity(nodes[0].ClusterDir, sink.Ident))
	d := startNode(t, nodes[0], append([]string{"--metrics", "127.0.0.1:0"}, extra...)...)
	d.WaitMethod("discovery:subscribe", 1)
	snapshot, err := json.Marshal(map[string]any{"nodes": []map[string]any{testkit.AddrEntry(sink.ID, sink.Ident.Principal, sink.Addr)}})
	testkit.Must(t, err)
	d.send(string(wireframe.EncodeNotification("discovery:nodes", snapshot)))
	d.waitLog("broadcast targets changed", "total=1")
	return d
}

// sinkMetric is the daemon's series name for its peer sink.
func sinkMetric(t *testing.T, d *daemonProc, sink *testkit.HBSink, name string) float64 {
	t.Helper()
	return testkit.ScrapeValue(t, d.loggedValue("metrics endpoint listening", "addr"), name+`{peer="`+sink.Ident.Principal+`"}`)
}

// running sends the daemon its broker's running frame of id.
func running(d *daemonProc, id string) {
	d.send(string(testframe.Lifecycle(testframe.Workload(id, "running", d.readyNodeID()), nil)))
}

func TestProcessAFrameAPeerKeepsFailingDoesNotHoldBackWhatFollows(t *testing.T) {
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			sink := testkit.NewHBSink(t, batching, 0)
			d := sinkNode(t, sink, "--resync-interval", "2s")
			sink.SetFailing("poison", true)
			start := time.Now()
			running(d, "poison")
			next := ids("next", 5)
			for _, id := range next {
				running(d, id)
			}
			if !testkit.HoldsWithin(boundedTriesWithin, func() bool { return len(sink.FreshIDs()) == len(next) }) {
				t.Fatalf("%v after a frame the peer fails, it took %v of the %d frames behind it", boundedTriesWithin, sink.FreshIDs(), len(next))
			}
			t.Logf("the frames behind the failed one reached the peer %v after it was sent", time.Since(start).Round(time.Millisecond))
			if got := sink.FreshIDs(); !slices.Equal(got, next) {
				t.Fatalf("the peer took %v, want %v once each, in order", got, next)
			}
			if got := sink.Failed(); got < 3 {
				t.Fatalf("the failed frame was tried %d times, want its 3", got)
			}
			if got := sinkMetric(t, d, sink, "nvpair_wlm_peer_deliveries_skipped_total"); got != 1 {
				t.Fatalf("nvpair_wlm_peer_deliveries_skipped_total = %v, want 1", got)
			}
			d.waitLog("peer kept failing an entry while it took others")
			// The heartbeat goes on past the run the peer fails: the runs
			// after it in pass order are re-asserted.
			last := next[len(next)-1]
			testkit.Eventually(t, "a pass past the failing run", func() bool { return sink.Count("resync", last) >= 1 })
			// Once the peer takes it, the next heartbeat re-asserts it.
			sink.SetFailing("poison", false)
			testkit.Eventually(t, "the skipped run re-asserted", func() bool { return sink.FinalState("poison") == "running" })
			if got := strings.Count(d.stderr.String(), "peer kept failing an entry"); got != 1 {
				t.Fatalf("%d lines for one skipped entry, want 1", got)
			}
			if got := sinkMetric(t, d, sink, "nvpair_wlm_heartbeat_passes_abandoned_total"); got != 0 {
				t.Fatalf("%v heartbeat passes abandoned at the one failing run, want 0", got)
			}
		})
	}
}

// A frame the peer keeps failing with nothing behind it: the heartbeat is
// not held back by it, and the peer's taking a re-assertion shows the
// frame is at fault, which is then skipped.
func TestProcessAFrameAPeerKeepsFailingAloneDoesNotHoldBackTheHeartbeat(t *testing.T) {
	sink := testkit.NewHBSink(t, false, 0)
	d := sinkNode(t, sink, "--resync-interval", "1s")
	before := ids("before", 3)
	for _, id := range before {
		running(d, id)
	}
	testkit.Eventually(t, "the first runs at the peer", func() bool { return len(sink.FreshIDs()) == len(before) })
	sink.SetFailing("alone", true)
	running(d, "alone")
	testkit.Eventually(t, "the lone frame skipped", func() bool {
		return sinkMetric(t, d, sink, "nvpair_wlm_peer_deliveries_skipped_total") == 1
	})
	n := sink.Count("resync", before[0])
	testkit.Eventually(t, "the heartbeat still going", func() bool { return sink.Count("resync", before[0]) > n })
	sink.SetFailing("alone", false)
	testkit.Eventually(t, "the skipped run re-asserted", func() bool { return sink.FinalState("alone") == "running" })
}

// A peer that fails every frame (its broker gone) is no frame's fault:
// nothing is skipped, its mark stays, and once it takes frames again it
// gets every one, once, in order.
func TestProcessAPeerThatFailsEverythingKeepsItsMarkAndGetsEveryFrameInOrder(t *testing.T) {
	sink := testkit.NewHBSink(t, false, 0)
	d := sinkNode(t, sink, "--resync-interval", "1h")
	sink.SetFailAll(true)
	want := ids("held", 5)
	for _, id := range want {
		running(d, id)
	}
	// Well past the failed frame's tries: the first frame and a probe of
	// the next, again and again. The peer recovers during a backoff (the
	// count still for a while), so the next request is the first frame's:
	// a recovery between it and the probe behind it would look like a
	// peer that fails one frame.
	count, since := 0, time.Now()
	if !testkit.HoldsWithin(testkit.WaitTimeout, func() bool {
		if n := sink.Failed(); n != count {
			count, since = n, time.Now()
		}
		return count >= 6 && time.Since(since) > 200*time.Millisecond
	}) {
		t.Fatalf("the peer was tried %d times", sink.Failed())
	}
	if got := sinkMetric(t, d, sink, "nvpair_wlm_peer_deliveries_skipped_total"); got != 0 {
		t.Fatalf("nvpair_wlm_peer_deliveries_skipped_total = %v for a peer that fails everything, want 0", got)
	}
	sink.SetFailAll(false)
	// The backoff after 6 failed attempts is at most 8 s.
	if !testkit.HoldsWithin(testkit.WaitTimeout+8*time.Second, func() bool { return len(sink.FreshIDs()) >= len(want) }) {
		t.Fatalf("the peer took %v once it took frames again, want all of %v", sink.FreshIDs(), want)
	}
	if got := sink.FreshIDs(); !slices.Equal(got, want) {
		t.Fatalf("the peer took %v, want %v once each, in order", got, want)
	}
	if got := sinkMetric(t, d, sink, "nvpair_wlm_peer_deliveries_skipped_total"); got != 0 {
		t.Fatalf("nvpair_wlm_peer_deliveries_skipped_total = %v, want 0", got)
	}
}

// A batch the peer fails as a whole names none of its frames: the sender
// halves it until the frame that fails goes alone, and skips that one
// only, never a frame the peer would take that happened to lead the batch.
func TestProcessABatchAPeerFailsWholeIsSplitToFindTheFrameThatFails(t *testing.T) {
	sink := testkit.NewHBSink(t, true, 0)
	d := sinkNode(t, sink, "--resync-interval", "1h")
	// The first request learns the peer's batch advertisement; the rest
	// wait behind it, so the next request is one batch of them all.
	sink.HoldAll()
	running(d, "warm")
	testkit.Eventually(t, "the first request at the peer", func() bool { return sink.Requests() >= 1 })
	sink.SetFailBatchHolding("poison")
	sink.SetFailing("poison", true)
	want := ids("before", 5)
	for _, id := range want {
		running(d, id)
	}
	running(d, "poison")
	after := ids("after", 4)
	for _, id := range after {
		running(d, id)
	}
	want = append(append([]string{"warm"}, want...), after...)
	sink.Release()
	if !testkit.HoldsWithin(boundedTriesWithin, func() bool { return len(sink.FreshIDs()) >= len(want) }) {
		t.Fatalf("the peer took %v, want %v", sink.FreshIDs(), want)
	}
	if got := sink.FreshIDs(); !slices.Equal(got, want) {
		t.Fatalf("the peer took %v, want %v once each, in order: every frame but the one it fails", got, want)
	}
	if got := sinkMetric(t, d, sink, "nvpair_wlm_peer_deliveries_skipped_total"); got != 1 {
		t.Fatalf("nvpair_wlm_peer_deliveries_skipped_total = %v, want 1", got)
	}
	if batches, _ := sink.BatchCounts(); batches == 0 {
		t.Fatal("the peer was never sent a batch it took")
	}
}
