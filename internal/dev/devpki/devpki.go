// Package devpki mints cluster identities and writes them in the cluster
// directory layout the daemon reads (spec.md 3.4). Tests, the dev
// cluster and the benchmark harness share it so that they all exercise the
// same layout the daemon expects from the cluster manager.
package devpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Identity is one node's certificate and private key.
type Identity struct {
	Principal string // the UUID the certificate names
	CertPEM   []byte
	KeyPEM    []byte
	DER       []byte // the certificate, as pinned byte for byte
}

// TLSCertificate returns the identity as a tls.Certificate.
func (id Identity) TLSCertificate() (tls.Certificate, error) {
	return tls.X509KeyPair(id.CertPEM, id.KeyPEM)
}

// NewUUID returns a random version 4 UUID in its canonical text form.
func NewUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Mint creates a self-signed certificate whose principal is the URI SAN
// urn:nvpair:node:<principal>, as the cluster manager issues them.
func Mint(principal string) (Identity, error) {
	u, err := url.Parse("urn:nvpair:node:" + principal)
	if err != nil {
		return Identity{}, fmt.Errorf("principal %q: %w", principal, err)
	}
	return mint(principal, pkix.Name{CommonName: "nvpair node"}, []*url.URL{u})
}

// MintCN creates a certificate without a URI SAN, whose principal is its
// subject common name.
func MintCN(principal string) (Identity, error) {
	return mint(principal, pkix.Name{CommonName: principal}, nil)
}

func mint(principal string, subject pkix.Name, uris []*url.URL) (Identity, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Identity{}, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return Identity{}, fmt.Errorf("serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return Identity{}, fmt.Errorf("create certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Identity{}, fmt.Errorf("marshal key: %w", err)
	}
	return Identity{
		Principal: principal,
		CertPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:    pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		DER:       der,
	}, nil
}

// WriteIdentity writes node.crt and node.key into clusterDir.
func WriteIdentity(clusterDir string, id Identity) error {
	if err := os.MkdirAll(clusterDir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", clusterDir, err)
	}
	if err := writeAtomic(filepath.Join(clusterDir, "node.key"), id.KeyPEM, 0o600); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(clusterDir, "node.crt"), id.CertPEM, 0o644)
}

// Pin is the JSON document of trusted/<uuid>.json.
type Pin struct {
	NodeUUID string `json:"nodeUuid"`
	CertPEM  string `json:"certPem"`
}

// WritePin writes trusted/<name>.json holding nodeUUID and certPEM. The name,
// the UUID and the certificate's principal are passed separately so tests
// can write pins that disagree.
func WritePin(clusterDir, name, nodeUUID string, certPEM []byte) error {
	dir := filepath.Join(clusterDir, "trusted")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	b, err := json.Marshal(Pin{NodeUUID: nodeUUID, CertPEM: string(certPEM)})
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, name+".json"), b, 0o644)
}

// PinIdentity writes the consistent pin for id into clusterDir.
func PinIdentity(clusterDir string, id Identity) error {
	return WritePin(clusterDir, id.Principal, id.Principal, id.CertPEM)
}

// Node is one member of a minted cluster.
type Node struct {
	ID         string // the node id written to <AppDir>/node-id.json; equal to the principal
	AppDir     string
	ClusterDir string // <AppDir>/cluster
	Identity   Identity
}

// WriteCluster mints n nodes under root, each with its own app directory
// (root/node<i>), node-id.json, identity, admission record and a pin for
// every other node,
// laid out as a PAIR installation lays out its app dir.
func WriteCluster(root string, n int) ([]Node, error) {
	nodes := make([]Node, n)
	for i := range nodes {
		id := NewUUID()
		ident, err := Mint(id)
		if err != nil {
			return nil, err
		}
		app := filepath.Join(root, fmt.Sprintf("node%d", i+1))
		nodes[i] = Node{ID: id, AppDir: app, ClusterDir: filepath.Join(app, "cluster"), Identity: ident}
		if err := WriteIdentity(nodes[i].ClusterDir, ident); err != nil {
			return nil, err
		}
		if err := WriteNodeID(app, id); err != nil {
			return nil, err
		}
		if err := WriteAdmission(nodes[i].ClusterDir, "devpki-cluster", 1); err != nil {
			return nil, err
		}
	}
	for i := range nodes {
		for j := range nodes {
			if i == j {
				continue
			}
			if err := PinIdentity(nodes[i].ClusterDir, nodes[j].Identity); err != nil {
				return nil, err
			}
		}
	}
	return nodes, nil
}

// WriteAdmission writes <clusterDir>/admission.json, the cluster admission
// record that makes a node with an identity a clustered member.
func WriteAdmission(clusterDir, clusterID string, epoch int64) error {
	b, err := json.Marshal(map[string]any{"clusterId": clusterID, "epoch": epoch, "retired": false, "admittedAt": time.Now().UnixMilli()})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(clusterDir, 0o700); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(clusterDir, "admission.json"), b, 0o600)
}

// WriteNodeID writes <appDir>/node-id.json naming id, in the format PAIR
// uses: {"node_uuid": "<uuid>", "created_at": <epoch ms>}.
func WriteNodeID(appDir, id string) error {
	b, err := json.Marshal(map[string]any{"node_uuid": id, "created_at": time.Now().UnixMilli()})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(appDir, 0o700); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(appDir, "node-id.json"), append(b, '\n'), 0o600)
}

// writeAtomic writes through a .tmp file and a rename, the way the cluster
// manager does, so the daemon's reload never sees half a file.
func writeAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}
