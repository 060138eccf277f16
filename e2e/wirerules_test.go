package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// Upstream's wire rules against the real binary (issue 21, spec 3.2, 3.3
// and 4): what a stock peer and its broker send is taken and relayed as it
// came, and a multi-homed peer is reached at the address that answers.

// discoverEntry sends d a discovery snapshot of one entry for node at
// port, with the given hostUuid, ip and ips.
func (d *daemonProc) discoverEntry(node devpki.Node, hostUUID string, port int, ip string, ips ...string) {
	d.t.Helper()
	e := map[string]any{
		"hostUuid": hostUUID, "name": "node-" + node.ID[:8], "ip": ip,
		"clusterUuid": node.ID, "trusted": true,
		"services": map[string]any{"wl": map[string]any{"port": port}},
	}
	if ips != nil {
		e["ips"] = ips
	}
	p, err := json.Marshal(map[string]any{"nodes": []map[string]any{e}})
	if err != nil {
		d.t.Fatal(err)
	}
	d.send(string(wireframe.EncodeNotification("discovery:nodes", p)))
}

// removalParams returns the params of every workloads:remove d's broker
// got, as their text.
func (d *daemonProc) removalParams() []string {
	var out []string
	for _, f := range d.WithMethod(wireframe.MethodRemove) {
		out = append(out, string(f.Params))
	}
	return out
}

// A frame whose createdAt and seq are null, and a removal that names no
// origin, from A's broker (stdin) reach B's broker through B's peer port as
// they came, byte for byte: B's broker is written the very workload object,
// and the removal as {"workloadId":...}. A pinned peer's own frames of the
// same kinds, posted straight to A, reach A's broker as they came too.
func TestProcessNullCreatedAtAndAnOriginLessRemovalAreRelayedAsTheyCame(t *testing.T) {
	nodes := writeCluster(t, 2)
	na, nb := nodes[0], nodes[1]
	a, b := startPair(t, na, nb)

	info := `{"id":"null-times","model":"m","engine":"e","state":"running","originatedFrom":"` + na.ID +
		`","runId":"r1","seq":null,"createdAt":null,"startedAt":null,"completedAt":null,"error":null}`
	a.send(`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":` + info + `}}`)
	b.WaitUpserts("null-times", 1)
	if got := b.WithMethod(wireframe.MethodUpsert)[0].Params; string(got) != `{"workloadInfo":`+info+`}` {
		t.Fatalf("B's broker got %s, want the workload object as A's broker sent it:\n%s", got, info)
	}
	a.send(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"null-times"}}`)
	testkit.Eventually(t, "the origin-less removal at B", func() bool { return len(b.removalParams()) == 1 })
	if got := b.removalParams(); got[0] != `{"workloadId":"null-times"}` {
		t.Fatalf("B's broker got removal %s, want {\"workloadId\":\"null-times\"}", got[0])
	}

	// Straight from a pinned peer (B's key) to A's peer port.
	peer := testkit.PeerClient(t, &nb.Identity, na.Identity.DER)
	aPeer := "127.0.0.1:" + itoa(a.port)
	peerInfo := `{"id":"from-peer","model":"m","engine":"e","state":"queued","originatedFrom":"` + nb.ID + `","createdAt":null,"seq":null}`
	for _, body := range []string{
		`{"jsonrpc":"2.0","method":"workload:submitted","params":{"workloadInfo":` + peerInfo + `}}`,
		`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"from-peer"}}`,
		`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"from-peer"}}`, // a retry: already seen
	} {
		if st, text := netPostAnswer(t, peer, aPeer, []byte(body)); st != http.StatusOK {
			t.Fatalf("POST %s = %d %q, want 200", body, st, text)
		}
	}
	a.WaitUpserts("from-peer", 1)
	if got := a.WithMethod(wireframe.MethodUpsert)[0].Params; string(got) != `{"workloadInfo":`+peerInfo+`}` {
		t.Fatalf("A's broker got %s, want the peer's workload object as it came:\n%s", got, peerInfo)
	}
	testkit.Eventually(t, "the peer's origin-less removal at A", func() bool { return len(a.removalParams()) == 1 })
	if testkit.HoldsWithin(testkit.WaitTimeout/20, func() bool { return len(a.removalParams()) > 1 }) {
		t.Fatalf("A's broker got the removal twice: %v", a.removalParams())
	}
	if got := a.removalParams(); got[0] != `{"workloadId":"from-peer"}` {
		t.Fatalf("A's broker got removal %s, want {\"workloadId\":\"from-peer\"}", got[0])
	}
}

// PAIR's discovery entry of a multi-homed node carries ip and ips, ip
// first. Here B's ip is an address nothing answers on (TEST-NET-1, never
// routed: refused or timed out), and its ips hold that address and then
// the one B listens on: A delivers to B at the second.
func TestProcessAMultiHomedPeerWhoseIPRefusesIsDeliveredToAtItsNextAddress(t *testing.T) {
	nodes := writeCluster(t, 2)
	na, nb := nodes[0], nodes[1]
	a, b := startNode(t, na), startNode(t, nb)
	a.WaitMethod("discovery:subscribe", 1)
	b.WaitMethod("discovery:subscribe", 1)
	const unreachable = "192.0.2.1"
	a.discoverEntry(nb, nb.ID, b.port, unreachable, unreachable, "127.0.0.1")
	a.waitLog("broadcast targets changed", "total=1")

	a.send(testframe.LifecycleLine("multi-homed", "running", na.ID))
	b.WaitUpserts("multi-homed", 1)
}

// On a fresh PAIR host the scanner advertises the node id it minted before
// the cluster manager wrote the node's identity, until the broker has it
// re-read that identity (upstream broker spec 7.8, convergeScannerIdentity);
// the frames meanwhile carry the identity's id, the certificate's
// principal. A's discovery lists B's principal for the minted id: B's
// frames in its principal's name still reach A's broker, and a frame in
// another member's name is still refused.
func TestProcessAPeerInItsFreshHostWindowIsHeardUnderItsPrincipal(t *testing.T) {
	nodes := writeCluster(t, 3)
	na, nb, nc := nodes[0], nodes[1], nodes[2]
	a, b := startNode(t, na), startNode(t, nb)
	a.WaitMethod("discovery:subscribe", 1)
	b.WaitMethod("discovery:subscribe", 1)
	minted := devpki.NewUUID()
	a.discoverEntry(nb, minted, b.port, "127.0.0.1")
	b.discover(na, a.port)
	a.waitLog("broadcast targets changed", "total=1")
	b.waitLog("broadcast targets changed", "total=1")

	b.send(testframe.LifecycleLine("fresh-host-job", "running", nb.ID))
	a.WaitUpserts("fresh-host-job", 1)
	b.send(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"fresh-host-job","originatedFrom":"` + nb.ID + `"}}`)
	testkit.Eventually(t, "B's removal at A", func() bool { return len(a.removalParams()) == 1 })

	peer := testkit.PeerClient(t, &nb.Identity, na.Identity.DER)
	st, text := netPostAnswer(t, peer, "127.0.0.1:"+itoa(a.port), testframe.Lifecycle(testframe.Workload("c-job", "running", nc.ID), nil))
	if !isOriginRefusal(st, text) || !strings.Contains(text, nc.ID) {
		t.Fatalf("a frame in C's name from B's principal = %d %q, want 403 for origin", st, text)
	}
	if a.UpsertCount("c-job") != 0 {
		t.Fatal("a frame in C's name reached A's broker")
	}
}
