package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/devpki"
)

func TestPrincipalOfPrefersNodeURISANOverCommonName(t *testing.T) {
	u := devpki.NewUUID()
	other := devpki.NewUUID()
	cases := []struct {
		name string
		cert *x509.Certificate
		want string
	}{
		{"URI SAN only, as the cluster manager mints", netParse(t, netMint(t, u).CertPEM), u},
		{"common name when there is no URI SAN", netParse(t, netMintCN(t, u).CertPEM), u},
		{"URI SAN wins over a different common name", netCertificate(t, other, "urn:nvpair:node:"+u), u},
		{"a URI SAN of another scheme falls back to the common name", netCertificate(t, other, "https://example.test/"+u), other},
		{"the node URI SAN is found after other URIs", netCertificate(t, other, "spiffe://cluster/x", "urn:nvpair:node:"+u), u},
		{"no certificate names no one", nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := principalOf(c.cert); got != c.want {
				t.Fatalf("principalOf = %q, want %q", got, c.want)
			}
		})
	}
}

func TestPinFileIsValidOnlyWhenNameNodeUUIDAndPrincipalAgree(t *testing.T) {
	a, b := netMint(t, devpki.NewUUID()), netMint(t, devpki.NewUUID())
	cn := netMintCN(t, devpki.NewUUID())
	pinJSON := func(nodeUUID string, certPEM []byte) string {
		raw, err := json.Marshal(map[string]string{"nodeUuid": nodeUUID, "certPem": string(certPEM)})
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	noUUIDRaw, err := json.Marshal(map[string]string{"certPem": string(a.CertPEM)})
	netMust(t, err)
	noUUID := string(noUUIDRaw)
	junkCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})
	cases := []struct {
		name      string
		file      string // name inside trusted/
		content   string
		pinned    *devpki.Identity // the pin expected, nil for none
		warnsFile bool             // an "ignoring pin" warning names the file
	}{
		{"name, nodeUuid and URI SAN principal agree", a.Principal + ".json", pinJSON(a.Principal, a.CertPEM), &a, false},
		{"name, nodeUuid and common-name principal agree", cn.Principal + ".json", pinJSON(cn.Principal, cn.CertPEM), &cn, false},
		{"file name disagrees", b.Principal + ".json", pinJSON(a.Principal, a.CertPEM), nil, true},
		{"nodeUuid disagrees", a.Principal + ".json", pinJSON(b.Principal, a.CertPEM), nil, true},
		{"certificate principal disagrees", a.Principal + ".json", pinJSON(a.Principal, b.CertPEM), nil, true},
		{"nodeUuid empty", a.Principal + ".json", pinJSON("", a.CertPEM), nil, true},
		{"nodeUuid missing", a.Principal + ".json", noUUID, nil, true},
		{".tmp file ignored silently", a.Principal + ".json.tmp", pinJSON(a.Principal, a.CertPEM), nil, false},
		{"non-.json file ignored silently", a.Principal + ".pem", pinJSON(a.Principal, a.CertPEM), nil, false},
		{"file without extension ignored silently", a.Principal, pinJSON(a.Principal, a.CertPEM), nil, false},
		{"garbage JSON", a.Principal + ".json", `{"nodeUuid": "` + a.Principal + `", certPem`, nil, true},
		{"JSON that is not an object", a.Principal + ".json", `["` + a.Principal + `"]`, nil, true},
		{"certPem holds no PEM", a.Principal + ".json", pinJSON(a.Principal, []byte("MIIB...not pem")), nil, true},
		{"certPem holds a private key", a.Principal + ".json", pinJSON(a.Principal, a.KeyPEM), nil, true},
		{"certPem holds a corrupt certificate", a.Principal + ".json", pinJSON(a.Principal, junkCert), nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, _ := netMemberDir(t)
			// A valid pin beside every case: an invalid file must not
			// disturb the pins around it.
			control := netMint(t, devpki.NewUUID())
			if err := devpki.PinIdentity(dir, control); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(dir, "trusted", c.file), c.content)
			logs := &logBuffer{}
			tr := newClusterTrust(dir, netLogger(logs))
			tr.reload()

			if der, ok := tr.pin(control.Principal); !ok || !bytes.Equal(der, control.DER) {
				t.Fatalf("the valid pin beside %s was lost", c.file)
			}
			want := 1
			if c.pinned != nil {
				want = 2
				der, ok := tr.pin(c.pinned.Principal)
				if !ok || !bytes.Equal(der, c.pinned.DER) {
					t.Fatalf("%s: pin for %s missing or not the certificate's DER", c.file, c.pinned.Principal)
				}
			}
			if got := tr.pinCount(); got != want {
				t.Fatalf("pinCount = %d, want %d (pins must not be taken from an invalid file)", got, want)
			}
			warned := logs.contains("ignoring pin", "file="+c.file)
			if warned != c.warnsFile {
				t.Fatalf("warning naming %s logged = %v, want %v; logs:\n%s", c.file, warned, c.warnsFile, logs)
			}
			if c.warnsFile {
				tr.reload()
				if n := strings.Count(logs.String(), "ignoring pin"); n != 1 {
					t.Fatalf("an unchanged invalid pin was reported %d times over two reloads, want once", n)
				}
			}
		})
	}
}

