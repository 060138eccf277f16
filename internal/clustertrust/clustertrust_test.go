package clustertrust

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
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
			if got := PrincipalOf(c.cert); got != c.want {
				t.Fatalf("PrincipalOf = %q, want %q", got, c.want)
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
			logs := &testkit.LogBuffer{}
			tr := NewClusterTrust(dir, netLogger(logs))
			tr.Reload()

			if der, ok := tr.Pin(control.Principal); !ok || !bytes.Equal(der, control.DER) {
				t.Fatalf("the valid pin beside %s was lost", c.file)
			}
			want := 1
			if c.pinned != nil {
				want = 2
				der, ok := tr.Pin(c.pinned.Principal)
				if !ok || !bytes.Equal(der, c.pinned.DER) {
					t.Fatalf("%s: pin for %s missing or not the certificate's DER", c.file, c.pinned.Principal)
				}
			}
			if got := tr.PinCount(); got != want {
				t.Fatalf("pinCount = %d, want %d (pins must not be taken from an invalid file)", got, want)
			}
			warned := logs.Contains("ignoring pin", "file="+c.file)
			if warned != c.warnsFile {
				t.Fatalf("warning naming %s logged = %v, want %v; logs:\n%s", c.file, warned, c.warnsFile, logs)
			}
			if c.warnsFile {
				tr.Reload()
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
	tr := NewClusterTrust(dir, netLogger(&testkit.LogBuffer{}))
	tr.Reload()
	if tr.PinCount() != 1 {
		t.Fatalf("pinCount = %d after the first reload, want 1", tr.PinCount())
	}
	if err := os.RemoveAll(filepath.Join(dir, "trusted")); err != nil {
		t.Fatal(err)
	}
	if !tr.Reload() {
		t.Fatal("reload after trusted/ disappeared reported no change")
	}
	if _, ok := tr.Pin(peer.Principal); ok || tr.PinCount() != 0 {
		t.Fatalf("pins after trusted/ disappeared: %d, want none", tr.PinCount())
	}
	if err := tr.Authorize([]*x509.Certificate{netParse(t, peer.CertPEM)}); err == nil {
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
			logs := &testkit.LogBuffer{}
			tr := NewClusterTrust(dir, netLogger(logs))
			tr.Reload()

			c.makeBroken(t, trusted)
			if tr.Reload() {
				t.Fatal("reload of an unreadable trusted/ reported a change")
			}
			if der, ok := tr.Pin(peer.Principal); !ok || !bytes.Equal(der, peer.DER) {
				t.Fatal("the previous pin was dropped when trusted/ became unreadable")
			}
			if !logs.Contains("trusted directory unreadable") {
				t.Fatalf("no warning about the unreadable trusted/; logs:\n%s", logs)
			}

			// Once readable again, its content counts again.
			os.Chmod(trusted, 0o700)
			os.RemoveAll(trusted)
			next := netMint(t, devpki.NewUUID())
			if err := devpki.PinIdentity(dir, next); err != nil {
				t.Fatal(err)
			}
			if !tr.Reload() {
				t.Fatal("reload of the restored trusted/ reported no change")
			}
			if _, ok := tr.Pin(peer.Principal); ok {
				t.Fatal("a pin absent from the restored trusted/ is still held")
			}
			if _, ok := tr.Pin(next.Principal); !ok {
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
	tr := NewClusterTrust(dir, netLogger(&testkit.LogBuffer{}))

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
		if got := tr.Reload(); got != s.change {
			t.Fatalf("%s: reload reported change = %v, want %v", s.name, got, s.change)
		}
	}
	if tr.CurrentIdentity() != nil {
		t.Fatal("identity still held after node.key was deleted")
	}
}

func TestTrustKeepsPreviousIdentityWhileNodeCertIsUnreadable(t *testing.T) {
	dir, self := netMemberDir(t)
	logs := &testkit.LogBuffer{}
	tr := NewClusterTrust(dir, netLogger(logs))
	tr.Reload()
	writeFile(t, filepath.Join(dir, "node.crt"), "-----BEGIN CERTIFICATE-----\ntruncated")
	if tr.Reload() {
		t.Fatal("a half-written node.crt was reported as a change")
	}
	id := tr.CurrentIdentity()
	if id == nil || !bytes.Equal(id.Leaf.Raw, self.DER) {
		t.Fatal("the previous identity was dropped while node.crt was unreadable")
	}
	if !logs.Contains("cluster identity unreadable") {
		t.Fatalf("no warning about the unreadable identity; logs:\n%s", logs)
	}
}

// ---- helpers of this package's tests, named as the root's net helpers
// they were taken from, so a test reads the same in either place ----

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

func netLogger(l *testkit.LogBuffer) *slog.Logger {
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

// TestTheNodeURIIsReadAsItsText: the principal a URI SAN names is what
// follows urn:nvpair:node: in the URI's text, whatever form the URI takes
// (the common one is read without building the text).
func TestTheNodeURIIsReadAsItsText(t *testing.T) {
	u := devpki.NewUUID()
	for _, raw := range []string{
		"urn:nvpair:node:" + u,
		"URN:nvpair:node:" + u,
		"urn:nvpair:node:" + u + "?x=1",
		"urn:nvpair:node:" + u + "?",
		"urn:nvpair:node:" + u + "#frag",
		"urn:nvpair:node:",
		"urn:nvpair:nodes:" + u,
		"urn:other:" + u,
		"urn://nvpair/node:" + u,
		"urn:/nvpair:node:" + u,
		"https://example.test/" + u,
		"nvpair:node:" + u,
	} {
		parsed, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		text := parsed.String()
		want, wantOK := strings.CutPrefix(text, principalURIPrefix)
		if !wantOK {
			want = ""
		}
		if got, ok := nodeURIPrincipal(parsed); got != want || ok != wantOK {
			t.Errorf("%q (text %q): got %q, %v; want %q, %v", raw, text, got, ok, want, wantOK)
		}
	}
}
