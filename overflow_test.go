package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

var (
	refA = wireframe.WorkloadRef{Origin: "node-a", ID: "a"}
	refB = wireframe.WorkloadRef{Origin: "node-a", ID: "b"}
	refC = wireframe.WorkloadRef{Origin: "node-a", ID: "c"}
)

func TestOverflowMarkKeepsTheLatestFrameAndARemovalOvertakesTheStateBeforeIt(t *testing.T) {
	at := time.Unix(1, 0)
	o := newOverflowMarks(10)
	// A state, then its removal: the removal alone goes.
	o.add(refA, false, true, 1, 5, at)
	o.add(refA, true, false, 1, 9, at)
	// A removal, then the workload reported again: the removal, then the
	// latest state.
	o.add(refB, true, false, 1, 6, at)
	o.add(refB, false, true, 1, 9, at)
	// Three states: one mark, its place kept from the first.
	o.add(refC, false, true, 1, 7, at)
	o.add(refC, false, true, 1, 8, at)
	o.add(refC, false, true, 1, 9, at)
	if o.len() != 3 {
		t.Fatalf("%d marks for 3 workloads", o.len())
	}
	got := o.takeReady(100, 10)
	want := []overflowMark{
		{ref: refA, after: 5, removal: true, state: false, frames: 2, at: at},
		{ref: refB, after: 6, removal: true, state: true, frames: 2, at: at},
		{ref: refC, after: 7, removal: false, state: true, frames: 3, at: at},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("marks taken\n %+v\nwant\n %+v", got, want)
	}
}

func TestOverflowMarkGoesOnlyOnceTheFramesQueuedBeforeItHaveSettled(t *testing.T) {
	o := newOverflowMarks(10)
	o.add(refA, false, true, 1, 3, time.Now())
	o.add(refB, false, true, 1, 5, time.Now())
	if o.front.Load() != 3 {
		t.Fatalf("front = %d, want the first mark's 3", o.front.Load())
	}
	if got := o.takeReady(2, 10); len(got) != 0 {
		t.Fatalf("took %v with 2 of the 3 frames before it settled", got)
	}
	if got := o.takeReady(4, 10); len(got) != 1 || got[0].ref != refA {
		t.Fatalf("took %v at 4 settled, want a alone", got)
	}
	if o.front.Load() != 5 {
		t.Fatalf("front = %d, want b's 5", o.front.Load())
	}
	if got := o.takeReady(5, 10); len(got) != 1 || got[0].ref != refB {
		t.Fatalf("took %v at 5 settled, want b", got)
	}
	if o.front.Load() != noMark || o.busy() != true {
		t.Fatalf("front %d busy %v after taking every mark, want none and busy until settled", o.front.Load(), o.busy())
	}
}

func TestOverflowMarksAreBoundedAndABurstIsSummedWhenItDrains(t *testing.T) {
	o := newOverflowMarks(2)
	at := time.Now()
	if ok, began := o.add(refA, false, true, 1, 0, at); !ok || !began {
		t.Fatalf("first mark: ok %v began %v, want a burst begun", ok, began)
	}
	if ok, began := o.add(refB, true, false, 1, 0, at); !ok || began {
		t.Fatalf("second mark: ok %v began %v", ok, began)
	}
	if ok, _ := o.add(refA, false, true, 1, 0, at); !ok {
		t.Fatal("a marked workload's next frame was refused at the bound: it takes no new mark")
	}
	if ok, _ := o.add(refC, false, true, 1, 0, at); ok {
		t.Fatal("a third workload was marked past the bound of 2")
	}
	taken := o.takeReady(0, 1)
	if _, ended := o.settle(len(taken), 1, 0, 0); ended {
		t.Fatal("the burst ended with a mark left")
	}
	taken = o.takeReady(0, 1)
	sum, ended := o.settle(len(taken), 0, 1, 0)
	if !ended {
		t.Fatal("the burst did not end when the set drained")
	}
	want := overflowSummary{open: true, began: at, marked: 3, workloads: 2, recovered: 1, failed: 1, dropped: 1, bursts: 1}
	if sum != want {
		t.Fatalf("summary %+v, want %+v", sum, want)
	}
	if o.busy() {
		t.Fatal("busy after the burst ended")
	}
}

