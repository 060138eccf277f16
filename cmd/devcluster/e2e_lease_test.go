package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// leaseExpiredOnEveryNode reports whether every node holds the job (origin,
// id) failed by its lease, and returns its error text.
func leaseExpiredOnEveryNode(c *cluster, origin, id string) (string, bool) {
	var text string
	for _, n := range c.nodes {
		j, ok := n.broker.get(origin, id)
		if !ok || j.State != "failed" {
			return "", false
		}
		var w struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(j.Info, &w) != nil || !strings.HasPrefix(w.Error, "producer stopped reporting: lease of ") {
			return "", false
		}
		text = w.Error
	}
	return text, true
}

// The simulated producer on node 1's ingress crashes now and then on a job
// it leased; node 1's daemon retires the job when its lease runs out, and
// every node's Jobs list shows it failed, with the lease's error.
func TestDevclusterSimulatedProducerCrashShowsALeasedJobExpireOnEveryNode(t *testing.T) {
	t.Parallel()
	c := testCluster(t, 3, time.Second)
	sim := newSimulator(c)
	sim.crashShare = 0.5 // crash often, so the test sees one soon
	sim.start()
	t.Cleanup(sim.stop)
	var expired, text string
	eventually(t, "a job the producer crashed on to be failed by its lease on every node", func() bool {
		for _, j := range c.nodes[0].broker.snapshot() {
			if tx, ok := leaseExpiredOnEveryNode(c, c.nodes[0].id, j.ID); ok {
				expired, text = j.ID, tx
				return true
			}
		}
		return false
	})
	t.Logf("%s: %s, on all three nodes", expired, text)
	if text != "producer stopped reporting: lease of 5 s expired" {
		t.Fatalf("the expiry says %q", text)
	}
	eventually(t, "the simulated producer to learn of the expiry from the read-back", func() bool {
		sim.stats.mu.Lock()
		defer sim.stats.mu.Unlock()
		return sim.stats.leases.expired > 0
	})
}

// The example producer, told to abandon its job, leaves it running; its
// lease retires it on every node.
func TestProducerExampleThatAbandonsItsJobSeesItFailedOnEveryNodeWhenItsLeaseRunsOut(t *testing.T) {
	t.Parallel()
	producer := buildProducerExample(t)
	c := testCluster(t, 3, time.Second)
	out, err := exec.Command(producer, "--addr", c.nodes[0].ingressAddr(), "--id", "abandoned-job", "--lease", "5s", "--abandon").CombinedOutput()
	if err != nil {
		t.Fatalf("the producer failed against node 1's ingress: %v\n%s", err, out)
	}
	eventually(t, "the job to show running on every node", func() bool {
		return holds(c.nodes, c.nodes[0].id, "abandoned-job", "running") || holds(c.nodes, c.nodes[0].id, "abandoned-job", "failed")
	})
	eventually(t, "the abandoned job to be failed by its lease on every node", func() bool {
		_, ok := leaseExpiredOnEveryNode(c, c.nodes[0].id, "abandoned-job")
		return ok
	})
}
