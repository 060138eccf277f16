//go:build linux

package e2e

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// discoverAll sends d one discovery snapshot listing every node of nodes
// at its port in ports, all at 127.0.0.1.
func (d *daemonProc) discoverAll(nodes []devpki.Node, ports []int) {
	d.t.Helper()
	var entries []map[string]any
	for i, n := range nodes {
		entries = append(entries, map[string]any{
			"hostUuid": n.ID, "name": "node-" + n.ID[:8], "ip": "127.0.0.1",
			"clusterUuid": n.ID, "trusted": true,
			"services": map[string]any{"wl": map[string]any{"port": ports[i]}},
		})
	}
	p, err := json.Marshal(map[string]any{"nodes": entries})
	if err != nil {
		d.t.Fatal(err)
	}
	d.send(string(wireframe.EncodeNotification("discovery:nodes", p)))
}

// Every peer of a cluster on one machine connects from 127.0.0.1: three
// pinned members behind it, each within a per-source cap of 2, all reach
// the node, though together they hold more than 2 connections; a flood
// from an address that fronts no member is still held to 2, and logged
// once (spec 3.7).
func TestPinnedMembersBehindOneAddressAllConnectPastThePerSourceFlag(t *testing.T) {
	const perSource = 2
	nodes := writeCluster(t, 4)
	a := startNode(t, nodes[0], "--metrics", "127.0.0.1:0", "--peer-max-conns-per-source", itoa(perSource))
	metrics := a.loggedValue("metrics endpoint listening", "addr")
	peers := []*daemonProc{startNode(t, nodes[1]), startNode(t, nodes[2]), startNode(t, nodes[3])}
	a.discoverAll(nodes[1:], []int{peers[0].port, peers[1].port, peers[2].port})
	a.waitLog("broadcast targets changed", "total=3")
	for _, p := range peers {
		p.discover(nodes[0], a.port)
		p.waitLog("broadcast targets changed", "total=1")
	}
	// Each peer holds its connection to a, idle between its frames: 3
	// connections from one address, over the flag's 2.
	for i, p := range peers {
		id := "from-peer-" + itoa(i+1)
		p.send(testframe.LifecycleLine(id, "running", nodes[i+1].ID))
		a.WaitUpserts(id, 1)
	}
	for i, p := range peers {
		id := "again-from-peer-" + itoa(i+1)
		p.send(testframe.LifecycleLine(id, "running", nodes[i+1].ID))
		a.WaitUpserts(id, 1)
	}
	if n := testkit.ScrapeValue(t, metrics, `nvpair_wlm_connections_refused_total{listener="peer",reason="per_source"}`); n != 0 {
		t.Fatalf("%v connections of three pinned members behind one address refused, want 0", n)
	}
	if n := testkit.ScrapeValue(t, metrics, `nvpair_wlm_connections_per_source_limit_max{listener="peer"}`); n != 3*perSource {
		t.Fatalf("highest per-source cap %v, want %d (3 members x %d)", n, 3*perSource, perSource)
	}

	// A flood from an address no member is discovered at.
	peerAddr := net.JoinHostPort("127.0.0.1", itoa(a.port))
	flood(t, peerAddr, 10, "127.0.0.9")
	testkit.Eventually(t, "the flood past the flag refused", func() bool {
		return testkit.ScrapeValue(t, metrics, `nvpair_wlm_connections_refused_total{listener="peer",reason="per_source"}`) >= 10-perSource
	})
	a.waitLog("level=WARN", "connection refused over its source's cap", "source=127.0.0.9", "cap="+itoa(perSource))
	if n := strings.Count(a.stderr.String(), `level=WARN msg="connection refused over its source's cap`); n != 1 {
		t.Fatalf("%d refusal warnings for one source's flood, want 1 (rate-limited; the rest at debug)", n)
	}
}