func TestAFrameOfAMarkedWorkloadJoinsItsMarkEvenWithRoomInTheQueue(t *testing.T) {
	// Were a later frame of a marked workload queued, the fresh lane could
	// deliver it before the heartbeat lane sends the mark, and the peer
	// would apply the older mark last (a removal after the job came back).
	s := &peerSender{
		queue: make(chan outboundFrame, 1),
		stats: &peerStats{},
		lanes: newLaneOrder(new(atomic.Int64), newOverflowMarks(10)),
		log:   slog.New(slog.DiscardHandler),
	}
	s.offer(outboundFrame{method: wireframe.MethodStarted, ref: refA}) // queued
	s.offer(outboundFrame{method: wireframe.MethodStarted, ref: refB}) // full: b marked
	<-s.queue                                                          // room again
	s.offer(outboundFrame{method: wireframe.MethodRemove, ref: refB})
	s.offer(outboundFrame{method: wireframe.MethodSubmitted, ref: refB})
	s.offer(outboundFrame{method: wireframe.MethodStarted, ref: refC}) // not marked: queued
	if len(s.queue) != 1 || (<-s.queue).ref != refC {
		t.Fatal("a frame of the marked workload took the queue's room")
	}
	got := s.lanes.marks.takeReady(noMark-1, 10)
	if len(got) != 1 || got[0].ref != refB || !got[0].removal || !got[0].state || got[0].frames != 3 || got[0].after != 1 {
		t.Fatalf("marks %+v, want b alone: its removal then its state, 3 frames, after the 1 frame queued before it", got)
	}
	if s.stats.overflowMarked.Load() != 3 || s.stats.queueDropped.Load() != 0 {
		t.Fatalf("marked %d dropped %d, want 3 and 0", s.stats.overflowMarked.Load(), s.stats.queueDropped.Load())
	}
}

func TestEnqueuePointMarksWhenFullAndHandsTheMarksOnOnceTheFramesBeforeThemAreOffered(t *testing.T) {
	logs := &logBuffer{}
	b := &broadcaster{
		log:          slog.New(slog.NewTextHandler(logs, nil)),
		queue:        make(chan outboundFrame, 2),
		peers:        map[string]*peerSender{},
		markLimit:    2,
		dispatchDone: make(chan struct{}),
	}
	peer := &peerSender{
		queue:         make(chan outboundFrame, 8),
		queueMaxBytes: peerQueueMaxBytes,
		stats:         &peerStats{},
		lanes:         newLaneOrder(&b.undispatched, newOverflowMarks(10)),
		log:           slog.New(slog.DiscardHandler),
	}
	b.peers["p"] = peer
	refD, refE, refF := wireframe.WorkloadRef{Origin: "node-a", ID: "d"}, wireframe.WorkloadRef{Origin: "node-a", ID: "e"}, wireframe.WorkloadRef{Origin: "node-a", ID: "f"}
	enqueue := func(f outboundFrame, want bool) {
		t.Helper()
		if got := b.enqueue(f); got != want {
			t.Fatalf("enqueue %s = %v, want %v", f.line, got, want)
		}
	}
	// No dispatcher yet: the queue fills exactly.
	enqueue(outboundFrame{method: wireframe.MethodStarted, ref: refA, line: []byte("a")}, true)
	enqueue(outboundFrame{method: wireframe.MethodStarted, ref: refB, line: []byte("b")}, true)
	enqueue(outboundFrame{method: wireframe.MethodStarted, ref: refC, line: []byte("c")}, true) // full: c marked after a and b
	// a is offered; c's mark waits for b.
	b.dispatchOne(<-b.queue)
	if peer.lanes.marks.len() != 0 {
		t.Fatal("c's mark reached the peer before b, enqueued before it, was offered")
	}
	// Room again, but c is marked: its removal joins the mark.
	enqueue(outboundFrame{method: wireframe.MethodRemove, ref: refC, line: []byte("c-rm")}, true)
	if len(b.queue) != 1 {
		t.Fatal("a frame of a workload marked at the enqueue point took the queue's room")
	}
	enqueue(outboundFrame{method: wireframe.MethodStarted, ref: refD, line: []byte("d")}, true)
	enqueue(outboundFrame{method: wireframe.MethodStarted, ref: refE, line: []byte("e")}, true)  // full: e marked
	enqueue(outboundFrame{method: wireframe.MethodStarted, ref: refF, line: []byte("f")}, false) // past the bound of 2: dropped
	if b.queued.Load() != 3 || b.marked.Load() != 3 || b.dropped.Load() != 1 {
		t.Fatalf("queued %d marked %d dropped %d, want 3, 3 and 1", b.queued.Load(), b.marked.Load(), b.dropped.Load())
	}
	if b.undispatched.Load() != 2 {
		t.Fatalf("%d frames counted on their way through the queue, want the 2 in it", b.undispatched.Load())
	}
	if !logs.contains("level=WARN", "outbound queue full: marking workloads") || strings.Contains(logs.String(), "marked=1") {
		t.Fatalf("want one warning that marking began, without a count:\n%s", logs)
	}
	go b.dispatch()
	close(b.queue)
	<-b.dispatchDone
	got := peer.lanes.marks.takeReady(noMark-1, 10)
	want := []overflowMark{
		{ref: refC, after: 2, removal: true, state: false, frames: 2},
		{ref: refE, after: 3, removal: false, state: true, frames: 1},
	}
	for i := range got {
		got[i].at = time.Time{}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the peer's marks are\n %+v\nwant c's removal after the 2 frames offered before it, then e after 3:\n %+v", got, want)
	}
	var lines []string
	for range len(peer.queue) {
		lines = append(lines, string((<-peer.queue).line))
	}
	if !slices.Equal(lines, []string{"a", "b", "d"}) {
		t.Fatalf("the peer's queue holds %q, want a, b and d in order", lines)
	}
}

