package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The broker behaviours of PAIR's that the dev cluster plays (issue 31),
// each checked against the daemon. Every test cluster is judged by PAIR's
// own store when ../shared has it (judgeAtTheEnd).

// PAIR's broker sweeps every 60 s with a budget of 5 minutes (StaleForeign,
// ApplyInferredUnchangedSince); a demo budget keeps the ratio.
func TestTheSweepRunsAtPAIRsCadence(t *testing.T) {
	for budget, want := range map[time.Duration]time.Duration{
		5 * time.Minute: time.Minute, 10 * time.Second: 2 * time.Second, 200 * time.Millisecond: 100 * time.Millisecond,
	} {
		if got := sweepInterval(budget); got != want {
			t.Errorf("sweepInterval(%s) = %s, want %s", budget, got, want)
		}
	}
}

// recordsOf returns every record n's Jobs list holds for (origin, id),
// whatever its engine or run: one job run once is one record.
func recordsOf(n *node, origin, id string) []job {
	var out []job
	for _, j := range n.broker.snapshot() {
		if j.Origin == origin && j.ID == id {
			out = append(out, j)
		}
	}
	return out
}

// restart kills n's daemon and starts it again: its broker replays what
// PAIR's ReplayForNode(self, 60000) would, before the daemon's ready.
func restart(t *testing.T, c *cluster, n *node) {
	t.Helper()
	if err := c.kill(n); err != nil {
		t.Fatal(err)
	}
	if err := c.start(n); err != nil {
		t.Fatal(err)
	}
}

// noReaderStopped fails the test at once when a daemon's line stopped a
// broker's reader (over pairbroker.LineMax), rather than waiting for
// frames that will never be read.
func noReaderStopped(t *testing.T, c *cluster) {
	t.Helper()
	for _, n := range c.nodes {
		if why := n.broker.stopReason(); why != "" {
			t.Fatal(why)
		}
	}
}

// settledUpserts waits until n's broker has been handed no workloads:upsert
// of (origin, id) for quiet, running each check on every poll, and returns
// how many it was handed in all.
func settledUpserts(t *testing.T, n *node, origin, id string, quiet time.Duration, checks ...func()) int {
	t.Helper()
	last, lastChange := n.broker.upserts(origin, id), time.Now()
	eventually(t, fmt.Sprintf("%s to be handed %s no more", n.name, id), func() bool {
		for _, check := range checks {
			check()
		}
		if got := n.broker.upserts(origin, id); got != last {
			last, lastChange = got, time.Now()
		}
		return time.Since(lastChange) > quiet
	})
	return last
}

// A job that finished before its node's daemon restarted is replayed to
// the new daemon as workload:completed (it finished within 60 s): the
// peers see the same job, one record, its object unchanged, not a new run;
// the new daemon relays it and re-asserts it as a terminal, for two
// heartbeats, and then stops (a peer's broker gets each re-assertion:
// spec 3.3, they skip the dedup). A job removed before the restart is not
// replayed, and no node shows it again.
func TestARestartReplaysAFinishedJobAsTheSameRunAndNeverARemovedOne(t *testing.T) {
	t.Parallel()
	const resync = time.Second
	c := testCluster(t, 2, resync)
	n1, n2 := c.nodes[0], c.nodes[1]
	enter(t, n2, "done-job", "queued", 1)
	enter(t, n2, "done-job", "completed", 2)
	enter(t, n2, "gone-job", "running", 1)
	enter(t, n2, "gone-job", "completed", 2)
	eventually(t, "both jobs completed on both nodes", func() bool {
		return holds(c.nodes, n2.id, "done-job", "completed") && holds(c.nodes, n2.id, "gone-job", "completed")
	})
	n2.broker.localRemove("gone-job")
	eventually(t, "the removal to reach node 1", func() bool {
		_, ok := n1.broker.get(n2.id, "gone-job")
		return !ok
	})
	before, _ := n1.broker.get(n2.id, "done-job")
	upsertsAtRestart := settledUpserts(t, n1, n2.id, "done-job", 3*resync)

	restart(t, c, n2)
	enter(t, n2, "after-restart", "running", 1)
	eventually(t, "a job entered after the restart to reach node 1", func() bool {
		noReaderStopped(t, c)
		return holds(c.nodes, n2.id, "after-restart", "running")
	})
	// Until node 1 has been handed nothing more of the job for three
	// heartbeats, it must keep one record of it, as it was, and the
	// removed job must stay gone everywhere.
	last := settledUpserts(t, n1, n2.id, "done-job", 3*resync, func() {
		recs := recordsOf(n1, n2.id, "done-job")
		if len(recs) != 1 || recs[0].State != "completed" || string(recs[0].Info) != string(before.Info) {
			t.Fatalf("node 1 holds %+v after the restart's replay, want the one record it held before: %s", recs, before.Info)
		}
		for _, n := range c.nodes {
			if j, ok := n.broker.get(n2.id, "gone-job"); ok {
				t.Fatalf("%s shows the removed job again after the restart: %+v", n.name, j)
			}
		}
	})
	// One relay and the re-assertions of two heartbeats; a third pass is
	// allowed for where the heartbeat falls, and two more for deliveries
	// retried on a loaded machine (a re-assertion skips the dedup). A
	// daemon that took the replayed terminal for a live job, or for a new
	// run, would never settle, or would have changed the record, above.
	if more := last - upsertsAtRestart; more > 6 {
		t.Fatalf("node 1's broker was handed the replayed terminal %d more times, want one relay and the re-assertions of two heartbeats", more)
	}
}

// A workload whose frame is within --workload-max-bytes but over the line
// PAIR's broker reads (256 KiB), finished just before a restart, is in the
// restart's replay: no daemon may write it to a broker as one line, before
// the restart or after, or that broker stops reading its daemon for good
// (pairbroker.ReadLines), and the jobs after it never show.
func TestARestartNeverMakesADaemonWriteALineOverPAIRsReadLimit(t *testing.T) {
	t.Parallel()
	c := testClusterWith(t, 2, time.Second, false, func(c *cluster) {
		for _, n := range c.nodes {
			n.extraArgs = []string{"--workload-max-bytes", "1048576"}
		}
	})
	n1, n2 := c.nodes[0], c.nodes[1]
	_, raw := probe(n2, "huge-error", "failed", 1)
	var w map[string]any
	json.Unmarshal(raw, &w)
	w["error"] = strings.Repeat("e", 300<<10)
	raw, _ = json.Marshal(w)
	if err := n2.broker.local("workload:errored", raw); err != nil {
		t.Fatal(err)
	}
	enter(t, n2, "after-huge", "running", 1)
	eventually(t, "the job after the huge one to reach node 1", func() bool {
		noReaderStopped(t, c)
		return holds(c.nodes, n2.id, "after-huge", "running")
	})

	restart(t, c, n2)
	enter(t, n2, "after-restart", "running", 1)
	eventually(t, "a job entered after the restart to reach node 1", func() bool {
		noReaderStopped(t, c)
		return holds([]*node{n1}, n2.id, "after-restart", "running")
	})
	noReaderStopped(t, c)
}
