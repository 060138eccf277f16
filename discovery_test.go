package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/peersend"
	"nvpair-workload-manager/internal/wireframe"
)

func TestSelectTargetsKeepsOnlyPinnedReachablePeers(t *testing.T) {
	self, h1, h2 := devpki.NewUUID(), devpki.NewUUID(), devpki.NewUUID()
	p1, p2, unpinned := devpki.NewUUID(), devpki.NewUUID(), devpki.NewUUID()
	pinned := map[string]bool{p1: true, p2: true, self: true}
	wl := func(port any) map[string]any { return map[string]any{"wl": map[string]any{"port": port}} }
	entry := func(host, cluster, ip string, services map[string]any, addrs ...string) map[string]any {
		e := map[string]any{"hostUuid": host, "name": "n-" + host[:4], "clusterUuid": cluster, "trusted": true, "services": services}
		if ip != "" {
			e["ip"] = ip
		}
		if addrs != nil {
			e["ips"] = addrs
		}
		return e
	}
	// withAlias adds the addresses an earlier contract named the list by.
	withAlias := func(e map[string]any, addrs ...string) map[string]any {
		e["addresses"] = addrs
		return e
	}
	target := func(host, principal string, addrs ...string) string {
		return peersend.Target{HostUUID: host, Principal: principal, Addrs: addrs}.ID()
	}
	cases := []struct {
		name    string
		nodes   []map[string]any
		want    []string // peersend.Target ids
		skipLog string   // a debug line with this reason, "" for none
	}{
		{"a pinned peer with ip and port", []map[string]any{entry(h1, p1, "192.168.1.20", wl(14320))},
			[]string{target(h1, p1, "192.168.1.20:14320")}, ""},
		{"this node skipped by hostUuid", []map[string]any{entry(self, self, "192.168.1.10", wl(14320))}, nil, ""},
		{"this node skipped among others", []map[string]any{entry(self, p2, "192.168.1.10", wl(14320)), entry(h1, p1, "192.168.1.20", wl(14320))},
			[]string{target(h1, p1, "192.168.1.20:14320")}, ""},
		{"no services.wl", []map[string]any{entry(h1, p1, "192.168.1.20", map[string]any{"other": map[string]any{"port": 1}})}, nil, "no wl port"},
		{"wl without a port", []map[string]any{entry(h1, p1, "192.168.1.20", map[string]any{"wl": map[string]any{}})}, nil, "no wl port"},
		{"port 0", []map[string]any{entry(h1, p1, "192.168.1.20", wl(0))}, nil, "no wl port"},
		{"port 70000", []map[string]any{entry(h1, p1, "192.168.1.20", wl(70000))}, nil, "no wl port"},
		{"negative port", []map[string]any{entry(h1, p1, "192.168.1.20", wl(-1))}, nil, "no wl port"},
		{"ports 1 and 65535 are usable", []map[string]any{entry(h1, p1, "10.0.0.1", wl(1)), entry(h2, p2, "10.0.0.2", wl(65535))},
			[]string{target(h1, p1, "10.0.0.1:1"), target(h2, p2, "10.0.0.2:65535")}, ""},
		{"no pin for the clusterUuid", []map[string]any{entry(h1, unpinned, "192.168.1.20", wl(14320))}, nil, "no valid pin"},
		{"no clusterUuid", []map[string]any{entry(h1, "", "192.168.1.20", wl(14320))}, nil, "no valid pin"},
		{"a pinned hostUuid does not stand in for the clusterUuid", []map[string]any{entry(p1, unpinned, "192.168.1.20", wl(14320))}, nil, "no valid pin"},
		{"a hostUuid past the member id's bound", []map[string]any{entry(h1+strings.Repeat("x", wireframe.MaxKeyFieldBytes-len(h1)-len(p1)), p1, "192.168.1.20", wl(14320))}, nil, "past the member id's bound"},
		{"a hostUuid at the member id's bound", []map[string]any{entry(h1+strings.Repeat("x", wireframe.MaxKeyFieldBytes-1-len(h1)-len(p1)), p1, "192.168.1.20", wl(14320))},
			[]string{target(h1+strings.Repeat("x", wireframe.MaxKeyFieldBytes-1-len(h1)-len(p1)), p1, "192.168.1.20:14320")}, ""},
		{"no address", []map[string]any{entry(h1, p1, "", wl(14320))}, nil, "no usable address"},
		{"only unusable addresses", []map[string]any{entry(h1, p1, "gpu-box.local", wl(14320), "", "300.1.1.1", "not an ip")}, nil, "no usable address"},
		{"ip first, then ips, repeats removed, invalid skipped",
			[]map[string]any{entry(h1, p1, "192.168.1.20", wl(14320), "10.0.0.5", "192.168.1.20", "bogus", "fe80::1%eth0", "10.0.0.5")},
			[]string{target(h1, p1, "192.168.1.20:14320", "10.0.0.5:14320", "[fe80::1%eth0]:14320")}, ""},
		{"PAIR's multi-homed record: ips holds ip first", []map[string]any{entry(h1, p1, "169.254.10.2", wl(14320), "169.254.10.2", "192.168.1.20")},
			[]string{target(h1, p1, "169.254.10.2:14320", "192.168.1.20:14320")}, ""},
		{"ips alone when ip is missing", []map[string]any{entry(h1, p1, "", wl(14320), "10.0.0.5")},
			[]string{target(h1, p1, "10.0.0.5:14320")}, ""},
		{"an invalid ip falls back to ips", []map[string]any{entry(h1, p1, "bogus", wl(14320), "10.0.0.5")},
			[]string{target(h1, p1, "10.0.0.5:14320")}, ""},
		{"addresses, the earlier contract's name, is read after ips", []map[string]any{withAlias(entry(h1, p1, "192.168.1.20", wl(14320), "10.0.0.5"), "10.0.0.6", "10.0.0.5")},
			[]string{target(h1, p1, "192.168.1.20:14320", "10.0.0.5:14320", "10.0.0.6:14320")}, ""},
		{"addresses alone", []map[string]any{withAlias(entry(h1, p1, "", wl(14320)), "10.0.0.6")},
			[]string{target(h1, p1, "10.0.0.6:14320")}, ""},
		{"IPv6 loopback comes out bracketed", []map[string]any{entry(h1, p1, "::1", wl(14321))},
			[]string{target(h1, p1, "[::1]:14321")}, ""},
		{"IPv6 with a zone comes out bracketed with its zone", []map[string]any{entry(h1, p1, "fe80::1%eth0", wl(14320))},
			[]string{target(h1, p1, "[fe80::1%eth0]:14320")}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw, err := json.Marshal(map[string]any{"nodes": c.nodes})
			testkit.Must(t, err)
			nodes, err := parseDiscovery(raw)
			testkit.Must(t, err)
			logs := &testkit.LogBuffer{}
			targets := selectTargets(nodes, self, func(p string) bool { return pinned[p] }, netLogger(logs))
			var got []string
			for _, tg := range targets {
				got = append(got, tg.ID())
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("targets\n got %q\nwant %q", got, c.want)
			}
			if c.skipLog != "" && !logs.Contains("level=DEBUG", "not a target", c.skipLog) {
				t.Fatalf("no debug line for the skipped node with reason %q; logs:\n%s", c.skipLog, logs)
			}
		})
	}
}