func TestOverflowEndLinesWithinTheIntervalAreHeldAndSummed(t *testing.T) {
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	var l overflowLog
	l.ended(log, overflowSummary{marked: 5, workloads: 2, recovered: 2, bursts: 1})
	if !logs.contains(`msg="peer overflow recovered"`, "marked=5", "recovered=2", "bursts=1") {
		t.Fatalf("the first burst's line was not written at once:\n%s", logs)
	}
	// Bring the interval's end near, so the held line comes within the
	// test's deadline.
	l.mu.Lock()
	l.lastEnd = time.Now().Add(-dropLogInterval + 100*time.Millisecond)
	l.mu.Unlock()
	l.ended(log, overflowSummary{marked: 7, workloads: 3, recovered: 3, bursts: 1})
	l.ended(log, overflowSummary{marked: 1, workloads: 1, lost: 1, bursts: 1})
	if c := strings.Count(logs.String(), "peer overflow recovered"); c != 1 {
		t.Fatalf("%d lines within the interval, want the later bursts held:\n%s", c, logs)
	}
	eventually(t, "the held bursts' line", func() bool {
		return logs.contains("level=WARN", `msg="peer overflow recovered"`, "marked=8", "workloads=4", "recovered=3", "lost=1", "bursts=2")
	})
}

// overflowNode is a node whose only peer is a single-frame sink holding
// every request: the first frame is in flight, and the peer's queue is
// empty, with room for peerQueueSize frames.
func overflowNode(t *testing.T, opts ...nodeOption) (*testNode, *hbSink) {
	t.Helper()
	return overflowNodeTo(t, false, opts...)
}

// overflowNodeTo is overflowNode with a batching sink when batching.
func overflowNodeTo(t *testing.T, batching bool, opts ...nodeOption) (*testNode, *hbSink) {
	t.Helper()
	n := newTestNode(t, append([]nodeOption{withResyncInterval(time.Hour)}, opts...)...)
	n.start()
	sink := newHBSink(t, batching, 0)
	sink.join(t, n)
	sink.holdAll()
	n.sendLifecycle(workload("first", "running", n.id))
	eventually(t, "the first frame in flight at the held peer", func() bool { return sink.requests() == 1 })
	return n, sink
}

// sendRunning enters a running workload per id through n's broker, a few
// hundred at a time, each lot dispatched before the next: the enqueue
// point (1,024 frames) never fills, so every overflow is the peer queue's
// and the counts the tests expect do not depend on the scheduler.
func sendRunning(t *testing.T, n *testNode, state string, ids ...string) {
	t.Helper()
	for i, id := range ids {
		n.sendLifecycle(workload(id, state, n.id))
		if i%256 == 255 || i == len(ids)-1 {
			eventually(t, "the frames dispatched", func() bool { return n.m.bcast.undispatched.Load() == 0 })
		}
	}
}

