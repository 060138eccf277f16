package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
)

func TestUnclusteredNodeCompletesNoHandshakeUntilAdmittedWithoutRestart(t *testing.T) {
	waitsOutRealTime(t, "the trust reload (1 s)")
	a, b := newTestNode(t), newTestNode(t)
	testkit.Must(t, os.Remove(filepath.Join(a.clusterDir, admissionFileName))) // a keypair, no admission, no pin
	b.trust(a)
	a.start()
	b.start()
	addr := a.m.PeerAddr().String()

	if err := testkit.Handshake(addr, &b.ident); err == nil {
		t.Fatal("a node with a keypair but no admission or pin completed a handshake")
	}
	if !a.logs.Contains("level=INFO", "cluster membership", "clustered=false") {
		t.Fatalf("the node did not say at startup that it is not clustered; logs:\n%s", a.logs)
	}
	a.sendLifecycle(testframe.Workload("job-unclustered", "running", a.id))
	a.discover(b)
	netBarrier(t, a)
	if got := a.m.bcast.TargetCount(); got != 0 {
		t.Fatalf("an unclustered node has %d broadcast target(s), want 0", got)
	}

	testkit.Must(t, devpki.WriteAdmission(a.clusterDir, "test-cluster", 1))
	testkit.Eventually(t, "a handshake once admission.json appears", func() bool { return testkit.Handshake(addr, &b.ident) == nil })
	if !a.logs.Contains("level=INFO", "cluster membership changed", "clustered=true") {
		t.Fatalf("the transition to clustered was not logged; logs:\n%s", a.logs)
	}
	// B is pinned by neither file in A's trusted/, so A does not target it;
	// A pinning B makes the target, and the backfill delivers the workload
	// tracked while A was unclustered.
	a.trust(b)
	a.waitTargets(1)
	testkit.Eventually(t, "job-unclustered at B", func() bool { return netUpsertIDs(b)["job-unclustered"] >= 1 })
}

func TestClearedAdmissionDemotesAMember(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	b.trust(a)
	a.start()
	b.start()
	addr := a.m.PeerAddr().String()
	if err := testkit.Handshake(addr, &b.ident); err != nil {
		t.Fatalf("an admitted member refused a handshake: %v", err)
	}
	writeFile(t, filepath.Join(a.clusterDir, admissionFileName), `{"clusterId": "test-cluster", "epoch": 1, "retired": true}`)
	testkit.Eventually(t, "handshakes to fail once the admission is retired", func() bool { return testkit.Handshake(addr, &b.ident) != nil })
	if !a.logs.Contains("level=INFO", "cluster membership changed", "clustered=false") {
		t.Fatalf("the demotion was not logged; logs:\n%s", a.logs)
	}
}

func TestNodeWithoutIdentityWarnsOnceAtStartupThatPeersCannotReachIt(t *testing.T) {
	n := newTestNode(t)
	netDeleteIdentity(t, n)
	n.start()
	n.m.trust.Reload()
	n.m.trust.Reload()
	if c := strings.Count(n.logs.String(), "peers cannot reach this node"); c != 1 {
		t.Fatalf("the missing identity was warned about %d times, want once at startup; logs:\n%s", c, n.logs)
	}
	if !n.logs.Contains("level=WARN", "no cluster identity") {
		t.Fatalf("the warning is not at warn level; logs:\n%s", n.logs)
	}
	// It says who writes the files and where they are expected.
	if !n.logs.Contains("no cluster identity", "until the cluster manager writes them", "dir="+n.clusterDir) {
		t.Fatalf("the warning does not say where node.crt and node.key go; logs:\n%s", n.logs)
	}
}
