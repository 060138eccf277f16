//go:build !unix

package testkit

import "testing"

// MakeFIFO skips: named pipes in a directory are a Unix matter.
func MakeFIFO(t testing.TB, path string) {
	t.Skip("no named pipes in a directory on this platform")
}

// EndlessDevice skips: there is no /dev/zero on this platform.
func EndlessDevice(t testing.TB) string {
	t.Skip("no /dev/zero on this platform")
	return ""
}