// ids returns prefix-0000 .. prefix-<count-1>.
func ids(prefix string, count int) []string {
	out := make([]string, count)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

// peerMarks is the marks of n's only peer.
func peerMarks(n *testNode) *overflowMarks {
	b := n.m.bcast
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.peers {
		return s.lanes.marks
	}
	return nil
}

func TestOverflowReachesThePeerInItsFinalStateInOrderAndLogsTheBurstsCount(t *testing.T) {
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) { overflowReachesThePeer(t, batching) })
	}
}

func overflowReachesThePeer(t *testing.T, batching bool) {
	n, sink := overflowNodeTo(t, batching)
	fill := ids("fill", peerQueueSize)
	sendRunning(t, n, "queued", fill...)
	// The queue is full. fill-0005 is in it as queued; its running frame
	// marks it and must not reach the peer before the queued one.
	n.sendLifecycle(workload("fill-0005", "running", n.id))
	// The latest state wins: one re-assertion, completed.
	n.sendLifecycle(workload("up", "running", n.id))
	n.sendLifecycle(workload("up", "completed", n.id))
	// A removal overtakes the state marked before it: no upsert at all.
	n.sendLifecycle(workload("gone", "running", n.id))
	n.sendRemove("gone")
	// Removed, then back: the removal, then the state.
	n.sendLifecycle(workload("back", "running", n.id))
	n.sendRemove("back")
	n.sendLifecycle(workload("back", "queued", n.id))
	netBarrier(t, n)
	eventually(t, "4 workloads marked for the peer", func() bool { return peerMarks(n).len() == 4 })
	if got := sink.requests(); got > 2 {
		t.Fatalf("%d requests reached the held peer, want the first and at most one marked workload's", got)
	}

	sink.release()
	want := map[string]string{"first": "running", "fill-0005": "running", "up": "completed", "gone": "removed", "back": "queued"}
	for _, id := range fill {
		if want[id] == "" {
			want[id] = "queued"
		}
	}
	eventually(t, "every workload in its final state at the peer", func() bool {
		for id, state := range want {
			if sink.finalState(id) != state {
				return false
			}
		}
		return true
	})
	var kinds = map[string][]string{}
	for _, e := range sink.snapshot() {
		kinds[e.id] = append(kinds[e.id], e.kind)
	}
	for id, wantKinds := range map[string][]string{
		"fill-0005": {"fresh", "resync"},
		"up":        {"resync"},
		"gone":      {"remove"},
		"back":      {"remove", "resync"},
	} {
		if !slices.Equal(kinds[id], wantKinds) {
			t.Errorf("%s reached the peer as %v, want %v", id, kinds[id], wantKinds)
		}
	}
	// 8 frames marked 4 workloads; 5 frames recovered them.
	eventually(t, "the burst's line", func() bool {
		return n.logs.contains(`msg="peer overflow recovered"`, "marked=8", "workloads=4", "recovered=5", "failed=0", "lost=0", "dropped=0")
	})
	st := peerStatsOf(n, sink)
	if st.overflowMarked.Load() != 8 || st.overflowRecovered.Load() != 5 || st.queueDropped.Load() != 0 {
		t.Fatalf("marked %d recovered %d dropped %d, want 8, 5 and 0", st.overflowMarked.Load(), st.overflowRecovered.Load(), st.queueDropped.Load())
	}
	if !n.logs.contains("level=WARN", "peer queue full: marking workloads") {
		t.Fatalf("no warning when the burst began:\n%s", n.logs)
	}
}