func TestPeerAtIPv6LoopbackReceivesFrames(t *testing.T) {
	netRequireIPv6Loopback(t)
	a, b := newTestNode(t), newTestNode(t, func(c *Config) { c.PeerAddr = "[::1]:0" })
	a.trust(b)
	b.trust(a)
	a.start()
	b.start()
	netDiscover(a, netNodeEntry(b, "::1"))
	a.waitTargets(1)
	a.sendLifecycle(testframe.Workload("job-v6", "running", a.id))
	testkit.Eventually(t, "job-v6 at B over IPv6", func() bool { return netUpsertIDs(b)["job-v6"] == 1 })
}

func TestPeerAtZonedIPv6AddressReceivesFrames(t *testing.T) {
	netRequireIPv6Loopback(t)
	lo := netLoopbackInterface(t)
	a, b := newTestNode(t), newTestNode(t, func(c *Config) { c.PeerAddr = "[::1]:0" })
	a.trust(b)
	b.trust(a)
	a.start()
	b.start()
	// The first address carries a zone, as a link-local one does.
	netDiscover(a, netNodeEntry(b, "::1%"+lo))
	a.waitTargets(1)
	a.sendLifecycle(testframe.Workload("job-zone", "running", a.id))
	testkit.Eventually(t, "job-zone at B over a zoned IPv6 address", func() bool { return netUpsertIDs(b)["job-zone"] == 1 })
}

func TestDiscoverySnapshotReplacesTargetSet(t *testing.T) {
	a, b, c := newTestNode(t), newTestNode(t), newTestNode(t)
	mesh(t, a, b, c)
	a.sendLifecycle(testframe.Workload("job-1", "running", a.id))
	testkit.Eventually(t, "job-1 at B and C", func() bool { return netUpsertIDs(b)["job-1"] == 1 && netUpsertIDs(c)["job-1"] == 1 })

	a.discover(c) // B is absent from the next snapshot
	a.waitTargets(1)
	a.sendLifecycle(testframe.Workload("job-2", "running", a.id))
	a.sendLifecycle(testframe.Workload("job-3", "running", a.id))
	testkit.Eventually(t, "job-2 and job-3 at C", func() bool { ids := netUpsertIDs(c); return ids["job-2"] == 1 && ids["job-3"] == 1 })
	if ids := netUpsertIDs(b); ids["job-2"] != 0 || ids["job-3"] != 0 {
		t.Fatalf("B, absent from the snapshot, still received frames: %v", ids)
	}
}

