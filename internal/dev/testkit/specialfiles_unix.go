//go:build unix

package testkit

import (
	"os"
	"syscall"
	"testing"
)

// MakeFIFO makes a named pipe at path with no writer: an open that blocks
// would block forever.
func MakeFIFO(t testing.TB, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatalf("mkfifo %s: %v", path, err)
	}
}

// EndlessDevice is a device that reads forever.
func EndlessDevice(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skipf("no /dev/zero: %v", err)
	}
	return "/dev/zero"
}