func TestMissingTrustedDirectoryTrustsNoOne(t *testing.T) {
	dir := t.TempDir()
	peer := netMint(t, devpki.NewUUID())
	if err := devpki.PinIdentity(dir, peer); err != nil {
		t.Fatal(err)
	}
	tr := newClusterTrust(dir, netLogger(&logBuffer{}))
	tr.reload()
	if tr.pinCount() != 1 {
		t.Fatalf("pinCount = %d after the first reload, want 1", tr.pinCount())
	}
	if err := os.RemoveAll(filepath.Join(dir, "trusted")); err != nil {
		t.Fatal(err)
	}
	if !tr.reload() {
		t.Fatal("reload after trusted/ disappeared reported no change")
	}
	if _, ok := tr.pin(peer.Principal); ok || tr.pinCount() != 0 {
		t.Fatalf("pins after trusted/ disappeared: %d, want none", tr.pinCount())
	}
	if err := tr.authorize([]*x509.Certificate{netParse(t, peer.CertPEM)}); err == nil {
		t.Fatal("a formerly pinned peer is still authorized without trusted/")
	}
}

func TestUnreadableTrustedDirectoryKeepsPreviousPins(t *testing.T) {
	cases := []struct {
		name        string
		makeBroken  func(t *testing.T, trusted string)
		skipForRoot bool
	}{
		{"trusted replaced by a regular file", func(t *testing.T, trusted string) {
			if err := os.RemoveAll(trusted); err != nil {
				t.Fatal(err)
			}
			writeFile(t, trusted, "not a directory")
		}, false},
		{"trusted without read permission", func(t *testing.T, trusted string) {
			if err := os.Chmod(trusted, 0); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Chmod(trusted, 0o700) })
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.skipForRoot && os.Geteuid() == 0 {
				t.Skip("root reads a directory whatever its mode")
			}
			dir, _ := netMemberDir(t)
			trusted := filepath.Join(dir, "trusted")
			peer := netMint(t, devpki.NewUUID())
			if err := devpki.PinIdentity(dir, peer); err != nil {
				t.Fatal(err)
			}
			logs := &logBuffer{}
			tr := newClusterTrust(dir, netLogger(logs))
			tr.reload()

			c.makeBroken(t, trusted)
			if tr.reload() {
				t.Fatal("reload of an unreadable trusted/ reported a change")
			}
			if der, ok := tr.pin(peer.Principal); !ok || !bytes.Equal(der, peer.DER) {
				t.Fatal("the previous pin was dropped when trusted/ became unreadable")
			}
			if !logs.contains("trusted directory unreadable") {
				t.Fatalf("no warning about the unreadable trusted/; logs:\n%s", logs)
			}

			// Once readable again, its content counts again.
			os.Chmod(trusted, 0o700)
			os.RemoveAll(trusted)
			next := netMint(t, devpki.NewUUID())
			if err := devpki.PinIdentity(dir, next); err != nil {
				t.Fatal(err)
			}
			if !tr.reload() {
				t.Fatal("reload of the restored trusted/ reported no change")
			}
			if _, ok := tr.pin(peer.Principal); ok {
				t.Fatal("a pin absent from the restored trusted/ is still held")
			}
			if _, ok := tr.pin(next.Principal); !ok {
				t.Fatal("the pin of the restored trusted/ is not held")
			}
		})
	}
}