func TestDiscoveryLogsEveryTargetSetChange(t *testing.T) {
	a, b, c := newTestNode(t), newTestNode(t), newTestNode(t)
	a.trust(b, c)
	a.start()
	b.start()
	c.start()
	name := func(n *testNode) string { return fmt.Sprintf("node-%s@127.0.0.1:%d", n.id[:8], n.peerPort()) }
	steps := []struct {
		snapshot []*testNode
		line     []string // fragments of the change line
	}{
		{[]*testNode{b}, []string{"added=[" + name(b) + "]", "removed=[]", "total=1"}},
		{[]*testNode{c}, []string{"added=[" + name(c) + "]", "removed=[" + name(b) + "]", "total=1"}},
		{[]*testNode{b, c}, []string{"added=[" + name(b) + "]", "removed=[]", "total=2"}},
		{[]*testNode{c, b}, nil}, // the same set: no line
		{nil, []string{"added=[]", `removed="[`, "total=0"}},
	}
	for i, s := range steps {
		before := strings.Count(a.logs.String(), "broadcast targets changed")
		a.discover(s.snapshot...)
		netBarrier(t, a)
		after := strings.Count(a.logs.String(), "broadcast targets changed")
		if s.line == nil {
			if after != before {
				t.Fatalf("step %d: an unchanged target set was logged as a change", i)
			}
			continue
		}
		// At info: the default level shows every change to an operator.
		if after != before+1 || !a.logs.Contains(append([]string{"level=INFO", "broadcast targets changed"}, s.line...)...) {
			t.Fatalf("step %d: no change line with %q; logs:\n%s", i, s.line, a.logs)
		}
	}
}

func TestNewTargetIsBackfilledWithTheResyncSet(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	a.trust(b)
	b.trust(a)
	a.start()
	b.start()
	// Before B is discovered: a live workload, a finished one and a removed one.
	a.sendLifecycle(testframe.Workload("job-live", "running", a.id))
	a.sendLifecycle(testframe.Workload("job-done", "completed", a.id))
	a.sendLifecycle(testframe.Workload("job-gone", "running", a.id))
	a.sendRemove("job-gone")
	netBarrier(t, a)

	a.discover(b)
	a.waitTargets(1)
	// The backfill is B's catch-up from the start of the table: a frame
	// committed after it comes after it in version order, so once that
	// frame is at B's broker the whole backfill is.
	a.sendLifecycle(testframe.Workload("job-next", "running", a.id))
	testkit.Eventually(t, "job-next at B", func() bool { return netUpsertIDs(b)["job-next"] == 1 })
	ids := netUpsertIDs(b)
	if ids["job-live"] != 1 || ids["job-done"] != 1 {
		t.Fatalf("B was not backfilled with the re-sync set: %v", ids)
	}
	if ids["job-gone"] != 0 {
		t.Fatalf("a removed workload was backfilled: %v", ids)
	}
}

func TestPinArrivingAfterSnapshotMakesNodeATarget(t *testing.T) {
	waitsOutRealTime(t, "the trust reload (1 s)")
	a, b := newTestNode(t), newTestNode(t)
	b.trust(a)
	a.start()
	b.start()
	a.discover(b)
	netBarrier(t, a)
	if got := a.m.bcast.TargetCount(); got != 0 {
		t.Fatalf("an unpinned node is a target (%d targets)", got)
	}

	a.trust(b) // the cluster manager pins B after the snapshot
	netWithin(t, 2*time.Second, "the newly pinned node to become a target", func() bool { return a.m.bcast.TargetCount() == 1 })
	a.sendLifecycle(testframe.Workload("job-1", "running", a.id))
	// The backfill of the new target runs beside this frame and may carry
	// it a second time, as a re-assertion.
	testkit.Eventually(t, "job-1 at B", func() bool { return netUpsertIDs(b)["job-1"] >= 1 })

	testkit.Must(t, os.Remove(filepath.Join(a.clusterDir, "trusted", b.id+".json")))
	a.waitTargets(0)
}

// ---- helpers (net helper) ----

// netNodeEntry is n's discovery entry at the given ip.
func netNodeEntry(n *testNode, ip string) map[string]any {
	return map[string]any{
		"hostUuid": n.id, "name": "node-" + n.id[:8], "ip": ip, "clusterUuid": n.id, "trusted": true,
		"services": map[string]any{"wl": map[string]any{"port": n.peerPort()}},
	}
}

// netDiscover sends n a discovery snapshot of the given entries.
func netDiscover(n *testNode, entries ...map[string]any) {
	if entries == nil {
		entries = []map[string]any{}
	}
	n.broker.sendFrame("discovery:nodes", map[string]any{"nodes": entries})
}

func netRequireIPv6Loopback(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback on this host: %v", err)
	}
	ln.Close()
}

func netLoopbackInterface(t testing.TB) string {
	t.Helper()
	ifs, err := net.Interfaces()
	testkit.Must(t, err)
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 && i.Flags&net.FlagUp != 0 {
			return i.Name
		}
	}
	t.Skip("no loopback interface")
	return ""
}
