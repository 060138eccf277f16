package clustertrust

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ReloadInterval is how often the owner of a ClusterTrust calls
// ReloadUnlessDone: spec.md 3.4 re-reads the directory every second, so a
// change takes effect within 2 seconds.
const ReloadInterval = time.Second

const principalURIPrefix = "urn:nvpair:node:"

var errNoIdentity = errors.New("this node has no cluster identity (node.crt/node.key)")

// errKeyMissing is loadIdentity's answer when node.crt is present and
// node.key is not: an antivirus quarantine or a rotation in progress more
// often than a node leaving its cluster.
var errKeyMissing = errors.New("node.key is missing")

// ClusterTrust holds this node's identity, the pinned certificates of the
// other members and the node's membership, as read from the cluster
// directory, which the cluster manager writes and this daemon only reads.
type ClusterTrust struct {
	dir string
	log *slog.Logger

	// readMu serializes reloads and guards files, the cache of what they
	// read. Only Reload (and SetReadHookForTest) takes it, never under
	// another lock, and it takes mu under it to apply what it read (order
	// readMu -> mu). It is held across the file reads, which are bounded
	// (regular files of at most pairinstall.MaxFileBytes, only those that changed); no
	// handshake or request ever waits on it.
	readMu sync.Mutex
	files  *trustFiles

	// mu guards every field below. It is a leaf lock: TLS callbacks take it
	// during handshakes, so nothing else may be acquired while holding it.
	mu            sync.RWMutex
	loaded        bool              // the first reload has run
	identity      *tls.Certificate  // the loaded keypair; nil while none is
	identityDER   []byte            // identity's leaf, to detect a change
	selfPrincipal string            // identity's principal: its own leaf counts as pinned
	identityIssue string            // the last identity problem warned about
	pins          map[string][]byte // principal -> pinned certificate DER
	invalid       map[string]string // pin file name -> why it was ignored
	admission     admission         // what admission.json said at the last reload
	member        membership        // derived from the above at every reload

	serverHandshakes atomic.Uint64 // completed server-side handshakes, for the metrics
}

// NewClusterTrust returns the trust of the cluster directory dir, logging
// to log. It holds nothing until the first Reload.
func NewClusterTrust(dir string, log *slog.Logger) *ClusterTrust {
	return &ClusterTrust{dir: dir, log: log, files: newTrustFiles(dir), pins: map[string][]byte{}, invalid: map[string]string{}}
}

// ReloadUnlessDone runs Reload on a goroutine of its own and returns its
// answer with finished true, or finished false as soon as ctx ends first.
// The reads are bounded (only regular files, at most pairinstall.MaxFileBytes
// each), but a file system can still hold a read for as long as it likes
// (an unresponsive network mount), and shutdown must not wait for it. An
// abandoned reload ends when its read does, and applies what it read; no
// one acts on its answer.
func (t *ClusterTrust) ReloadUnlessDone(ctx context.Context) (changed, finished bool) {
	answer := make(chan bool, 1) // buffered: an abandoned reload never blocks on it
	go func() { answer <- t.Reload() }()
	select {
	case changed := <-answer:
		return changed, true
	case <-ctx.Done():
		return false, false
	}
}

// Reload reads the identity, the pins and the admission record, derives
// the membership, and reports whether the identity, the pins or the
// membership changed. Only the files that changed since the last reload are
// read (trustFiles), and they are read before mu is taken, so a slow disk
// never stalls a handshake.
func (t *ClusterTrust) Reload() bool {
	t.readMu.Lock()
	defer t.readMu.Unlock()
	defer t.files.reloads.Add(1)
	ident, identDER, identErr := t.files.loadIdentity()
	pins, invalid, pinsChanged, pinsErr := t.files.loadPins()
	adm := t.files.loadAdmission()

	t.mu.Lock()
	defer t.mu.Unlock()
	first := !t.loaded
	t.loaded = true
	changed := t.applyIdentity(ident, identDER, identErr)
	changed = t.applyPins(pins, invalid, pinsChanged, pinsErr) || changed
	if adm.problem != "" && adm.problem != t.admission.problem {
		t.log.Warn("admission record ignored: treated as no admission", "reason", adm.problem)
	}
	t.admission = adm
	return t.applyMembership(deriveMembership(t.identity != nil, adm, len(t.pins)), first) || changed
}

