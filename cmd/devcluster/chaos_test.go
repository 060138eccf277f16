package main

import (
	"strings"
	"testing"
	"time"
)

// A node cut off for longer than the staleness budget: each side's brokers
// fail the other side's live jobs as not re-asserted; once it is back the
// heartbeats re-assert them and the guesses are undone.
func TestACutOffNodesLiveJobsAreSweptAndComeBack(t *testing.T) {
	t.Parallel()
	const resync = 500 * time.Millisecond
	c := testClusterWith(t, 3, resync, false, func(c *cluster) {
		c.cfg.staleAfter = 4 * resync
		var err error
		if c.links, err = newLinkNet(c, c.nodes[2]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.links.close)
		for _, n := range c.nodes {
			n.broker.staleAfter = c.cfg.staleAfter
		}
	})
	n1, n3 := c.nodes[0], c.nodes[2]
	enter(t, n3, "cut-probe", "running", 1)
	enter(t, n1, "n1-probe", "running", 1)
	eventually(t, "both probes running everywhere", func() bool {
		return holds(c.nodes, n3.id, "cut-probe", "running") && holds(c.nodes, n1.id, "n1-probe", "running")
	})
	c.links.setCut(n3, true)
	eventually(t, "each side to fail the other's probe as not re-asserted", func() bool {
		c.sweep()
		return holds(c.nodes[:2], n3.id, "cut-probe", "failed") && holds([]*node{n3}, n1.id, "n1-probe", "failed")
	})
	if j, _ := n1.broker.get(n3.id, "cut-probe"); !j.Inferred {
		t.Fatalf("the probe's failure is not marked inferred: %+v", j)
	}
	if !holds([]*node{n3}, n3.id, "cut-probe", "running") {
		t.Fatal("the cut node's own broker failed its own job")
	}
	c.links.setCut(n3, false)
	eventually(t, "the heartbeats to undo every guess", func() bool {
		c.sweep()
		return holds(c.nodes, n3.id, "cut-probe", "running") && holds(c.nodes, n1.id, "n1-probe", "running")
	})
}

// Slowed answers delay deliveries to a node but lose nothing.
func TestASlowedNodeStillGetsEveryFrame(t *testing.T) {
	t.Parallel()
	c := testClusterWith(t, 2, time.Second, false, func(c *cluster) {
		var err error
		if c.links, err = newLinkNet(c, c.nodes[1]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.links.close)
	})
	c.links.setSlow(c.nodes[1], 200*time.Millisecond)
	enter(t, c.nodes[0], "slow-probe", "queued", 1)
	enter(t, c.nodes[0], "slow-probe", "running", 2)
	eventually(t, "the probe to reach the slowed node", func() bool {
		return holds(c.nodes, c.nodes[0].id, "slow-probe", "running")
	})
}

func TestParseFlagsChaosNeedsSimulateAndTime(t *testing.T) {
	for _, args := range [][]string{{"--chaos"}, {"--chaos", "--simulate", "--nodes", "1"}, {"--chaos", "--simulate", "--duration", "10s"}} {
		if _, err := parseFlags(args, &lockedBuffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
	c, err := parseFlags([]string{"--chaos", "--simulate", "--duration", "60s"}, &lockedBuffer{})
	if err != nil || c.staleAfter != 5*c.resyncInterval {
		t.Fatalf("--chaos without --stale-after: %+v %v, want a budget of 5 heartbeats", c, err)
	}
	if c, _ := parseFlags([]string{"--chaos", "--simulate", "--stale-after", "20s"}, &lockedBuffer{}); c.staleAfter != 20*time.Second {
		t.Errorf("a given --stale-after was overridden: %s", c.staleAfter)
	}
}

// The whole chaos run, at a test's pace: it logs each fault, ends
// converged and with every job as its path last meant.
func TestDevclusterChaosRunConvergesWithEveryJobAsMeant(t *testing.T) {
	needsDaemons(t) // runs the dev cluster on daemonBin
	t.Parallel()
	var stdout, stderr lockedBuffer
	var c *cluster
	code := run([]string{"--bin", daemonBin, "--simulate", "--chaos", "--duration", "30s", "--ingress", "127.0.0.1:0",
		"--resync-interval", "500ms", "--stale-after", "3s"},
		&stdout, &stderr, nil, false, hooks{created: func(x *cluster) { c = x }})
	out, notes := stdout.String(), stderr.String()
	if code != 0 || !strings.Contains(out, "converged: yes") || !strings.Contains(out, "as meant: yes") {
		t.Fatalf("exit %d\nstdout tail:\n%s\nstderr:\n%s", code, tail(out, 20), notes)
	}
	// PAIR's own store agreed with every broker through every fault.
	if shadowBin != "" && !strings.Contains(out, "as PAIR's broker: yes") {
		t.Fatalf("the run was not judged by PAIR's store, or it disagreed:\n%s", tail(out, 20))
	}
	for _, want := range []string{"chaos: restarting node2's daemon", "broker replayed", "chaos: killing node1's producer mid-job",
		"node1 retired ing-", "chaos: cutting node3 off", "not re-asserted for 3s", "chaos: node3 is back", "chaos: slowing node3's answers"} {
		if !strings.Contains(notes, want) {
			t.Errorf("the notes lack %q:\n%s", want, notes)
		}
	}
	assertExited(t, c.allPIDs())
}

// Only the links with a faulted end are relayed: the others are listed at
// the daemon's own port, so the relays' descriptors grow with the nodes,
// not their pairs.
func TestChaosRelaysOnlyTheFaultedNodesLinks(t *testing.T) {
	c := paperCluster(t, 4)
	n1, n2, n4 := c.nodes[0], c.nodes[1], c.nodes[3]
	l, err := newLinkNet(c, n4, n4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	if len(l.links) != 6 {
		t.Errorf("%d links relayed, want the 6 to and from the faulted node", len(l.links))
	}
	if got := l.port(n1, n2, 4242); got != 4242 {
		t.Errorf("n1 -> n2 listed at %d, want the direct port", got)
	}
	if got := l.port(n1, n4, 4242); got == 4242 || got == 0 {
		t.Errorf("n1 -> n4 listed at %d, want its relay's port", got)
	}
}

// A --chaos run holds a relay per ordered pair of nodes with a faulted
// end: one whose descriptors would run out midway is refused at once, in
// one line.
func TestChaosRefusesTooFewFileDescriptorsInOneLine(t *testing.T) {
	if err := checkChaosFDs(128, chaosFDsNeeded(128), true); err != nil {
		t.Errorf("exactly enough refused: %v", err)
	}
	if err := checkChaosFDs(128, 256, false); err != nil {
		t.Errorf("an unknown limit refused: %v", err)
	}
	err := checkChaosFDs(128, 1024, true)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "--nodes 128") || !strings.Contains(err.Error(), "the limit is 1024") {
		t.Errorf("checkChaosFDs(128, 1024) = %v, want one line naming --nodes 128 and the limit", err)
	}
	if n := chaosFDsNeeded(128); n > 10000 {
		t.Errorf("128 nodes need %d descriptors: the relays must grow with the nodes, not their pairs", n)
	}
}