func TestOverflowPastTheMarksBoundDropsAndCountsIt(t *testing.T) {
	// The marks' bound is the re-sync set's, here 1,034. first and
	// w-0000..w-1025 fill the queue and mark 2; x-0000..x-1033 mark 1,032
	// more and the last 2 are dropped. The set is full after x-0006: the
	// marks of x-0007 on find no state to send, and are lost.
	const limit = peerQueueSize + 10
	n, sink := overflowNode(t, withMaxLiveWorkloads(limit))
	sendRunning(t, n, "running", ids("w", peerQueueSize+2)...)
	sendRunning(t, n, "running", ids("x", limit)...)
	netBarrier(t, n)
	st := peerStatsOf(n, sink)
	eventually(t, "the marks at their bound and the rest dropped", func() bool {
		return peerMarks(n).len() == limit && st.queueDropped.Load() == 2
	})
	if !n.logs.contains("level=WARN", "overflow marks at their bound") {
		t.Fatalf("no warning at the bound:\n%s", n.logs)
	}
	var metrics strings.Builder
	netMust(t, n.m.writeMetrics(&metrics))
	for _, series := range []string{
		fmt.Sprintf(`nvpair_wlm_peer_overflow_workloads{peer="%s"} %d`, sink.ident.Principal, limit),
		fmt.Sprintf(`nvpair_wlm_peer_overflow_limit_workloads %d`, limit),
		fmt.Sprintf(`nvpair_wlm_peer_queue_dropped_total{peer="%s"} 2`, sink.ident.Principal),
		fmt.Sprintf(`nvpair_wlm_peer_overflow_marked_total{peer="%s"} %d`, sink.ident.Principal, limit),
	} {
		if !strings.Contains(metrics.String(), series+"\n") {
			t.Errorf("metrics lack %s", series)
		}
	}
	sink.release()
	eventually(t, "the burst's line, with its losses", func() bool {
		return n.logs.contains("level=WARN", `msg="peer overflow recovered"`, fmt.Sprintf("marked=%d", limit),
			fmt.Sprintf("workloads=%d", limit), "recovered=9", "lost=1025", "dropped=2")
	})
	if got := st.queueDropped.Load(); got != 2+1025 {
		t.Fatalf("%d frames counted lost to the full queue, want 2 dropped and 1,025 with nothing to send", got)
	}
}

func TestFreshFrameWaitsForTheRecoveryInFlightOfItsWorkload(t *testing.T) {
	// The recovery of a marked workload goes on the heartbeat lane's own
	// connection: a removal queued fresh after the mark was taken must not
	// overtake it, or the peer would apply the recovered state last and
	// show the workload again.
	n, sink := overflowNode(t)
	sendRunning(t, n, "running", ids("fill", peerQueueSize)...)
	n.sendLifecycle(workload("w", "running", n.id)) // full: w marked
	netBarrier(t, n)
	eventually(t, "w marked", func() bool { return peerMarks(n).len() == 1 })
	holding := sink.holdFirst(hbEvent{"resync", "w"}, 500*time.Millisecond)
	sink.release()
	waitClosed(t, "w's recovery in flight", holding)
	n.sendRemove("w")
	eventually(t, "the recovery and the removal at the peer", func() bool {
		return sink.count("resync", "w") == 1 && sink.count("remove", "w") == 1
	})
	requireNoReassertionAfterRemoval(t, sink.snapshot())
	if sink.finalState("w") != "removed" {
		t.Fatalf("w is %q at the peer, want removed", sink.finalState("w"))
	}
}

func TestShutdownDrainSendsTheMarkedWorkloadsToo(t *testing.T) {
	// The drain timeout gives the marked workloads the time it gives the
	// queue: they are what the queue could not hold.
	n, sink := overflowNode(t, func(c *Config) { c.DrainTimeout = waitTimeout })
	sendRunning(t, n, "running", ids("fill", peerQueueSize)...)
	var marked []string
	for i := range 10 {
		marked = append(marked, fmt.Sprintf("marked-%d", i))
		n.sendLifecycle(workload(marked[i], "running", n.id))
	}
	netBarrier(t, n)
	eventually(t, "10 workloads marked", func() bool { return peerMarks(n).len() == len(marked) })
	n.broker.toD.Close() // the broker quits: EOF starts the shutdown
	sink.release()
	waitRun(t, n, 2*waitTimeout)
	for _, id := range marked {
		if sink.count("resync", id) != 1 {
			t.Fatalf("%s did not reach the peer before the daemon exited: %d of %d marked workloads did",
				id, sink.count("resync", ""), len(marked))
		}
	}
}

func TestARecoveredRemovalNamesItsWorkloadAsTheFrameDid(t *testing.T) {
	ref := wireframe.WorkloadRef{Origin: "node-<a>", ID: "job \"é\" \\ 1"}
	line := removalLine(ref)
	var f wireframe.RPC
	netMust(t, json.Unmarshal(line, &f))
	r, err := wireframe.ParseRemove(f.Params)
	if err != nil || f.Method != wireframe.MethodRemove || r.Ref != ref {
		t.Fatalf("removal %s parses as %q %+v (%v), want %s naming %+v", line, f.Method, r.Ref, err, wireframe.MethodRemove, ref)
	}
}