// applyIdentity takes the result of loadIdentity and reports whether the
// identity changed. Called with mu held.
//
// A present but unreadable identity is most likely mid-rotation: the
// previous one is kept. A missing node.key next to its node.crt keeps a
// live member's identity too (a quarantined or locked key must not take a
// node out of its cluster; a cleared admission does that), but leaves a
// node that is not a member without one.
func (t *ClusterTrust) applyIdentity(ident *tls.Certificate, der []byte, err error) bool {
	keep := err != nil && (!errors.Is(err, errKeyMissing) || (t.identity != nil && t.member.clustered))
	if keep {
		if issue := err.Error(); issue != t.identityIssue {
			t.identityIssue = issue
			if t.identity != nil {
				t.log.Warn("cluster identity unreadable, keeping the previous one", "reason", issue)
			} else {
				t.log.Warn("cluster identity unreadable", "reason", issue)
			}
		}
		return false
	}
	t.identityIssue = ""
	if err != nil {
		ident, der = nil, nil // a missing key on a node that is not a member: no identity
	}
	if bytes.Equal(der, t.identityDER) {
		return false
	}
	had := t.identity != nil
	t.identity, t.identityDER, t.selfPrincipal = ident, der, ""
	switch {
	case ident != nil:
		t.selfPrincipal = PrincipalOf(ident.Leaf)
		t.log.Info("cluster identity loaded", "principal", t.selfPrincipal)
	case had:
		t.log.Warn("cluster identity absent: serving and broadcasting nothing", "dir", t.dir)
	}
	return true
}

// applyPins takes the result of loadPins and reports whether the pins
// changed. Nothing is compared when no pin file changed, so an idle reload
// does no work here. Called with mu held.
func (t *ClusterTrust) applyPins(pins map[string][]byte, invalid map[string]string, filesChanged bool, err error) bool {
	if err != nil {
		t.log.Warn("trusted directory unreadable, keeping the previous pins", "reason", err)
		return false
	}
	if !filesChanged {
		return false
	}
	for name, why := range invalid {
		if t.invalid[name] != why {
			t.log.Warn("ignoring pin", "file", name, "reason", why)
		}
	}
	t.invalid = invalid
	if maps.EqualFunc(pins, t.pins, bytes.Equal) {
		return false
	}
	t.log.Info("pinned peers changed", "total", len(pins))
	t.pins = pins
	return true
}

// applyMembership records the membership and reports whether it changed.
// It says where the node stands once at startup and again on every
// transition; a node without identity is warned about at startup, since it
// is silently unreachable otherwise. Called with mu held.
func (t *ClusterTrust) applyMembership(now membership, first bool) bool {
	prev := t.member
	t.member = now
	switch {
	case first && t.identity == nil:
		t.log.Warn("no cluster identity (node.crt/node.key): peers cannot reach this node and it broadcasts nothing until the cluster manager writes them in dir", "dir", t.dir)
	case first:
		t.log.Info("cluster membership", "clustered", now.clustered, "reason", now.reason)
	case now.clustered != prev.clustered:
		t.log.Info("cluster membership changed", "clustered", now.clustered, "reason", now.reason)
	}
	return now.clustered != prev.clustered
}

// pinFile is the JSON document the cluster manager writes per trusted peer.
type pinFile struct {
	NodeUUID string `json:"nodeUuid"`
	CertPEM  string `json:"certPem"`
}

// decodePin returns the pin a file named name.json holds, when its name,
// its nodeUuid and its certificate's principal all name the same UUID.
func decodePin(name string, b []byte) (string, []byte, error) {
	var p pinFile
	if err := json.Unmarshal(b, &p); err != nil {
		return "", nil, fmt.Errorf("not a pin document: %w", err)
	}
	block, _ := pem.Decode([]byte(p.CertPEM))
	if block == nil || block.Type != "CERTIFICATE" {
		return "", nil, errors.New("certPem holds no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", nil, fmt.Errorf("certPem: %w", err)
	}
	principal := PrincipalOf(cert)
	if p.NodeUUID == "" || name != p.NodeUUID || principal != p.NodeUUID {
		return "", nil, fmt.Errorf("file name %q, nodeUuid %q and certificate principal %q disagree", name, p.NodeUUID, principal)
	}
	return principal, block.Bytes, nil
}

// PrincipalOf returns the UUID a certificate names: its URI SAN
// urn:nvpair:node:<uuid>, or else its subject common name.
func PrincipalOf(cert *x509.Certificate) string {
	if cert == nil {
		return ""
	}
	for _, u := range cert.URIs {
		if p, ok := nodeURIPrincipal(u); ok {
			return p
		}
	}
	return cert.Subject.CommonName
}

// nodeURIPrincipal returns what follows principalURIPrefix in u's text,
// if it starts with it. The peer port asks on every request, so the
// common form, urn: with an opaque part and nothing after it, is read
// from the opaque part itself: u.String() is then "urn:" and the opaque
// part, and the answer the same without the string built. Any other form
// is read from u.String().
func nodeURIPrincipal(u *url.URL) (string, bool) {
	const scheme, rest = "urn", "nvpair:node:" // principalURIPrefix, less "urn:"
	if u.Scheme == scheme && u.Opaque != "" && u.RawQuery == "" && !u.ForceQuery && u.Fragment == "" {
		if strings.HasPrefix(u.Opaque, rest) {
			return u.Opaque[len(rest):], true
		}
		return "", false
	}
	if s := u.String(); strings.HasPrefix(s, principalURIPrefix) {
		return s[len(principalURIPrefix):], true
	}
	return "", false
}

// SetReadHookForTest makes every later read of a cluster file call hook
// with the file's path first, so that a test of the daemon can hold a read
// where a file system would (an unresponsive network mount). Only tests
// call it, before the trust is in use.
func (t *ClusterTrust) SetReadHookForTest(hook func(path string)) {
	t.readMu.Lock()
	defer t.readMu.Unlock()
	read := t.files.read
	t.files.read = func(path string) ([]byte, os.FileInfo, error) {
		hook(path)
		return read(path)
	}
}

// ServerHandshakes returns the server-side handshakes completed so
// far, for the metrics.
func (t *ClusterTrust) ServerHandshakes() uint64 { return t.serverHandshakes.Load() }

// FileStats returns what the reloads read and refused so far, for the
// metrics.
func (t *ClusterTrust) FileStats() FileStats { return t.files.stats() }

// CurrentIdentity returns the identity this node presents: its keypair
// while it is a clustered member, else nil. An unclustered node presents no
// certificate and so completes no handshake, on either side.
func (t *ClusterTrust) CurrentIdentity() *tls.Certificate {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if !t.member.clustered {
		return nil
	}
	return t.identity
}

// Clustered reports whether the node is a clustered member.
func (t *ClusterTrust) Clustered() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.member.clustered
}

