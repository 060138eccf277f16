package clustertrust

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/pairinstall"
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
		{"larger than any admission record", `{"clusterId": "` + strings.Repeat("c", pairinstall.MaxFileBytes) + `", "epoch": 3}`, false, true},
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
	logs := &testkit.LogBuffer{}
	tr := NewClusterTrust(dir, netLogger(logs))
	for range 3 {
		tr.Reload()
	}
	if tr.Clustered() || tr.CurrentIdentity() != nil {
		t.Fatal("a malformed admission record made the node a member")
	}
	if n := strings.Count(logs.String(), "admission record ignored"); n != 1 {
		t.Fatalf("the malformed admission record was warned about %d times over three reloads, want once; logs:\n%s", n, logs)
	}
}

func TestMissingNodeKeyKeepsALiveMembersIdentity(t *testing.T) {
	dir, _ := netMemberDir(t)
	logs := &testkit.LogBuffer{}
	tr := NewClusterTrust(dir, netLogger(logs))
	tr.Reload()
	before := tr.CurrentIdentity()
	if before == nil {
		t.Fatal("an admitted member has no identity")
	}
	key, err := os.ReadFile(filepath.Join(dir, "node.key"))
	netMust(t, err)
	netMust(t, os.Remove(filepath.Join(dir, "node.key"))) // quarantined by an antivirus
	for range 3 {
		if tr.Reload() {
			t.Fatal("a missing node.key on a live member was reported as a change")
		}
	}
	if id := tr.CurrentIdentity(); id == nil || !bytes.Equal(id.Leaf.Raw, before.Leaf.Raw) || !tr.Clustered() {
		t.Fatal("a live member lost its identity while node.key was missing")
	}
	if n := strings.Count(logs.String(), "keeping the previous one"); n != 1 {
		t.Fatalf("the missing key was warned about %d times over three reloads, want once; logs:\n%s", n, logs)
	}
	writeFile(t, filepath.Join(dir, "node.key"), string(key))
	tr.Reload()
	if tr.CurrentIdentity() == nil {
		t.Fatal("identity lost once node.key came back")
	}
}

func TestSelfTrustFollowsARotatedKeypair(t *testing.T) {
	dir, self := netMemberDir(t)
	netMust(t, devpki.PinIdentity(dir, self)) // a stale self pin must not outrank the live leaf
	tr := NewClusterTrust(dir, netLogger(&testkit.LogBuffer{}))
	tr.Reload()
	if err := tr.Authorize([]*x509.Certificate{netParse(t, self.CertPEM)}); err != nil {
		t.Fatalf("the node's own leaf is not trusted: %v", err)
	}
	rotated := netMint(t, self.Principal)
	netMust(t, devpki.WriteIdentity(dir, rotated))
	if !tr.Reload() {
		t.Fatal("the rotated keypair was not reported as a change")
	}
	if err := tr.Authorize([]*x509.Certificate{netParse(t, rotated.CertPEM)}); err != nil {
		t.Fatalf("the rotated leaf is not trusted: %v", err)
	}
	if err := tr.Authorize([]*x509.Certificate{netParse(t, self.CertPEM)}); err == nil {
		t.Fatal("the leaf replaced by the rotation is still trusted")
	}
}
