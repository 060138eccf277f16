package e2e

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// Removals that repeat (issue 21, item 2; spec 3.3, "Dedup"): a workload id
// reused for a second run and removed again is removed again at every
// peer's broker, on every path, while the same removal delivered twice with
// nothing of the workload between still reaches a broker once.

// runLine is a broker's lifecycle frame for run of id: each run has its own
// runId, as a reused id's runs do.
func runLine(id, run, state, origin string) string {
	return string(testframe.Lifecycle(testframe.Workload(id, state, origin, map[string]any{"runId": id + "-" + run}), nil))
}

// removalsOf counts the workloads:remove frames for id the broker got.
func (l *daemonProc) removalsOf(id string) int {
	n := 0
	for _, f := range l.WithMethod(wireframe.MethodRemove) {
		var p struct{ WorkloadID string }
		if json.Unmarshal(f.Params, &p) == nil && p.WorkloadID == id {
			n++
		}
	}
	return n
}

// liveAtBroker applies what the broker got, in order, as its store would
// (an upsert makes a workload live, a removal deletes it) and returns the
// live workloads' ids.
func (l *daemonProc) liveAtBroker() map[string]bool {
	live := map[string]bool{}
	for _, f := range l.All() {
		switch f.Method {
		case wireframe.MethodUpsert:
			var p struct{ WorkloadInfo struct{ ID string } }
			if json.Unmarshal(f.Params, &p) == nil {
				live[p.WorkloadInfo.ID] = true
			}
		case wireframe.MethodRemove:
			var p struct{ WorkloadID string }
			if json.Unmarshal(f.Params, &p) == nil {
				delete(live, p.WorkloadID)
			}
		}
	}
	return live
}

// wantReusedIDRemovedTwice waits until the barrier workload reached d's
// broker, after everything sent before it, and checks that d's broker
// holds nothing of id and got a removal of it. (The peer is sent each
// entry's latest state: runs removed before it took them reach it as
// their removal alone.)
func wantReusedIDRemovedTwice(t *testing.T, d *daemonProc, id, barrier string) {
	t.Helper()
	d.WaitUpserts(barrier, 1)
	if got := d.removalsOf(id); got < 1 {
		t.Fatalf("the peer's broker got no removal of %s", id)
	}
	if d.liveAtBroker()[id] {
		t.Fatalf("%s is live at the peer's broker after its origin removed it", id)
	}
}

func TestProcessReusedIDRemovedTwiceThroughTheBrokerIsRemovedAtThePeer(t *testing.T) {
	nodes := writeCluster(t, 2)
	a, b := startPair(t, nodes[0], nodes[1])
	origin := nodes[0].ID
	a.send(runLine("job-42", "1", "running", origin))
	a.send(string(testframe.Removal("job-42", origin)))
	a.send(runLine("job-42", "2", "running", origin))
	a.send(string(testframe.Removal("job-42", origin)))
	a.send(testframe.LifecycleLine("barrier", "running", origin))
	wantReusedIDRemovedTwice(t, b, "job-42", "barrier")
}

func TestProcessReusedIDRemovedTwiceThroughTheIngressIsRemovedAtThePeer(t *testing.T) {
	nodes := writeCluster(t, 2)
	a, b := startPair(t, nodes[0], nodes[1], "--local-ingress", "127.0.0.1:0")
	ingress := a.loggedValue("local ingress listening", "addr")
	for i, frame := range []string{
		runLine("job-42", "1", "running", ""),
		string(testframe.Removal("job-42", "")),
		runLine("job-42", "2", "running", ""),
		string(testframe.Removal("job-42", "")),
		testframe.LifecycleLine("barrier", "running", ""),
	} {
		if st, text := testkit.PostIngress(t, ingress, frame); st != http.StatusOK {
			t.Fatalf("ingress post %d = %d %q, want 200", i, st, text)
		}
	}
	// The origin's own broker got every frame: nothing on the sending side
	// swallows the second removal. A 200 says the frame's line was written
	// to the broker's pipe, not that the harness has read it yet: the
	// barrier, written last, says every line before it has been.
	a.WaitUpserts("barrier", 1)
	if got := a.removalsOf("job-42"); got != 2 {
		t.Fatalf("the origin's broker got %d of 2 removals", got)
	}
	wantReusedIDRemovedTwice(t, b, "job-42", "barrier")
}

