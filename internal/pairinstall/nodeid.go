package pairinstall

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// The files a PAIR installation resolves a node's id from, in this order.
// Every PAIR service reads the same files, so the id the daemon announces is
// the one the broker, the other services and third-party producers use.
const (
	identityFileName     = "identity.json" // in the cluster dir, written by the cluster manager
	nodeIDFileName       = "node-id.json"  // in the app dir; producers read it to learn their node
	legacyNodeIDFileName = "node-id"       // a bare UUID, written by earlier versions of this daemon
)

var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// nodeIdentityDoc is PAIR's node identity document, the format of both
// identity.json and node-id.json.
type nodeIdentityDoc struct {
	NodeUUID  *string `json:"node_uuid"`
	CreatedAt int64   `json:"created_at"` // epoch milliseconds
}

// ResolvedNodeID is this node's id and where it came from, for the startup
// log; Notice, when set, is a warning to log (the id is still usable).
type ResolvedNodeID struct {
	ID     string
	Source string // the file that named the node, or the one just written
	Notice string
	// Minted says this resolution made the id and wrote Source: no file
	// named a node before it.
	Minted bool
	// Aliases are this node's other ids: the one node-id.json names when
	// identity.json names another. Both files are this node's own, and a
	// producer that reads node-id.json (PAIR's documented place for it)
	// stamps that one; the ingress takes it as this node's (spec 3.4.1).
	Aliases []NodeAlias
}

// NodeAlias is another id of this node and the file that names it.
type NodeAlias struct {
	ID     string
	Source string
}

// ForgetMinted removes the node-id.json this resolution minted, for a start
// that failed before the node announced itself: the next start then mints
// (or finds) the node's id afresh, and a failed start leaves no identity of
// a node that never ran. An id that was read, or carried over from an
// earlier version's file, is never removed.
func (r ResolvedNodeID) ForgetMinted() error {
	if !r.Minted {
		return nil
	}
	return os.Remove(r.Source)
}

// ResolveNodeID returns this node's id as PAIR resolves it: identity.json
// in the cluster dir first, else node-id.json in the app dir, else a bare
// node-id file left by earlier versions of this daemon (carried over into
// node-id.json), else a new UUID persisted as node-id.json. A file that
// exists but cannot be read or does not name a UUID is an error naming the
// file, and it is never overwritten: minting over it would fork the node's
// identity.
func ResolveNodeID(appDir, clusterDir string) (ResolvedNodeID, error) {
	for i, path := range []string{filepath.Join(clusterDir, identityFileName), filepath.Join(appDir, nodeIDFileName)} {
		id, err := readIdentityDoc(path)
		if err == nil && i == 0 {
			return ResolvedNodeID{ID: id, Source: path, Aliases: otherID(appDir, id)}, nil
		}
		if err == nil {
			return ResolvedNodeID{ID: id, Source: path}, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return ResolvedNodeID{}, err
		}
	}
	docPath := filepath.Join(appDir, nodeIDFileName)
	legacyPath := filepath.Join(appDir, legacyNodeIDFileName)
	id, err := readLegacyNodeID(legacyPath)
	switch {
	case err == nil:
		return carryOverLegacyID(appDir, docPath, legacyPath, id), nil
	case !errors.Is(err, os.ErrNotExist):
		return ResolvedNodeID{}, err
	}
	minted := newUUID()
	id, err = createNodeIDDoc(appDir, docPath, minted, time.Now())
	if err != nil {
		return ResolvedNodeID{}, err
	}
	// Another process may have written node-id.json first: then its id is
	// read back, and that file is not this start's to remove.
	return ResolvedNodeID{ID: id, Source: docPath, Minted: id == minted}, nil
}

// otherID returns node-id.json's id as an alias when it names another id
// than identity.json's. A node-id.json that is absent, unreadable or
// names no UUID names no alias: identity.json names the node, and a
// damaged file it outranks does not stop the start.
func otherID(appDir, id string) []NodeAlias {
	path := filepath.Join(appDir, nodeIDFileName)
	other, err := readIdentityDoc(path)
	if err != nil || strings.EqualFold(other, id) {
		return nil
	}
	return []NodeAlias{{ID: other, Source: path}}
}

