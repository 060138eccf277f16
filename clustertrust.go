package main

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
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// trustReloadInterval is how often the cluster directory is re-read. The
// contract asks for changes to take effect within 2 seconds.
const trustReloadInterval = time.Second

const principalURIPrefix = "urn:nvpair:node:"

var errNoIdentity = errors.New("this node has no cluster identity (node.crt/node.key)")

// clusterTrust holds this node's identity and the pinned certificates of the
// other members, as read from the cluster directory, which the cluster
// manager writes and this daemon only reads.
type clusterTrust struct {
	dir string
	log *slog.Logger

	// mu guards identity, identityDER, pins and invalid. It is a leaf lock:
	// TLS callbacks take it during handshakes, so nothing else may be
	// acquired while holding it.
	mu          sync.RWMutex
	identity    *tls.Certificate  // nil while the node has no identity
	identityDER []byte            // identity's leaf, to detect a change
	pins        map[string][]byte // principal -> pinned certificate DER
	invalid     map[string]string // pin file name -> why it was ignored

	serverHandshakes atomic.Uint64 // completed server-side handshakes, for the metrics
}

func newClusterTrust(dir string, log *slog.Logger) *clusterTrust {
	return &clusterTrust{dir: dir, log: log, pins: map[string][]byte{}, invalid: map[string]string{}}
}

// watch re-reads the cluster directory until ctx ends and calls onChange
// after each reload that changed the identity or the pins.
func (t *clusterTrust) watch(ctx context.Context, every time.Duration, onChange func()) {
	runEvery(ctx, every, func() {
		if t.reload() {
			onChange()
		}
	})
}

// reload reads the identity and the pins and reports whether either changed.
func (t *clusterTrust) reload() bool {
	ident, identDER, identErr := loadIdentity(t.dir)
	pins, invalid, pinsErr := loadPins(filepath.Join(t.dir, "trusted"))

	t.mu.Lock()
	defer t.mu.Unlock()
	changed := false
	switch {
	case identErr != nil:
		// A present but unreadable identity is most likely mid-rotation:
		// keep serving with the previous one.
		t.log.Warn("cluster identity unreadable, keeping the previous one", "reason", identErr)
	case !bytes.Equal(identDER, t.identityDER):
		changed = true
		t.identity, t.identityDER = ident, identDER
		if ident == nil {
			t.log.Warn("cluster identity absent: serving and broadcasting nothing", "dir", t.dir)
		} else {
			t.log.Info("cluster identity loaded", "principal", principalOf(ident.Leaf))
		}
	}
	if pinsErr != nil {
		t.log.Warn("trusted directory unreadable, keeping the previous pins", "reason", pinsErr)
		return changed
	}
	for name, why := range invalid {
		if t.invalid[name] != why {
			t.log.Warn("ignoring pin", "file", name, "reason", why)
		}
	}
	t.invalid = invalid
	if !maps.EqualFunc(pins, t.pins, bytes.Equal) {
		changed = true
		t.log.Info("pinned peers changed", "total", len(pins))
		t.pins = pins
	}
	return changed
}

// loadIdentity returns the node's certificate and its leaf's DER, or nil and
// no error when node.crt or node.key is absent.
func loadIdentity(dir string) (*tls.Certificate, []byte, error) {
	certFile, keyFile := filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key")
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil
		}
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("load %s: %w", certFile, err)
	}
	return &cert, cert.Leaf.Raw, nil
}

// pinFile is the JSON document the cluster manager writes per trusted peer.
type pinFile struct {
	NodeUUID string `json:"nodeUuid"`
	CertPEM  string `json:"certPem"`
}

// loadPins reads every valid pin in dir. A missing directory trusts no one;
// any other error is returned so the caller keeps its previous pins.
func loadPins(dir string) (pins map[string][]byte, invalid map[string]string, err error) {
	pins, invalid = map[string][]byte{}, map[string]string{}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return pins, invalid, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".json") {
			continue // also skips the cluster manager's .tmp files
		}
		principal, der, err := readPin(filepath.Join(dir, name))
		if err != nil {
			invalid[name] = err.Error()
			continue
		}
		pins[principal] = der
	}
	return pins, invalid, nil
}

// readPin returns a pin's principal and certificate when its file name, its
// nodeUuid and its certificate's principal all name the same UUID.
func readPin(path string) (string, []byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
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
	name := strings.TrimSuffix(filepath.Base(path), ".json")
	principal := principalOf(cert)
	if p.NodeUUID == "" || name != p.NodeUUID || principal != p.NodeUUID {
		return "", nil, fmt.Errorf("file name %q, nodeUuid %q and certificate principal %q disagree", name, p.NodeUUID, principal)
	}
	return principal, block.Bytes, nil
}

// principalOf returns the UUID a certificate names: its URI SAN
// urn:nvpair:node:<uuid>, or else its subject common name.
func principalOf(cert *x509.Certificate) string {
	if cert == nil {
		return ""
	}
	for _, u := range cert.URIs {
		if s := u.String(); strings.HasPrefix(s, principalURIPrefix) {
			return strings.TrimPrefix(s, principalURIPrefix)
		}
	}
	return cert.Subject.CommonName
}

func (t *clusterTrust) currentIdentity() *tls.Certificate {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.identity
}

func (t *clusterTrust) pin(principal string) ([]byte, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	der, ok := t.pins[principal]
	return der, ok
}

// pinCount returns the number of pinned peers.
func (t *clusterTrust) pinCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.pins)
}

// authorize reports whether a peer's certificate is pinned byte for byte.
func (t *clusterTrust) authorize(certs []*x509.Certificate) error {
	if len(certs) == 0 {
		return errors.New("no client certificate")
	}
	principal := principalOf(certs[0])
	der, ok := t.pin(principal)
	if !ok {
		return fmt.Errorf("principal %q is not pinned", principal)
	}
	if !bytes.Equal(der, certs[0].Raw) {
		return fmt.Errorf("certificate of %q does not match its pin", principal)
	}
	return nil
}

// serverTLSConfig presents the current identity and asks every client for a
// certificate. The handshake does not require one and verifies no chain:
// the peer server checks the client's certificate against the pins on every
// request, so a missing or unpinned certificate is answered 403 rather than
// with a handshake failure the sender cannot tell from a network fault.
// While the node has no identity, every handshake fails.
func (t *clusterTrust) serverTLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequestClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if id := t.currentIdentity(); id != nil {
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

// clientTLSConfig dials the peer whose principal is given: it presents the
// current identity and accepts the server only when its certificate equals
// that peer's pin, read at handshake time so that a re-pinned peer is
// checked against its new pin.
func (t *clusterTrust) clientTLSConfig(principal string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Chain and name verification are replaced by the pin comparison in
		// VerifyConnection, which also runs on resumed sessions.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if id := t.currentIdentity(); id != nil {
				return id, nil
			}
			return nil, errNoIdentity
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			der, ok := t.pin(principal)
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
