package main

import (
	"net"
	"os"
	"testing"
)

// The stock upstream workload manager as a peer, when a binary of it is
// given in NVPAIR_STOCK_WLM (build it from its published source; see the
// README's contributor notes): frames relayed both ways over the pinned
// protocols (3.7). Skipped without it: the stock source is not part of
// this repository.
func TestProcessStockPeerInteroperatesBothWays(t *testing.T) {
	stock := os.Getenv("NVPAIR_STOCK_WLM")
	if stock == "" {
		t.Skip("NVPAIR_STOCK_WLM is not set to a stock workload manager binary")
	}
	nodes := writeCluster(t, 2)
	ours := startNode(t, nodes[0])
	port := freePort(t)
	theirs := startDaemonBinary(t, stock, nil, "--cluster-dir", nodes[1].ClusterDir, "--port", itoa(port), "--log-level", "debug")
	ours.waitMethod("discovery:subscribe", 1)
	theirs.waitMethod("ready", 1)
	ours.discover(nodes[1], port)
	theirs.discover(nodes[0], ours.port)
	ours.waitLog("broadcast targets changed", "total=1")

	ours.send(lifecycleLine("to-stock", "running", nodes[0].ID))
	theirs.waitUpserts("to-stock", 1)
	// The stock daemon applies discovery on a 5 s tick: the first frames
	// it sends may go nowhere, so it is asked again until one arrives.
	eventually(t, "a frame from the stock peer", func() bool {
		theirs.send(lifecycleLine("from-stock", "running", nodes[1].ID))
		return holdsWithin(waitTimeout/10, func() bool { return ours.upsertCount("from-stock") > 0 })
	})
}

// freePort is a TCP port free on loopback now, for a binary that cannot
// bind port 0 and say what it bound.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	netMust(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
