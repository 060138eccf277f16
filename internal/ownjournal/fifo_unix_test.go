//go:build unix

package ownjournal

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A named pipe at the journal's path is refused at once, not waited on:
// an open for reading would block until a writer came, and the daemon
// would never start.
func TestReadRefusesAFifoWithoutBlocking(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("no named pipes here: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := Read(path, DefaultMaxBytes); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("Read of a named pipe: %v, want it refused as not a regular file", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Read of a named pipe still blocked after 30 s: the daemon would never start")
	}
}
