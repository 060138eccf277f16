package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// loadNodeID returns the node id stored in <appDir>/node-id, creating the
// file with a random UUID (mode 0600) when it does not exist. Any other
// failure is an error: a node that cannot resolve its id must not start,
// since its frames would carry an origin no peer could attribute.
func loadNodeID(appDir string) (string, error) {
	path := filepath.Join(appDir, "node-id")
	id, err := readNodeID(path)
	if errors.Is(err, os.ErrNotExist) {
		return createNodeID(appDir, path)
	}
	return id, err
}

// readNodeID reads and checks an existing node-id file.
func readNodeID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read node id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if !uuidPattern.MatchString(id) {
		return "", fmt.Errorf("node id in %s is not a UUID", path)
	}
	return id, nil
}

// createNodeID writes a new id to a temporary file and links it into place,
// so the node-id file appears complete or not at all: a crash half-way can
// never leave an empty file that would stop every later start.
func createNodeID(appDir, path string) (string, error) {
	if err := os.MkdirAll(appDir, 0o700); err != nil {
		return "", fmt.Errorf("create app dir: %w", err)
	}
	tmp, err := os.CreateTemp(appDir, "node-id-*.tmp")
	if err != nil {
		return "", fmt.Errorf("create node id: %w", err)
	}
	defer os.Remove(tmp.Name())
	id := newUUID()
	_, werr := tmp.WriteString(id + "\n")
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp.Name(), 0o600)
	}
	if werr != nil {
		return "", fmt.Errorf("write node id: %w", werr)
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, os.ErrExist) {
		// Another process created it first, or it is a dangling symlink:
		// read it once, never loop back into creating it.
		return readNodeID(path)
	} else if err != nil {
		return "", fmt.Errorf("create node id: %w", err)
	}
	return id, nil
}

// newUUID returns a random version 4 UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
