package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// resyncEmpty reports whether n's re-sync set holds nothing: every
// terminal run has aged out of its retention.
func resyncEmpty(n *testNode) bool {
	n.m.activeMu.Lock()
	defer n.m.activeMu.Unlock()
	n.m.resync.prune(n.m.now())
	return n.m.resync.len() == 0
}

func TestNewTargetIsSentTheEndsItMissedAfterTheSetDroppedThem(t *testing.T) {
	// A peer away for longer than the terminal retention is sent, after
	// its backfill, the run that ended and the workload removed meanwhile.
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			n := newTestNode(t, withResyncInterval(100*time.Millisecond))
			n.start()
			n.sendLifecycle(workload("done", "running", n.id))
			n.sendLifecycle(workload("done", "completed", n.id))
			n.sendLifecycle(workload("gone", "running", n.id))
			n.sendRemove("gone")
			netBarrier(t, n)
			eventually(t, "the terminal run aged out of the set", func() bool { return resyncEmpty(n) })
			sink := newHBSink(t, batching, 0)
			sink.join(t, n)
			eventually(t, "the completed run and the removal at the new peer", func() bool {
				return sink.finalState("done") == "completed" && sink.finalState("gone") == "removed"
			})
		})
	}
}

func TestEndedLogLeavesOutARemovalWhoseIDARunOfTheSetHoldsAgain(t *testing.T) {
	// X was removed, then a new run of X began: a new target must get the
	// new run and not the removal, which would retire it at the peer.
	n := newTestNode(t, withResyncInterval(time.Hour))
	n.start()
	n.sendLifecycle(workload("x", "running", n.id))
	n.sendRemove("x")
	n.sendLifecycle(workload("x", "running", n.id, map[string]any{"runId": "run-x-2"}))
	n.sendRemove("other")
	netBarrier(t, n)
	sink := newHBSink(t, false, 0)
	sink.join(t, n)
	// The log sends in order: x's removal, were it sent, would arrive
	// before other's.
	eventually(t, "the log's removal of other at the peer", func() bool { return sink.count("remove", "other") == 1 })
	if got := sink.count("remove", "x"); got != 0 {
		t.Fatalf("the removal of a reused id reached the peer %d times after its new run, want 0", got)
	}
	if got := sink.finalState("x"); got != "running" {
		t.Fatalf("x at the peer is %q, want running", got)
	}
}

func TestEndedLogLeavesOutATerminalRunTheSetHolds(t *testing.T) {
	// A run that aged out and was tracked again (the broker's replay of
	// it) is in the set: the pass re-asserts it, the log leaves it out.
	n := newTestNode(t, withResyncInterval(time.Second))
	clock := ifxUseClock(n)
	n.start()
	n.sendLifecycle(workload("done", "completed", n.id))
	netBarrier(t, n)
	clock.advance(2 * time.Second)
	if !resyncEmpty(n) {
		t.Fatal("the terminal run is still in the set past its retention")
	}
	if r, _, done := n.m.takeEnded(0, n.m.endedSeq(), n.m.endedSeq(), 64, 1<<20); len(r.lines) != 1 || !done {
		t.Fatalf("the log gave %d lines (done %v), want the one end", len(r.lines), done)
	}
	n.sendLifecycle(workload("done", "completed", n.id))
	netBarrier(t, n)
	if r, _, done := n.m.takeEnded(0, n.m.endedSeq(), n.m.endedSeq(), 64, 1<<20); len(r.lines) != 0 || !done {
		t.Fatalf("the log gave %d lines (done %v) for a run the set holds again, want none", len(r.lines), done)
	}
}

// endedKey is the key of a test record numbered i.
func endedKey(i int) wireframe.WorkloadKey {
	return wireframe.WorkloadKey{Origin: "o", Engine: "e", RunID: "r", ID: fmt.Sprintf("id-%04d", i)}
}