// carryOverLegacyID writes the id of an earlier version's node-id file into
// node-id.json, so producers find it where PAIR keeps it. A failed write is
// a notice, not an error: the id is known, and the daemon serves with it.
func carryOverLegacyID(appDir, docPath, legacyPath, id string) ResolvedNodeID {
	created := time.Now()
	if st, err := os.Stat(legacyPath); err == nil {
		created = st.ModTime()
	}
	written, err := createNodeIDDoc(appDir, docPath, id, created)
	switch {
	case err != nil:
		return ResolvedNodeID{ID: id, Source: legacyPath, Notice: fmt.Sprintf("could not carry the node id over into %s: %v", docPath, err)}
	case written != id:
		// Another process wrote node-id.json first: PAIR reads that one, so
		// it is the node's id from now on.
		return ResolvedNodeID{ID: written, Source: docPath, Notice: fmt.Sprintf("%s names %s, not %s from %s; using %s", docPath, written, id, legacyPath, docPath)}
	}
	return ResolvedNodeID{ID: id, Source: docPath, Notice: fmt.Sprintf("node id carried over from %s into %s", legacyPath, docPath)}
}

// readIdentityDoc returns the UUID an identity document names. An absent
// file is an error wrapping os.ErrNotExist; every other failure names the
// file and says what is wrong with it.
func readIdentityDoc(path string) (string, error) {
	b, err := ReadBounded(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("node identity %s: unreadable: %w", path, err)
	}
	var doc nodeIdentityDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return "", fmt.Errorf("node identity %s: not a JSON identity document: %v", path, err)
	}
	if doc.NodeUUID == nil || *doc.NodeUUID == "" {
		return "", fmt.Errorf("node identity %s: names no node_uuid", path)
	}
	if !uuidPattern.MatchString(*doc.NodeUUID) {
		return "", fmt.Errorf("node identity %s: node_uuid %q is not a UUID", path, ClipReason(*doc.NodeUUID))
	}
	return *doc.NodeUUID, nil
}

// readLegacyNodeID reads the bare-UUID node-id file of earlier versions.
func readLegacyNodeID(path string) (string, error) {
	b, err := ReadBounded(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("node id %s: unreadable: %w", path, err)
	}
	id := strings.TrimSpace(string(b))
	if !uuidPattern.MatchString(id) {
		return "", fmt.Errorf("node id %s: not a UUID", path)
	}
	return id, nil
}

// createNodeIDDoc persists id as node-id.json and returns the id the file
// names afterwards. The document is written whole before it appears
// (linkNewFile), and never replaces a node-id.json another process wrote
// first: both processes then use that one.
func createNodeIDDoc(appDir, path, id string, created time.Time) (string, error) {
	if err := os.MkdirAll(appDir, 0o700); err != nil {
		return "", fmt.Errorf("create app dir %s: %w", appDir, err)
	}
	doc, _ := json.Marshal(nodeIdentityDoc{NodeUUID: &id, CreatedAt: created.UnixMilli()})
	if err := linkNewFile(appDir, path, append(doc, '\n')); errors.Is(err, os.ErrExist) {
		// Another process created it first, or it is a dangling symlink:
		// read it once, never loop back into creating it.
		return readIdentityDoc(path)
	} else if err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return id, nil
}

// linkNewFile makes path a file of content, mode 0600, unless something
// is there already (an error wrapping os.ErrExist). The content is written
// to a temporary file, synced, and linked into place, so the file appears
// complete or not at all (a crash half-way never leaves an empty file that
// would stop every later start), a link, unlike a rename, never replaces
// a file another process made first, and the directory is synced where
// the file system allows, so the name survives a power loss.
func linkNewFile(dir, path string, content []byte) error {
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+"-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(content)
	if werr == nil {
		werr = tmp.Sync()
	}
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp.Name(), 0o600)
	}
	if werr != nil {
		return werr
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		return err
	}
	// Best effort: some file systems refuse a directory's sync, and the
	// file is in place already for everything short of a power loss.
	_ = syncDir(dir)
	return nil
}

// newUUID returns a random version 4 UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
