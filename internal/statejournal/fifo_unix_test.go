//go:build unix

package statejournal

import (
	"syscall"
	"testing"
)

// platformPlants adds a named pipe at the journal's path: an open for
// reading would block until a writer came, and the daemon would never start.
var platformPlants = []struct {
	name  string
	plant func(t *testing.T, path, target string)
}{
	{"a named pipe", func(t *testing.T, path, target string) {
		if err := syscall.Mkfifo(path, 0o600); err != nil {
			t.Skipf("no named pipes here: %v", err)
		}
	}},
}
