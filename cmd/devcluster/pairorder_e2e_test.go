package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// postIngress sends one frame to node 1's ingress as a producer would and
// fails the test unless it is accepted.
func postIngress(t *testing.T, c *cluster, method string, info map[string]any) {
	t.Helper()
	params, _ := json.Marshal(map[string]any{"workloadInfo": info})
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": json.RawMessage(params)})
	req, _ := http.NewRequest(http.MethodPost, "http://"+c.nodes[0].ingressAddr()+"/v1/workloads/events", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", method, resp.Status)
	}
}

// A producer that posts each frame on its own goroutine can have a job's
// terminal frame accepted before its queued one. PAIR's broker keeps the
// terminal whatever the order (workloadstore rank and seq rules), so every
// node's Jobs list must end with the job completed, and the dev cluster's
// verdict must say so.
func TestDevclusterOutOfOrderProducerConvergesOnTheTerminalState(t *testing.T) {
	t.Parallel()
	const resync = time.Second
	c := testCluster(t, 3, resync)
	now := time.Now().UnixMilli()
	base := map[string]any{"id": "ooo-1", "model": "m", "engine": "e", "runId": "r-ooo", "createdAt": now, "requesterId": "ooo"}
	done := map[string]any{"state": "completed", "seq": 3, "startedAt": now, "completedAt": now}
	queued := map[string]any{"state": "queued", "seq": 1}
	for k, v := range base {
		done[k], queued[k] = v, v
	}
	postIngress(t, c, "workload:completed", done)
	postIngress(t, c, "workload:submitted", queued)
	ok, why := awaitConvergence(c, 3*resync+3*time.Second, nil)
	var states []string
	for _, n := range c.nodes {
		j, _ := n.broker.get(c.nodes[0].id, "ooo-1")
		states = append(states, n.name+"="+j.State)
	}
	t.Logf("verdict: converged=%v %s; states %v", ok, why, states)
	if !ok {
		t.Fatalf("converged: no (%s)", why)
	}
	if !holds(c.nodes, c.nodes[0].id, "ooo-1", "completed") {
		t.Fatalf("states %v, want completed on every node", states)
	}
	// The heartbeat re-asserts the terminal to the peers (a last-write
	// store had node 1 queued and its peers completed from then on): the
	// views must still agree after it.
	time.Sleep(5 * resync / 2)
	if ok, why := awaitConvergence(c, 3*resync+3*time.Second, nil); !ok || !holds(c.nodes, c.nodes[0].id, "ooo-1", "completed") {
		t.Fatalf("after two heartbeats: converged %v (%s)", ok, why)
	}
}

// The brokers go on sweeping while the verdict is awaited: a job its origin
// stopped re-asserting is failed at the other brokers, as PAIR's would
// show it, and the views do not agree.
func TestTheConvergenceVerdictSeesTheStalenessSweep(t *testing.T) {
	c := paperCluster(t, 2)
	const budget = 200 * time.Millisecond
	c.cfg.staleAfter = budget
	for _, n := range c.nodes {
		n.broker.staleAfter = budget
	}
	n1 := c.nodes[0]
	for _, n := range c.nodes {
		n.broker.handle(upsertLine(info(n1.id, "silent", "running", 1)), nil, nil)
	}
	time.Sleep(budget + 50*time.Millisecond) // node 1's job is now past the budget at node 2
	ok, why := awaitConvergence(c, 500*time.Millisecond, nil)
	if ok || !strings.Contains(why, "silent failed") {
		t.Fatalf("verdict %v %q, want node 2 to show node 1's silent job failed", ok, why)
	}
}
