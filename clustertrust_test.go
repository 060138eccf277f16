package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

func TestNodeWithoutIdentityCompletesNoHandshakeUntilIdentityAppears(t *testing.T) {
	n := newTestNode(t)
	client := testkit.Mint(t, devpki.NewUUID())
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, client))
	netDeleteIdentity(t, n)
	n.start()
	addr := n.m.PeerAddr().String()

	// The listener is bound: TCP connects, but no TLS handshake completes.
	if err := testkit.Handshake(addr, &client); err == nil {
		t.Fatal("a node without identity completed a TLS handshake")
	}
	if n.m.trust.CurrentIdentity() != nil {
		t.Fatal("identity present although node.crt and node.key were deleted")
	}

	testkit.Must(t, devpki.WriteIdentity(n.clusterDir, n.ident))
	testkit.Eventually(t, "a handshake once the identity appears", func() bool { return testkit.Handshake(addr, &client) == nil })
	if got := n.m.PeerAddr().String(); got != addr {
		t.Fatalf("the peer listener moved from %s to %s: it must serve on the same listener", addr, got)
	}
	c := testkit.PeerClient(t, &client, n.ident.DER)
	if st := netPost(t, c, addr, testframe.Lifecycle(testframe.Workload("job-1", "running", client.Principal), nil)); st != 200 {
		t.Fatalf("POST once the identity appeared = %d, want 200", st)
	}
	n.broker.WaitMethod(wireframe.MethodUpsert, 1)
}

func TestNodeWithoutIdentityBroadcastsNothingUntilIdentityAppears(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	a.trust(b)
	b.trust(a)
	netDeleteIdentity(t, a)
	a.start()
	b.start()

	a.sendLifecycle(testframe.Workload("job-before", "running", a.id))
	a.discover(b)
	netBarrier(t, a)
	if got := a.m.bcast.TargetCount(); got != 0 {
		t.Fatalf("a node without identity has %d broadcast target(s), want 0", got)
	}

	testkit.Must(t, devpki.WriteIdentity(a.clusterDir, a.ident))
	a.waitTargets(1)
	// The workload tracked before the identity appeared reaches B through
	// the backfill.
	testkit.Eventually(t, "job-before at B", func() bool { return netUpsertIDs(b)["job-before"] >= 1 })
}

func TestLivePinReloadAdmitsNewPeerWithinTwoSeconds(t *testing.T) {
	n := newTestNode(t).start()
	client := testkit.Mint(t, devpki.NewUUID())
	c := testkit.PeerClient(t, &client, n.ident.DER)
	addr := n.m.PeerAddr().String()
	seq := 0
	post := func() int {
		seq++
		return netPost(t, c, addr, testframe.Lifecycle(testframe.Workload("job-"+itoa(seq), "running", client.Principal), nil))
	}
	if st := post(); st != 403 {
		t.Fatalf("POST before the pin = %d, want 403", st)
	}
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, client))
	netWithin(t, 2*time.Second, "a newly pinned peer to be answered 200", func() bool { return post() == 200 })
}

func TestLivePinRemovalRejectsKeptAliveConnectionWithinTwoSeconds(t *testing.T) {
	n := newTestNode(t)
	client := testkit.Mint(t, devpki.NewUUID())
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, client))
	n.start()
	c := testkit.PeerClient(t, &client, n.ident.DER)
	addr := n.m.PeerAddr().String()
	seq := 0
	post := func() (int, bool) {
		seq++
		return netPostTraced(t, c, addr, testframe.Lifecycle(testframe.Workload("job-"+itoa(seq), "running", client.Principal), nil))
	}
	if st, _ := post(); st != 200 {
		t.Fatalf("POST with the pin = %d, want 200", st)
	}
	testkit.Must(t, os.Remove(filepath.Join(n.clusterDir, "trusted", client.Principal+".json")))
	var reused bool
	netWithin(t, 2*time.Second, "the removed pin to be answered 403", func() bool {
		var st int
		st, reused = post()
		return st == 403
	})
	if !reused {
		t.Fatal("the 403 came on a new connection; the test needs it on the kept-alive one")
	}
}

// ---- helpers for the net helper's tests (clustertrust, peerserver,
// discovery, broadcast) ----

// The file names of a PAIR installation, as the daemon's tests write and
// read them. They are spelled out here rather than taken from
// internal/pairinstall: they are PAIR's contract, which the daemon must
// keep, not a choice of the package.
const (
	admissionFileName = "admission.json" // in the cluster dir
)

func netMintCN(t testing.TB, principal string) devpki.Identity {
	t.Helper()
	id, err := devpki.MintCN(principal)
	testkit.Must(t, err)
	return id
}

func netLogger(l *testkit.LogBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// netDeleteIdentity removes a not yet started node's node.crt and node.key.
func netDeleteIdentity(t testing.TB, n *testNode) {
	t.Helper()
	for _, f := range []string{"node.crt", "node.key"} {
		testkit.Must(t, os.Remove(filepath.Join(n.clusterDir, f)))
	}
}

// netWithin waits until cond holds and fails the test if that takes longer
// than limit: for the properties the spec bounds in time.
func netWithin(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s took longer than %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
