package main

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/peersend"
)

// joinSink pins the sink in n and makes it n's broadcast target.
func joinSink(t *testing.T, s *testkit.HBSink, n *testNode) {
	t.Helper()
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, s.Ident))
	n.m.trust.Reload()
	netDiscover(n, testkit.AddrEntry(s.ID, s.Ident.Principal, s.Addr))
	n.waitTargets(1)
}

// trackRunning enters count running workloads hb-<i> through n's broker,
// in that order, and waits until the read loop has taken them all.
func trackRunning(t *testing.T, n *testNode, count int) []string {
	t.Helper()
	ids := make([]string, count)
	for i := range ids {
		ids[i] = fmt.Sprintf("hb-%05d", i)
		n.sendLifecycle(testframe.Workload(ids[i], "running", n.id))
	}
	netBarrier(t, n)
	return ids
}

// passesCompleted is how many heartbeat passes n's sender to sink finished.
func passesCompleted(n *testNode, sink *testkit.HBSink) uint64 {
	for _, st := range n.m.bcast.StatsSnapshot() {
		if st.Peer == sink.Ident.Principal {
			return st.PassesCompleted.Load()
		}
	}
	return 0
}

func TestHeartbeatNeverReassertsAWorkloadAfterItsRemovalWasSent(t *testing.T) {
	waitsOutRealTime(t, "heartbeat passes")
	// A slow single-frame peer keeps a pass in flight for seconds while
	// every workload is removed, in pass order: one of the removals hits
	// the entry the pass is about to visit.
	n := newTestNode(t, withResyncInterval(100*time.Millisecond))
	n.start()
	sink := testkit.NewHBSink(t, false, time.Millisecond)
	const live = 800 // under the queues' 1024: no removal may be dropped
	ids := trackRunning(t, n, live)
	joinSink(t, sink, n)
	testkit.Eventually(t, "a pass in flight", func() bool { return sink.Count("resync", "") > 20 })
	for _, id := range ids {
		n.sendRemove(id)
	}
	testkit.Eventually(t, "every removal at the peer", func() bool { return sink.Count("remove", "") == live })
	after := passesCompleted(n, sink)
	testkit.Eventually(t, "a whole pass after the removals", func() bool { return passesCompleted(n, sink) >= after+2 })

	requireNoReassertionAfterRemoval(t, sink.Snapshot())
}