func TestEndedLogKeepsAtMostItsEntryBoundOldestFirst(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	l := newEndedLog(time.Hour, 3, 1<<20)
	for i := range 5 {
		l.add(endedKey(i), false, []byte("line"), t0)
	}
	if l.len() != 3 || l.evicted != 2 {
		t.Fatalf("the log holds %d records and evicted %d, want 3 and 2", l.len(), l.evicted)
	}
	r, next, done := l.take(0, l.end(), 10, 1<<20, func(uint64, *endedRecord) bool { return false })
	if len(r.lines) != 3 || r.refs[0].ID != "id-0002" || next != 5 || !done {
		t.Fatalf("took %d lines from %v to %d (done %v), want id-0002..id-0004", len(r.lines), r.refs, next, done)
	}
}

func TestEndedLogKeepsAtMostItsByteBound(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	line := []byte(strings.Repeat("x", 1000))
	one := int64(len(line)+len("e")+len("r")+len("id-0000")) + endedRecordOverhead
	l := newEndedLog(time.Hour, 1000, 3*one)
	for i := range 10 {
		l.add(endedKey(i), false, line, t0)
		if l.bytes > 3*one {
			t.Fatalf("the log holds %d bytes, over its bound of %d", l.bytes, 3*one)
		}
	}
	if l.len() != 3 || l.evicted != 7 || l.bytes != 3*one {
		t.Fatalf("the log holds %d records of %d bytes and evicted %d, want 3, %d and 7", l.len(), l.bytes, l.evicted, 3*one)
	}
	// A record larger than the bound on its own is kept, alone.
	l.add(endedKey(10), false, make([]byte, 4*one), t0)
	if l.len() != 1 {
		t.Fatalf("the log holds %d records after an oversized one, want 1", l.len())
	}
}

func TestEndedLogDropsWhatIsOlderThanItsWindow(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	l := newEndedLog(10*time.Minute, 100, 1<<20)
	l.add(endedKey(0), false, []byte("a"), t0)
	l.add(endedKey(1), true, []byte("b"), t0.Add(5*time.Minute))
	l.expire(t0.Add(10*time.Minute - time.Nanosecond))
	if l.len() != 2 {
		t.Fatalf("the log holds %d records within the window, want 2", l.len())
	}
	l.expire(t0.Add(10 * time.Minute))
	if l.len() != 1 || l.evicted != 0 {
		t.Fatalf("the log holds %d records (evicted %d) once the first is past the window, want 1 (0)", l.len(), l.evicted)
	}
	// A take from a number the log no longer holds starts at its oldest.
	r, _, done := l.take(0, l.end(), 10, 1<<20, func(uint64, *endedRecord) bool { return false })
	if len(r.lines) != 1 || string(r.lines[0]) != "b" || !done {
		t.Fatalf("took %q (done %v), want b", r.lines, done)
	}
	l.expire(t0.Add(15 * time.Minute))
	if l.len() != 0 || l.bytes != 0 {
		t.Fatalf("the log holds %d records of %d bytes past every window, want none", l.len(), l.bytes)
	}
}

func TestEndedLogTakeLooksAtABudgetOfRecords(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	l := newEndedLog(time.Hour, 4096, 1<<30)
	for i := range 1000 {
		l.add(endedKey(i), false, []byte("l"), t0)
	}
	looked := 0
	r, next, done := l.take(0, l.end(), 64, 1<<20, func(uint64, *endedRecord) bool { looked++; return true })
	if len(r.lines) != 0 || done || looked != endedScanBudget || next != endedScanBudget {
		t.Fatalf("a take of skipped records looked at %d, took %d, went to %d (done %v); want %d, none, not done", looked, len(r.lines), next, done, endedScanBudget)
	}
}

