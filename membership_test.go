package main

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/devpki"
)

func TestAdmissionIsActiveOnlyWithAClusterAPositiveEpochAndNotRetired(t *testing.T) {
	for _, tc := range []struct {
		name, content string // content "" means no file
		active, warns bool
	}{
		{"no admission.json", "", false, false},
		{"active record", `{"clusterId": "c-1", "epoch": 3, "retired": false, "admittedAt": 1789661457000}`, true, false},
		{"retired omitted counts as not retired", `{"clusterId": "c-1", "epoch": 1}`, true, false},
		{"retired", `{"clusterId": "c-1", "epoch": 3, "retired": true}`, false, false},
		{"epoch 0", `{"clusterId": "c-1", "epoch": 0, "retired": false}`, false, false},
		{"negative epoch", `{"clusterId": "c-1", "epoch": -1}`, false, false},
		{"empty clusterId", `{"clusterId": "", "epoch": 3}`, false, false},
		{"cleared to an empty object", `{}`, false, false},
		{"not JSON", `{"clusterId": "c-1", epoch`, false, true},
		{"epoch not a number", `{"clusterId": "c-1", "epoch": "3"}`, false, true},
		{"not an object", `["c-1", 3]`, false, true},
		{"larger than any admission record", `{"clusterId": "` + strings.Repeat("c", maxClusterFileBytes) + `", "epoch": 3}`, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.content != "" {
				writeFile(t, filepath.Join(dir, admissionFileName), tc.content)
			}
			adm := loadAdmission(dir)
			if adm.active != tc.active || (adm.problem != "") != tc.warns {
				t.Fatalf("loadAdmission = %+v, want active %v, a problem %v", adm, tc.active, tc.warns)
			}
		})
	}
}

func TestMembershipNeedsAnIdentityAndAnAdmissionOrAPin(t *testing.T) {
	active := admission{active: true, clusterID: "c-1", epoch: 1}
	for _, tc := range []struct {
		name        string
		hasIdentity bool
		adm         admission
		pins        int
		clustered   bool
	}{
		{"a keypair alone is not membership", true, admission{}, 0, false},
		{"keypair and admission", true, active, 0, true},
		{"keypair and a pin", true, admission{}, 1, true},
		{"admission without identity", false, active, 0, false},
		{"pins without identity", false, admission{}, 2, false},
		{"retired admission and no pin", true, admission{clusterID: "c-1", epoch: 1}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := deriveMembership(tc.hasIdentity, tc.adm, tc.pins)
			if m.clustered != tc.clustered || m.reason == "" {
				t.Fatalf("deriveMembership = %+v, want clustered %v with a reason", m, tc.clustered)
			}
		})
	}
}

func TestMalformedAdmissionIsNoAdmissionAndWarnedOnce(t *testing.T) {
	dir := t.TempDir()
	netMust(t, devpki.WriteIdentity(dir, netMint(t, devpki.NewUUID())))
	writeFile(t, filepath.Join(dir, admissionFileName), `{"clusterId": "c-1", epoch`)
	logs := &logBuffer{}
	tr := newClusterTrust(dir, netLogger(logs))
	for range 3 {
		tr.reload()
	}
	if tr.clustered() || tr.currentIdentity() != nil {
		t.Fatal("a malformed admission record made the node a member")
	}
	if n := strings.Count(logs.String(), "admission record ignored"); n != 1 {
		t.Fatalf("the malformed admission record was warned about %d times over three reloads, want once; logs:\n%s", n, logs)
	}
}

func TestUnclusteredNodeCompletesNoHandshakeUntilAdmittedWithoutRestart(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	netMust(t, os.Remove(filepath.Join(a.clusterDir, admissionFileName))) // a keypair, no admission, no pin
	b.trust(a)
	a.start()
	b.start()
	addr := a.m.PeerAddr().String()

	if err := netHandshake(addr, &b.ident); err == nil {
		t.Fatal("a node with a keypair but no admission or pin completed a handshake")
	}
	if !a.logs.contains("level=INFO", "cluster membership", "clustered=false") {
		t.Fatalf("the node did not say at startup that it is not clustered; logs:\n%s", a.logs)
	}
	a.sendLifecycle(workload("job-unclustered", "running", a.id))
	a.discover(b)
	netBarrier(t, a)
	if got := a.m.bcast.targetCount(); got != 0 {
		t.Fatalf("an unclustered node has %d broadcast target(s), want 0", got)
	}

	netMust(t, devpki.WriteAdmission(a.clusterDir, "test-cluster", 1))
	eventually(t, "a handshake once admission.json appears", func() bool { return netHandshake(addr, &b.ident) == nil })
	if !a.logs.contains("level=INFO", "cluster membership changed", "clustered=true") {
		t.Fatalf("the transition to clustered was not logged; logs:\n%s", a.logs)
	}
	// B is pinned by neither file in A's trusted/, so A does not target it;
	// A pinning B makes the target, and the backfill delivers the workload
	// tracked while A was unclustered.
	a.trust(b)
	a.waitTargets(1)
	eventually(t, "job-unclustered at B", func() bool { return netUpsertIDs(b)["job-unclustered"] >= 1 })
}