func TestHeartbeatPassCarriesOnPastItsIntervalAndReachesEveryWorkload(t *testing.T) {
	// Many live workloads, and a peer slow enough that one pass takes
	// several intervals: every workload is still re-asserted, and fresh
	// frames sent meanwhile all arrive, once each.
	n := newTestNode(t, withResyncInterval(50*time.Millisecond))
	n.start()
	sink := testkit.NewHBSink(t, false, 0)
	live := 2500
	ids := trackRunning(t, n, live)
	joinSink(t, sink, n)
	var fresh []string
	for i := range 200 {
		id := fmt.Sprintf("fresh-%03d", i)
		fresh = append(fresh, id)
		n.sendLifecycle(testframe.Workload(id, "running", n.id))
	}
	// The fresh frames follow the new peer's backfill of every workload
	// (one catch-up, in version order): a minute for both on a loaded
	// machine under the race detector.
	if !testkit.HoldsWithin(time.Minute, func() bool { return sink.Count("fresh", "") == live+len(fresh) }) {
		t.Fatalf("timed out waiting for every fresh frame at the peer: %d of %d", sink.Count("fresh", ""), live+len(fresh))
	}
	// Reaching every workload is the property, not how fast: a pass over
	// some 2,500 workloads to a peer on a loaded machine under the race
	// detector can outlast the usual wait, so this one waits a minute.
	reachedAll := testkit.HoldsWithin(time.Minute, func() bool {
		seen := map[string]bool{}
		for _, e := range sink.Snapshot() {
			if e.Kind == "resync" {
				seen[e.ID] = true
			}
		}
		for _, id := range ids {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	if !reachedAll {
		t.Fatal("timed out waiting for every live workload re-asserted")
	}
	for _, id := range fresh {
		if c := sink.Count("fresh", id); c != 1 {
			t.Fatalf("fresh frame %s arrived %d times, want once", id, c)
		}
	}
}

func TestMixedClusterBatchingAndSingleFramePeersReceiveEveryFrameInOrder(t *testing.T) {
	n := newTestNode(t)
	n.start()
	batching, single := testkit.NewHBSink(t, true, time.Millisecond), testkit.NewHBSink(t, false, time.Millisecond)
	for _, s := range []*testkit.HBSink{batching, single} {
		testkit.Must(t, devpki.PinIdentity(n.clusterDir, s.Ident))
	}
	n.m.trust.Reload()
	netDiscover(n, testkit.AddrEntry(batching.ID, batching.Ident.Principal, batching.Addr), testkit.AddrEntry(single.ID, single.Ident.Principal, single.Addr))
	n.waitTargets(2)
	// The first answer carries the advertisement; what queues behind the
	// frame in flight then goes in batches to the peer that takes them.
	var want []string
	for i := range 600 {
		id := fmt.Sprintf("mix-%03d", i)
		want = append(want, id)
		n.sendLifecycle(testframe.Workload(id, "running", n.id))
	}
	for _, s := range []*testkit.HBSink{batching, single} {
		testkit.Eventually(t, "every frame at each peer", func() bool { return s.Count("fresh", "") >= len(want) })
		if got := s.FreshIDs(); !slices.Equal(got, want) {
			t.Fatalf("a peer received the frames out of order or more than once (batching %v)", s.Batching)
		}
	}
	if b, _ := batching.BatchCounts(); b == 0 {
		t.Fatal("the peer that advertised batches was never sent one")
	}
	if b, refused := single.BatchCounts(); b != 0 || refused != 0 {
		t.Fatalf("the single-frame peer was sent %d batches", b+refused)
	}
}

func TestBatchElementThatFailsIsRetriedInOrderWithWhatFollowedIt(t *testing.T) {
	n := newTestNode(t)
	n.start()
	sink := testkit.NewHBSink(t, true, 2*time.Millisecond)
	sink.FailOnce["retry-010"] = true
	joinSink(t, sink, n)
	var want []string
	for i := range 40 {
		id := fmt.Sprintf("retry-%03d", i)
		want = append(want, id)
		n.sendLifecycle(testframe.Workload(id, "running", n.id))
	}
	testkit.Eventually(t, "every frame at the peer", func() bool { return sink.Count("fresh", "") >= len(want) })
	if got := sink.FreshIDs(); !slices.Equal(got, want) {
		t.Fatalf("after a failed element the peer holds %v, want every frame once, in order", got)
	}
}

func TestFreshFrameOvertakesAHeartbeatPassInFlight(t *testing.T) {
	waitsOutRealTime(t, "a heartbeat pass")
	// A pass slow enough to be caught in the middle: a fresh frame sent
	// then waits for the one re-assertion in flight, not for the rest of
	// the pass (the sender catches its peer up before every slice).
	n := newTestNode(t, withResyncInterval(3*time.Second))
	n.start()
	sink := testkit.NewHBSink(t, false, 2*time.Millisecond)
	const live = 1000 // a pass paced over 2.4 s: ample time for the fresh frame to overtake it
	trackRunning(t, n, live)
	joinSink(t, sink, n)
	testkit.Eventually(t, "the backfill at the peer", func() bool { return sink.Count("fresh", "") >= live })
	if !testkit.HoldsWithin(time.Minute, func() bool { return sink.Count("resync", "") >= 20 }) {
		t.Fatal("timed out waiting for a pass in flight")
	}
	n.sendLifecycle(testframe.Workload("urgent", "completed", n.id))
	testkit.Eventually(t, "the fresh frame at the peer", func() bool { return sink.Count("fresh", "urgent") == 1 })
	before := 0
	for _, e := range sink.Snapshot() {
		if e.Kind == "fresh" && e.ID == "urgent" {
			break
		}
		if e.Kind == "resync" {
			before++
		}
	}
	if before >= live {
		t.Fatalf("the fresh frame arrived after all %d re-assertions of the pass: it waited for the whole pass", before)
	}
}

func TestFreshFrameForAWorkloadInTheHeartbeatRequestInFlightWaitsForIt(t *testing.T) {
	// A removal of a workload whose re-assertion is in flight must not
	// overtake it, or the peer would apply the re-assertion last and show
	// the workload again: one sender per peer sends them in turn.
	n := newTestNode(t, withResyncInterval(300*time.Millisecond))
	n.start()
	sink := testkit.NewHBSink(t, true, 0)
	holding := sink.HoldFirst(testkit.HBEvent{Kind: "resync", ID: "hb-00001"}, 500*time.Millisecond)
	trackRunning(t, n, 3)
	joinSink(t, sink, n)
	waitClosed(t, "the re-assertion of hb-00001 in flight", holding)
	n.sendRemove("hb-00001")
	testkit.Eventually(t, "the removal at the peer", func() bool { return sink.Count("remove", "hb-00001") == 1 })
	requireNoReassertionAfterRemoval(t, sink.Snapshot())
	if sink.Count("resync", "hb-00001") != 1 {
		t.Fatalf("the re-assertion in flight never reached the peer: %v", sink.Snapshot())
	}
}

func TestReassertionNeverOvertakesAFreshFrameQueuedBeforeIt(t *testing.T) {
	// A fresh frame is held in flight and a newer one for the same
	// workload waits behind it while passes begin every 50 ms: the
	// heartbeat lane must not re-assert the newer state ahead of both, or
	// the peer would see the workload go running, queued, running.
	n := newTestNode(t, withResyncInterval(50*time.Millisecond))
	n.start()
	sink := testkit.NewHBSink(t, false, 0)
	joinSink(t, sink, n)
	holding := sink.HoldFirst(testkit.HBEvent{Kind: "fresh", ID: "x"}, 500*time.Millisecond)
	n.sendLifecycle(testframe.Workload("x", "queued", n.id, map[string]any{"seq": 1}))
	waitClosed(t, "the queued frame in flight", holding)
	n.sendLifecycle(testframe.Workload("x", "running", n.id, map[string]any{"seq": 2}))
	testkit.Eventually(t, "both fresh frames and a re-assertion at the peer", func() bool {
		return sink.Count("fresh", "x") == 2 && sink.Count("resync", "x") >= 1
	})
	var got []string
	for _, e := range sink.Snapshot() {
		if e.ID == "x" {
			got = append(got, e.Kind)
		}
	}
	if got[0] != "fresh" || got[1] != "fresh" {
		t.Fatalf("frames for x in arrival order %v: a re-assertion overtook a fresh frame queued before it", got)
	}
}

func TestHeartbeatPassToAFailingPeerEndsAtItsSecondFailureInARow(t *testing.T) {
	waitsOutRealTime(t, "a heartbeat pass")
	// A peer that fails re-assertions (down, overloaded) is tried twice
	// per interval, not once per entry: the pass ends at the second
	// failure in a row (one alone may be its entry's, spec 5.1).
	// The interval is long enough that the check below sees one pass.
	n := newTestNode(t, withResyncInterval(2*time.Second))
	n.start()
	sink := testkit.NewHBSink(t, false, 0)
	sink.FailResync = true
	trackRunning(t, n, 50)
	joinSink(t, sink, n)
	stats := func() *peersend.Stats {
		for _, st := range n.m.bcast.StatsSnapshot() {
			if st.Peer == sink.Ident.Principal {
				return st
			}
		}
		return &peersend.Stats{}
	}
	if !testkit.HoldsWithin(time.Minute, func() bool { return stats().PassesAbandoned.Load() == 1 }) {
		t.Fatal("timed out waiting for the first pass to end")
	}
	if got := sink.ResyncTries(); got != 2 {
		t.Fatalf("the failing peer was sent %d re-assertions in one pass, want 2", got)
	}
	// Fresh frames still go.
	n.sendLifecycle(testframe.Workload("after", "running", n.id))
	testkit.Eventually(t, "a fresh frame at the peer", func() bool { return sink.Count("fresh", "after") == 1 })
}

func TestHeartbeatPassGoesOnPastAnEntryThePeerRejects(t *testing.T) {
	// A rejection (4xx) is about one entry: the pass carries on.
	n := newTestNode(t, withResyncInterval(300*time.Millisecond))
	n.start()
	sink := testkit.NewHBSink(t, false, 0)
	sink.RejectResync = "hb-00001"
	trackRunning(t, n, 5)
	joinSink(t, sink, n)
	testkit.Eventually(t, "the entries after the rejected one re-asserted", func() bool { return sink.Count("resync", "hb-00004") == 1 })
}

// requireNoReassertionAfterRemoval fails when a workload was re-asserted to
// the peer after its removal reached it.
func requireNoReassertionAfterRemoval(t *testing.T, events []testkit.HBEvent) {
	t.Helper()
	removedAt := map[string]int{}
	for i, e := range events {
		switch e.Kind {
		case "remove":
			removedAt[e.ID] = i
		case "resync":
			if at, removed := removedAt[e.ID]; removed {
				t.Fatalf("%s re-asserted at %d, after its removal reached the peer at %d", e.ID, i, at)
			}
		}
	}
}

// waitClosed waits for ch to be closed, within the tests' usual deadline.
func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	testkit.Eventually(t, what, func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	})
}
