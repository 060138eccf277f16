//go:build unix

package e2e

import (
	"encoding/json"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/pairbroker"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// PAIR's own rules (issue 37), each a process test of real daemons over
// real mutual TLS, judged by what PAIR's broker store (internal/dev/pairbroker,
// checked against PAIR's own through internal/dev/pairshadow) makes of what a
// peer's daemon wrote it.

// heardWithin is how soon a peer's broker must hear a restarted origin
// again: well under the heartbeat interval (30 s by default), which is
// what it took before.
const heardWithin = 2 * time.Second

// brokerJob is a job of the origin's own broker (a proxy's), written to its
// store and then to its daemon on stdin, as PAIR's broker does with its own
// lifecycle events.
func brokerJob(b *pairNodeBroker, id, state string, seq int) {
	b.t.Helper()
	w := testframe.Workload(id, state, b.node.ID, map[string]any{"seq": seq, "createdAt": time.Now().UnixMilli()})
	info, err := json.Marshal(w)
	testkit.Must(b.t, err)
	if _, err := b.store.Upsert(info); err != nil {
		b.t.Fatal(err)
	}
	b.cur().send(string(testframe.Lifecycle(w, nil)))
}

// TestProcessARestartedOriginIsHeardAgainWhereItsLossWasInferred: A's
// jobs (its broker's and a producer's) run on both nodes; B's broker sees A
// leave discovery and fails A's live jobs by inference, as PAIR's does; A
// is killed with SIGKILL and started again with its broker's replay, and
// the two meet again. B's Jobs list must show every job running within 2 s.
// Before, A sent the replay as ordinary frames, B's dedup dropped them as
// duplicates of what it had before the crash, and B showed them failed
// until A's next heartbeat (the interval, 30 s).
func TestProcessARestartedOriginIsHeardAgainWhereItsLossWasInferred(t *testing.T) {
	nodes := writeCluster(t, 2)
	a := newPairNodeBroker(t, nodes[0], originFlags("30s")...)
	b := newPairNodeBroker(t, nodes[1])
	a.start()
	b.start()
	meet(t, a, b)
	const n = 20
	id := func(i int) string { return "restarted-" + itoa(i) }
	p := newProducer(t, a.cur().loggedValue("local ingress listening", "addr"))
	for i := range n {
		if i%2 == 0 {
			brokerJob(a, id(i), "running", 1)
			continue
		}
		if st, text := p.post(jobFrame(id(i), "running", 1)); st != 200 {
			t.Fatalf("post of %s: %d %q", id(i), st, text)
		}
	}
	b.mustJobs("B's Jobs list to show A's jobs running", func(s *pairbroker.Store) bool { return allShown(s, nodes[0].ID, n, id, "running") })

	// A leaves B's discovery: B's broker infers its loss.
	leave(t, b.cur())
	b.jobs()
	if failed := b.store.FailNode(nodes[0].ID, "node left discovery"); len(failed) != n {
		t.Fatalf("B's broker inferred %d of A's %d jobs failed", len(failed), n)
	}
	a.kill9()
	a.start()
	meet(t, a, b)
	start := time.Now()
	meant := map[string]string{}
	for i := range n {
		meant[id(i)] = "running"
	}
	var wrong int
	var summary string
	b.waitJobs(heardWithin, func(s *pairbroker.Store) bool {
		wrong, summary = judge(s, nodes[0].ID, meant)
		return wrong == 0
	})
	if wrong != 0 {
		t.Fatalf("%v after A returned, B's Jobs list shows %d of %d of its jobs wrong (%s): B's broker did not hear A's replay",
			heardWithin, wrong, n, summary)
	}
	t.Logf("B's Jobs list showed A's %d jobs running %v after A returned", n, time.Since(start).Round(time.Millisecond))
}

// TestProcessAnOriginBackInDiscoveryIsHeardAgainWhereItsLossWasInferred:
// the same without the restart. A and B lose each other from discovery (a
// partition), B's broker fails A's live jobs by inference, and they meet
// again: nothing of A's changed, so nothing lies above B's mark, and B's
// Jobs list must still show every job running within 2 s, as the stock
// worker's backfill of a peer it adds makes it. Before, it showed them
// failed until A's next heartbeat.
func TestProcessAnOriginBackInDiscoveryIsHeardAgainWhereItsLossWasInferred(t *testing.T) {
	nodes := writeCluster(t, 2)
	a := newPairNodeBroker(t, nodes[0], originFlags("30s")...)
	b := newPairNodeBroker(t, nodes[1])
	a.start()
	b.start()
	meet(t, a, b)
	const n = 20
	id := func(i int) string { return "partitioned-" + itoa(i) }
	for i := range n {
		brokerJob(a, id(i), "running", 1)
	}
	b.mustJobs("B's Jobs list to show A's jobs running", func(s *pairbroker.Store) bool { return allShown(s, nodes[0].ID, n, id, "running") })
	leave(t, a.cur())
	leave(t, b.cur())
	b.jobs()
	if failed := b.store.FailNode(nodes[0].ID, "node left discovery"); len(failed) != n {
		t.Fatalf("B's broker inferred %d of A's %d jobs failed", len(failed), n)
	}
	meet(t, a, b)
	start := time.Now()
	meant := map[string]string{}
	for i := range n {
		meant[id(i)] = "running"
	}
	if !b.waitJobs(heardWithin, func(s *pairbroker.Store) bool { return allShown(s, nodes[0].ID, n, id, "running") }) {
		w, sum := judge(b.jobs(), nodes[0].ID, meant)
		t.Fatalf("%v after A came back, B's Jobs list shows %d of %d of its jobs wrong (%s)", heardWithin, w, n, sum)
	}
	t.Logf("B's Jobs list showed A's %d jobs running %v after A came back", n, time.Since(start).Round(time.Millisecond))
}

// TestRemovalTombstoneDoesNotBlockResyncTaggedFrame is the seed's rule at
// an ingress removal's tombstone: it blocks the broker's ordinary
// lifecycle frames for that (origin, id) only, and a re-sync-tagged frame
// from the broker is an explicit re-assertion that passes, all the way to
// the peers' brokers. A producer posts two jobs on A and removes them; A's
// broker then sends an ordinary frame for one (its replay, landed after the
// removal: dropped) and a re-sync-tagged frame for the other, the very
// workload object the producer posted. B's Jobs list must show the second
// running and never the first. Before, the tagged frame was committed but
// sent without its tag, and B's dedup dropped it as the producer's frame
// it had seen.
func TestRemovalTombstoneDoesNotBlockResyncTaggedFrame(t *testing.T) {
	nodes := writeCluster(t, 2)
	a := newPairNodeBroker(t, nodes[0], originFlags("30s")...)
	b := newPairNodeBroker(t, nodes[1])
	a.start()
	b.start()
	meet(t, a, b)
	p := newProducer(t, a.cur().loggedValue("local ingress listening", "addr"))
	ids := []string{"replayed", "reasserted"}
	for _, id := range ids {
		if st, text := p.post(jobFrame(id, "running", 1)); st != 200 {
			t.Fatalf("post of %s: %d %q", id, st, text)
		}
	}
	b.mustJobs("B's Jobs list to show both jobs running", func(s *pairbroker.Store) bool {
		st := shownStates(s, nodes[0].ID)
		return st["replayed"] == "running" && st["reasserted"] == "running"
	})
	// The workload objects as A's daemon relayed them, origin stamped.
	relayed := map[string]json.RawMessage{}
	for _, r := range a.jobs().Snapshot() {
		relayed[r.ID] = r.Info
	}
	for _, id := range ids {
		if st, text := p.post(string(testframe.Removal(id, ""))); st != 200 {
			t.Fatalf("removal of %s: %d %q", id, st, text)
		}
	}
	b.mustJobs("B's Jobs list to drop both jobs", func(s *pairbroker.Store) bool {
		st := shownStates(s, nodes[0].ID)
		return shown(st, "replayed") == "absent" && shown(st, "reasserted") == "absent"
	})
	a.cur().send(string(wireframe.EncodeNotification("workload:started", json.RawMessage(`{"workloadInfo":`+string(relayed["replayed"])+`}`))))
	a.cur().send(string(wireframe.EncodeNotification("workload:started", json.RawMessage(`{"resync":true,"workloadInfo":`+string(relayed["reasserted"])+`}`))))
	if !b.waitJobs(testkit.WaitTimeout, func(s *pairbroker.Store) bool { return shownStates(s, nodes[0].ID)["reasserted"] == "running" }) {
		t.Fatalf("B's Jobs list shows the re-sync-tagged job %s, want running: the tombstone or B's dedup dropped an explicit re-assertion",
			shown(shownStates(b.jobs(), nodes[0].ID), "reasserted"))
	}
	// Frames reach B in A's order: the ordinary frame, sent first, would
	// be there by now.
	if got := shown(shownStates(b.jobs(), nodes[0].ID), "replayed"); got != "absent" {
		t.Fatalf("B's Jobs list shows the removed job %s after the broker's ordinary frame: the tombstone let it through", got)
	}
}