// Pin returns the certificate a principal must present. The node's own
// current leaf counts as pinned (self-trust), so a rotated keypair is
// followed without a pin file; an unclustered node trusts no one.
func (t *ClusterTrust) Pin(principal string) ([]byte, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if !t.member.clustered {
		return nil, false
	}
	if t.identity != nil && principal == t.selfPrincipal {
		return t.identityDER, true
	}
	der, ok := t.pins[principal]
	return der, ok
}

// PinCount returns the number of pinned peers.
func (t *ClusterTrust) PinCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.pins)
}

// Authorize reports whether a peer's certificate is pinned byte for byte.
func (t *ClusterTrust) Authorize(certs []*x509.Certificate) error {
	if len(certs) == 0 {
		return errors.New("no client certificate")
	}
	principal := PrincipalOf(certs[0])
	der, ok := t.Pin(principal)
	if !ok {
		return fmt.Errorf("principal %q is not pinned", principal)
	}
	if !bytes.Equal(der, certs[0].Raw) {
		return fmt.Errorf("certificate of %q does not match its pin", principal)
	}
	return nil
}

// ServerTLSConfig presents the current identity and asks every client for a
// certificate. The handshake does not require one and verifies no chain:
// the peer server checks the client's certificate against the pins on every
// request, so a missing or unpinned certificate is answered 403 rather than
// with a handshake failure the sender cannot tell from a network fault.
// While the node has no identity, every handshake fails. nextProtos is what
// the server offers by ALPN, the peer port's choice.
func (t *ClusterTrust) ServerTLSConfig(nextProtos []string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		ClientAuth: tls.RequestClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if id := t.CurrentIdentity(); id != nil {
				return id, nil
			}
			return nil, errNoIdentity
		},
		// Called once per completed handshake, resumed ones included.
		VerifyConnection: func(tls.ConnectionState) error {
			t.serverHandshakes.Add(1)
			return nil
		},
	}
}

// ClientTLSConfig dials the peer whose principal is given: it presents the
// current identity and accepts the server only when its certificate equals
// that peer's pin, read at handshake time so that a re-pinned peer is
// checked against its new pin. nextProtos is what the client offers by
// ALPN, the peer port's choice.
func (t *ClusterTrust) ClientTLSConfig(principal string, nextProtos []string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Chain and name verification are replaced by the pin comparison in
		// VerifyConnection, which also runs on resumed sessions.
		InsecureSkipVerify: true,
		// The caller names HTTP/1.1, the one protocol the peer port serves
		// (3.3); a stock peer's server, which offers h2 as well, picks it.
		NextProtos: nextProtos,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if id := t.CurrentIdentity(); id != nil {
				return id, nil
			}
			return nil, errNoIdentity
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			der, ok := t.Pin(principal)
			if !ok {
				return fmt.Errorf("peer %s is no longer pinned", principal)
			}
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, der) {
				return fmt.Errorf("peer %s presented a certificate that does not match its pin", principal)
			}
			return nil
		},
	}
}
