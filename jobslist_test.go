package main

import (
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
)

// A job's frames committed out of order (its producer posts each on its
// own goroutine, so the terminal can come first): the late queued frame is
// older than the end the origin holds, so no peer is sent it, and PAIR's
// broker at the peer shows the job completed.
func TestAPeersJobsListKeepsATerminalCommittedBeforeItsQueuedFrame(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	mesh(t, a, b)
	a.sendLifecycle(testframe.Workload("ooo", "completed", a.id, map[string]any{"seq": 3}))
	a.sendLifecycle(testframe.Workload("ooo", "queued", a.id, map[string]any{"seq": 1}))
	// A frame after both: once it is at the peer, so is whatever of ooo
	// was to be sent (one sender, version order).
	a.sendLifecycle(testframe.Workload("after", "running", a.id))
	b.broker.WaitUpserts("after", 1)
	if c := b.broker.UpsertCount("ooo"); c != 1 {
		t.Fatalf("the peer's broker got %d upserts of ooo, want the completed one alone", c)
	}
	if r, ok := b.broker.JobsList().Get(a.id, "ooo"); !ok || r.State != "completed" {
		t.Fatalf("the peer's Jobs list shows %+v, want the job completed", r)
	}
}