func TestTrustReloadReportsChangeOnlyWhenPinsOrIdentityChange(t *testing.T) {
	dir := t.TempDir()
	self := netMint(t, devpki.NewUUID())
	if err := devpki.WriteIdentity(dir, self); err != nil {
		t.Fatal(err)
	}
	peer := netMint(t, devpki.NewUUID())
	repinned := netMint(t, peer.Principal) // same UUID, new key and certificate
	rotated := netMint(t, self.Principal)
	tr := newClusterTrust(dir, netLogger(&logBuffer{}))

	steps := []struct {
		name   string
		do     func()
		change bool
	}{
		{"first load of the identity", func() {}, true},
		{"nothing changed", func() {}, false},
		{"a peer is pinned", func() { netMust(t, devpki.PinIdentity(dir, peer)) }, true},
		{"the same pin rewritten", func() { netMust(t, devpki.PinIdentity(dir, peer)) }, false},
		{"an invalid pin file appears", func() { writeFile(t, filepath.Join(dir, "trusted", "junk.json"), "{") }, false},
		{"a .tmp file appears", func() { writeFile(t, filepath.Join(dir, "trusted", peer.Principal+".json.tmp"), "{") }, false},
		{"the peer is re-pinned with another certificate", func() { netMust(t, devpki.PinIdentity(dir, repinned)) }, true},
		{"the pin is removed", func() { netMust(t, os.Remove(filepath.Join(dir, "trusted", peer.Principal+".json"))) }, true},
		{"the identity is rewritten unchanged", func() { netMust(t, devpki.WriteIdentity(dir, self)) }, false},
		{"the identity is rotated", func() { netMust(t, devpki.WriteIdentity(dir, rotated)) }, true},
		{"the identity is deleted", func() { netMust(t, os.Remove(filepath.Join(dir, "node.key"))) }, true},
		{"still no identity", func() {}, false},
	}
	for _, s := range steps {
		s.do()
		if got := tr.reload(); got != s.change {
			t.Fatalf("%s: reload reported change = %v, want %v", s.name, got, s.change)
		}
	}
	if tr.currentIdentity() != nil {
		t.Fatal("identity still held after node.key was deleted")
	}
}

func TestTrustKeepsPreviousIdentityWhileNodeCertIsUnreadable(t *testing.T) {
	dir, self := netMemberDir(t)
	logs := &logBuffer{}
	tr := newClusterTrust(dir, netLogger(logs))
	tr.reload()
	writeFile(t, filepath.Join(dir, "node.crt"), "-----BEGIN CERTIFICATE-----\ntruncated")
	if tr.reload() {
		t.Fatal("a half-written node.crt was reported as a change")
	}
	id := tr.currentIdentity()
	if id == nil || !bytes.Equal(id.Leaf.Raw, self.DER) {
		t.Fatal("the previous identity was dropped while node.crt was unreadable")
	}
	if !logs.contains("cluster identity unreadable") {
		t.Fatalf("no warning about the unreadable identity; logs:\n%s", logs)
	}
}

func TestNodeWithoutIdentityCompletesNoHandshakeUntilIdentityAppears(t *testing.T) {
	n := newTestNode(t)
	client := netMint(t, devpki.NewUUID())
	netMust(t, devpki.PinIdentity(n.clusterDir, client))
	netDeleteIdentity(t, n)
	n.start()
	addr := n.m.PeerAddr().String()

	// The listener is bound: TCP connects, but no TLS handshake completes.
	if err := netHandshake(addr, &client); err == nil {
		t.Fatal("a node without identity completed a TLS handshake")
	}
	if n.m.trust.currentIdentity() != nil {
		t.Fatal("identity present although node.crt and node.key were deleted")
	}

	netMust(t, devpki.WriteIdentity(n.clusterDir, n.ident))
	eventually(t, "a handshake once the identity appears", func() bool { return netHandshake(addr, &client) == nil })
	if got := n.m.PeerAddr().String(); got != addr {
		t.Fatalf("the peer listener moved from %s to %s: it must serve on the same listener", addr, got)
	}
	c := netPeerClient(t, &client, n.ident.DER)
	if st := netPost(t, c, addr, netLifecycleBody(t, workload("job-1", "running", client.Principal), nil)); st != 200 {
		t.Fatalf("POST once the identity appeared = %d, want 200", st)
	}
	n.broker.waitMethod(methodUpsert, 1)
}