func TestClearedAdmissionDemotesAMember(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	b.trust(a)
	a.start()
	b.start()
	addr := a.m.PeerAddr().String()
	if err := netHandshake(addr, &b.ident); err != nil {
		t.Fatalf("an admitted member refused a handshake: %v", err)
	}
	writeFile(t, filepath.Join(a.clusterDir, admissionFileName), `{"clusterId": "test-cluster", "epoch": 1, "retired": true}`)
	eventually(t, "handshakes to fail once the admission is retired", func() bool { return netHandshake(addr, &b.ident) != nil })
	if !a.logs.contains("level=INFO", "cluster membership changed", "clustered=false") {
		t.Fatalf("the demotion was not logged; logs:\n%s", a.logs)
	}
}

func TestMissingNodeKeyKeepsALiveMembersIdentity(t *testing.T) {
	dir, _ := netMemberDir(t)
	logs := &logBuffer{}
	tr := newClusterTrust(dir, netLogger(logs))
	tr.reload()
	before := tr.currentIdentity()
	if before == nil {
		t.Fatal("an admitted member has no identity")
	}
	key, err := os.ReadFile(filepath.Join(dir, "node.key"))
	netMust(t, err)
	netMust(t, os.Remove(filepath.Join(dir, "node.key"))) // quarantined by an antivirus
	for range 3 {
		if tr.reload() {
			t.Fatal("a missing node.key on a live member was reported as a change")
		}
	}
	if id := tr.currentIdentity(); id == nil || !bytes.Equal(id.Leaf.Raw, before.Leaf.Raw) || !tr.clustered() {
		t.Fatal("a live member lost its identity while node.key was missing")
	}
	if n := strings.Count(logs.String(), "keeping the previous one"); n != 1 {
		t.Fatalf("the missing key was warned about %d times over three reloads, want once; logs:\n%s", n, logs)
	}
	writeFile(t, filepath.Join(dir, "node.key"), string(key))
	tr.reload()
	if tr.currentIdentity() == nil {
		t.Fatal("identity lost once node.key came back")
	}
}

func TestSelfTrustFollowsARotatedKeypair(t *testing.T) {
	dir, self := netMemberDir(t)
	netMust(t, devpki.PinIdentity(dir, self)) // a stale self pin must not outrank the live leaf
	tr := newClusterTrust(dir, netLogger(&logBuffer{}))
	tr.reload()
	if err := tr.authorize([]*x509.Certificate{netParse(t, self.CertPEM)}); err != nil {
		t.Fatalf("the node's own leaf is not trusted: %v", err)
	}
	rotated := netMint(t, self.Principal)
	netMust(t, devpki.WriteIdentity(dir, rotated))
	if !tr.reload() {
		t.Fatal("the rotated keypair was not reported as a change")
	}
	if err := tr.authorize([]*x509.Certificate{netParse(t, rotated.CertPEM)}); err != nil {
		t.Fatalf("the rotated leaf is not trusted: %v", err)
	}
	if err := tr.authorize([]*x509.Certificate{netParse(t, self.CertPEM)}); err == nil {
		t.Fatal("the leaf replaced by the rotation is still trusted")
	}
}

func TestNodeWithoutIdentityWarnsOnceAtStartupThatPeersCannotReachIt(t *testing.T) {
	n := newTestNode(t)
	netDeleteIdentity(t, n)
	n.start()
	n.m.trust.reload()
	n.m.trust.reload()
	if c := strings.Count(n.logs.String(), "peers cannot reach this node"); c != 1 {
		t.Fatalf("the missing identity was warned about %d times, want once at startup; logs:\n%s", c, n.logs)
	}
	if !n.logs.contains("level=WARN", "no cluster identity") {
		t.Fatalf("the warning is not at warn level; logs:\n%s", n.logs)
	}
	// It says who writes the files and where they are expected.
	if !n.logs.contains("no cluster identity", "until the cluster manager writes them", "dir="+n.clusterDir) {
		t.Fatalf("the warning does not say where node.crt and node.key go; logs:\n%s", n.logs)
	}
}
