//go:build unix

package clustertrust

import (
	"os"
	"syscall"
	"testing"
)

// makeFIFO makes a named pipe at path with no writer: an open that blocks
// would block forever.
func makeFIFO(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatalf("mkfifo %s: %v", path, err)
	}
}

// endlessDevice is a device that reads forever.
func endlessDevice(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skipf("no /dev/zero: %v", err)
	}
	return "/dev/zero"
}