func TestNodeWithoutIdentityBroadcastsNothingUntilIdentityAppears(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	a.trust(b)
	b.trust(a)
	netDeleteIdentity(t, a)
	a.start()
	b.start()

	a.sendLifecycle(workload("job-before", "running", a.id))
	a.discover(b)
	netBarrier(t, a)
	if got := a.m.bcast.targetCount(); got != 0 {
		t.Fatalf("a node without identity has %d broadcast target(s), want 0", got)
	}

	netMust(t, devpki.WriteIdentity(a.clusterDir, a.ident))
	a.waitTargets(1)
	// The workload tracked before the identity appeared reaches B through
	// the backfill.
	eventually(t, "job-before at B", func() bool { return netUpsertIDs(b)["job-before"] >= 1 })
}

func TestLivePinReloadAdmitsNewPeerWithinTwoSeconds(t *testing.T) {
	n := newTestNode(t).start()
	client := netMint(t, devpki.NewUUID())
	c := netPeerClient(t, &client, n.ident.DER)
	addr := n.m.PeerAddr().String()
	seq := 0
	post := func() int {
		seq++
		return netPost(t, c, addr, netLifecycleBody(t, workload("job-"+itoa(seq), "running", client.Principal), nil))
	}
	if st := post(); st != 403 {
		t.Fatalf("POST before the pin = %d, want 403", st)
	}
	netMust(t, devpki.PinIdentity(n.clusterDir, client))
	netWithin(t, 2*time.Second, "a newly pinned peer to be answered 200", func() bool { return post() == 200 })
}

func TestLivePinRemovalRejectsKeptAliveConnectionWithinTwoSeconds(t *testing.T) {
	n := newTestNode(t)
	client := netMint(t, devpki.NewUUID())
	netMust(t, devpki.PinIdentity(n.clusterDir, client))
	n.start()
	c := netPeerClient(t, &client, n.ident.DER)
	addr := n.m.PeerAddr().String()
	seq := 0
	post := func() (int, bool) {
		seq++
		return netPostTraced(t, c, addr, netLifecycleBody(t, workload("job-"+itoa(seq), "running", client.Principal), nil))
	}
	if st, _ := post(); st != 200 {
		t.Fatalf("POST with the pin = %d, want 200", st)
	}
	netMust(t, os.Remove(filepath.Join(n.clusterDir, "trusted", client.Principal+".json")))
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

func netMust(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func netMint(t testing.TB, principal string) devpki.Identity {
	t.Helper()
	id, err := devpki.Mint(principal)
	netMust(t, err)
	return id
}

func netMintCN(t testing.TB, principal string) devpki.Identity {
	t.Helper()
	id, err := devpki.MintCN(principal)
	netMust(t, err)
	return id
}

func netParse(t testing.TB, certPEM []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	netMust(t, err)
	return c
}

// netCertificate mints a self-signed certificate with the given common name
// and URI SANs.
func netCertificate(t testing.TB, cn string, uris ...string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	netMust(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		netMust(t, err)
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	netMust(t, err)
	c, err := x509.ParseCertificate(der)
	netMust(t, err)
	return c
}

func netLogger(l *logBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// netMemberDir returns a cluster directory of an admitted member, an
// identity and an active admission record, no pins, and the identity.
func netMemberDir(t testing.TB) (string, devpki.Identity) {
	t.Helper()
	dir, self := t.TempDir(), netMint(t, devpki.NewUUID())
	netMust(t, devpki.WriteIdentity(dir, self))
	netMust(t, devpki.WriteAdmission(dir, "test-cluster", 1))
	return dir, self
}

// netDeleteIdentity removes a not yet started node's node.crt and node.key.
func netDeleteIdentity(t testing.TB, n *testNode) {
	t.Helper()
	for _, f := range []string{"node.crt", "node.key"} {
		netMust(t, os.Remove(filepath.Join(n.clusterDir, f)))
	}
}

// netHandshake dials addr and completes a TLS handshake presenting ident.
func netHandshake(addr string, ident *devpki.Identity) error {
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
	if ident != nil {
		cert, err := ident.TLSCertificate()
		if err != nil {
			return err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: cfg}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// netWithin waits until cond holds and fails the test if that takes longer
// than limit: for the properties the contract bounds in time.
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