// TestProcessReusedIDRemovedTwiceInABatchAndRepeatedRemovalsOnce posts to a
// real daemon's peer port with the origin's own certificate: the reused
// id's two runs and two removals, in one batch or as single frames, all
// reach the broker; the
// same removal twice in a row (single frames, or two elements of one
// batch), or from two peers at once, reaches it once.
func TestProcessReusedIDRemovedTwiceInABatchAndRepeatedRemovalsOnce(t *testing.T) {
	nodes := writeCluster(t, 3)
	na, nb, nc := nodes[0], nodes[1], nodes[2]
	b := startNode(t, nb)
	b.WaitMethod("discovery:subscribe", 1)
	// No discovery snapshot: B takes A's events from any pinned peer, as it
	// does before its first snapshot, so C can relay A's removal too.
	fromA := testkit.PeerClient(t, &na.Identity, nb.Identity.DER)
	fromC := testkit.PeerClient(t, &nc.Identity, nb.Identity.DER)
	bPeer := "127.0.0.1:" + itoa(b.port)
	body := func(line string) []byte { return []byte(line) }

	t.Run("reused id in one batch", func(t *testing.T) {
		ans := netPostBatch(t, fromA, bPeer,
			body(runLine("job-42", "1", "running", na.ID)), body(string(testframe.Removal("job-42", na.ID))),
			body(runLine("job-42", "2", "running", na.ID)), body(string(testframe.Removal("job-42", na.ID))),
			body(testframe.LifecycleLine("barrier-1", "running", na.ID)))
		if ans.status != http.StatusOK || len(ans.results) != 5 {
			t.Fatalf("batch = %d %+v", ans.status, ans.results)
		}
		for i, r := range ans.results {
			if r.Status != http.StatusOK || r.Reason != "" {
				t.Fatalf("element %d = %+v, want written (200, no reason): %+v", i, r, ans.results)
			}
		}
		wantReusedIDRemovedTwice(t, b, "job-42", "barrier-1")
	})

	t.Run("reused id in single frames", func(t *testing.T) {
		for i, line := range []string{
			runLine("job-43", "1", "running", na.ID), string(testframe.Removal("job-43", na.ID)),
			runLine("job-43", "2", "running", na.ID), string(testframe.Removal("job-43", na.ID)),
			testframe.LifecycleLine("barrier-4", "running", na.ID),
		} {
			if st, text := netPostAnswer(t, fromA, bPeer, body(line)); st != http.StatusOK {
				t.Fatalf("frame %d = %d %q, want 200", i, st, text)
			}
		}
		wantReusedIDRemovedTwice(t, b, "job-43", "barrier-4")
	})

	t.Run("same removal twice in a row", func(t *testing.T) {
		if st, text := netPostAnswer(t, fromA, bPeer, body(runLine("job-7", "1", "running", na.ID))); st != http.StatusOK {
			t.Fatalf("upsert = %d %q", st, text)
		}
		rm := body(string(testframe.Removal("job-7", na.ID)))
		for i := range 2 {
			// A single frame's answer is 200 "ok" whether it was written or
			// already seen: the broker tells which.
			if st, text := netPostAnswer(t, fromA, bPeer, rm); st != http.StatusOK {
				t.Fatalf("removal %d = %d %q, want 200", i+1, st, text)
			}
		}
		ans := netPostBatch(t, fromA, bPeer, rm, rm, body(testframe.LifecycleLine("barrier-2", "running", na.ID)))
		for i, r := range ans.results[:2] {
			if r.Status != http.StatusOK || r.Reason != reasonAlreadySeen {
				t.Fatalf("batch element %d = %+v, want already seen", i, r)
			}
		}
		b.WaitUpserts("barrier-2", 1)
		if got := b.removalsOf("job-7"); got != 1 {
			t.Fatalf("the broker got the removal %d times, want once", got)
		}
	})

	t.Run("one removal from two peers at once", func(t *testing.T) {
		if st, text := netPostAnswer(t, fromA, bPeer, body(runLine("job-9", "1", "running", na.ID))); st != http.StatusOK {
			t.Fatalf("upsert = %d %q", st, text)
		}
		rm := body(string(testframe.Removal("job-9", na.ID)))
		// As batches, whose results tell a write from a duplicate.
		results := make([]peerBatchResult, 2)
		var wg sync.WaitGroup
		for i, c := range []*http.Client{fromA, fromC} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if ans := netPostBatch(t, c, bPeer, rm); len(ans.results) == 1 {
					results[i] = ans.results[0]
				}
			}()
		}
		wg.Wait()
		written := peerBatchResult{Status: http.StatusOK}
		seen := peerBatchResult{Status: http.StatusOK, Reason: reasonAlreadySeen}
		if !(results[0] == written && results[1] == seen) && !(results[0] == seen && results[1] == written) {
			t.Fatalf("results %+v, want one written and one already seen", results)
		}
		if st, _ := netPostAnswer(t, fromA, bPeer, body(testframe.LifecycleLine("barrier-3", "running", na.ID))); st != http.StatusOK {
			t.Fatal("barrier refused")
		}
		b.WaitUpserts("barrier-3", 1)
		if got := b.removalsOf("job-9"); got != 1 {
			t.Fatalf("the broker got the removal %d times, want once", got)
		}
	})
}