func TestEndedLogMetricsCountItsEntriesBytesAndEvictions(t *testing.T) {
	n := newMetricsNode(t, false)
	n.m.ended.maxEntries = 2 // set before the node runs
	n.start()
	for _, id := range []string{"r1", "r2", "r3"} {
		n.sendRemove(id)
	}
	netBarrier(t, n)
	got := scrape(t, n)
	n.m.activeMu.Lock()
	bytes := n.m.ended.bytes
	n.m.activeMu.Unlock()
	if got["nvpair_wlm_ended_log_entries"] != 2 || got["nvpair_wlm_ended_log_evicted_total"] != 1 ||
		got["nvpair_wlm_ended_log_bytes"] != float64(bytes) || bytes == 0 {
		t.Fatalf("entries %v, evicted %v, bytes %v (the log holds %d); want 2, 1 and the log's bytes",
			got["nvpair_wlm_ended_log_entries"], got["nvpair_wlm_ended_log_evicted_total"], got["nvpair_wlm_ended_log_bytes"], bytes)
	}
}

func TestEndedLogStaysOwedToAPeerWhoseBackfillWasAbandoned(t *testing.T) {
	// The backfill fails at its first re-assertion: the log is sent after
	// the next pass instead.
	_, sink := joinWithAnAbandonedBackfill(t)
	sink.setFailResync(false)
	eventually(t, "the completed run at the peer", func() bool { return sink.finalState("done") == "completed" })
}

// A workload removed while a new target's backfill is pending reaches the
// target as a fresh removal; the log's older terminal record of it must
// not follow and write the run again after the removal (spec 5.2).
func TestEndedLogNeverRevivesAtAPeerAWorkloadRemovedWhileItsBackfillWasPending(t *testing.T) {
	n, sink := joinWithAnAbandonedBackfill(t)
	n.sendRemove("done") // the producer removes the ended job while the peer's backfill is pending
	eventually(t, "the fresh removal at the peer", func() bool { return sink.count("remove", "done") == 1 })
	sink.setFailResync(false)
	eventually(t, "a pass completed", func() bool { return peerStatsOf(n, sink).passesCompleted.Load() >= 1 })
	// The pass ends only after the log's last slice was sent (heartbeat.go
	// logTaken), so what the peer holds now is final.
	if got := sink.finalState("done"); got != "removed" {
		t.Fatalf("done at the peer is %q after its removal, want removed (events %v)", got, sink.snapshot())
	}
}

// A log whose last slice the peer failed is still owed: the pass is paid
// only once that slice was sent, for a stock peer and a batching one.
func TestEndedLogWhoseLastSliceFailedIsStillOwed(t *testing.T) {
	for _, batching := range []bool{false, true} {
		n := newTestNode(t, withResyncInterval(100*time.Millisecond))
		n.start()
		n.sendLifecycle(workload("done", "completed", n.id))
		netBarrier(t, n)
		eventually(t, "the terminal run aged out of the set", func() bool { return resyncEmpty(n) })
		sink := newHBSink(t, batching, 0)
		sink.setFailResync(true)
		sink.join(t, n)
		eventually(t, "the log's re-assertion tried", func() bool { return sink.resyncTries() >= 1 })
		sink.setFailResync(false)
		eventually(t, "the completed run at the peer", func() bool { return sink.finalState("done") == "completed" })
	}
}

// joinWithAnAbandonedBackfill starts a node holding a live run and, in its
// log of recent ends only, the completed run "done"; a peer then joins
// whose first re-assertion fails, and it returns once that backfill was
// abandoned (the peer still fails re-assertions).
func joinWithAnAbandonedBackfill(t *testing.T) (*testNode, *hbSink) {
	t.Helper()
	n := newTestNode(t, withResyncInterval(100*time.Millisecond))
	n.start()
	n.sendLifecycle(workload("done", "completed", n.id))
	netBarrier(t, n)
	eventually(t, "the terminal run aged out of the set", func() bool { return resyncEmpty(n) })
	n.sendLifecycle(workload("live", "running", n.id))
	netBarrier(t, n)
	sink := newHBSink(t, false, 0)
	sink.setFailResync(true)
	sink.join(t, n)
	eventually(t, "the backfill abandoned", func() bool { return peerStatsOf(n, sink).passesAbandoned.Load() >= 1 })
	return n, sink
}

// setFailResync makes the sink fail, or take, the re-assertions it gets.
func (s *hbSink) setFailResync(fail bool) {
	s.mu.Lock()
	s.failResync = fail
	s.mu.Unlock()
}
