//go:build !unix

package clustertrust

import "testing"

// makeFIFO skips: named pipes in a directory are a Unix matter.
func makeFIFO(t *testing.T, path string) {
	t.Skip("no named pipes in a directory on this platform")
}

// endlessDevice skips: there is no /dev/zero on this platform.
func endlessDevice(t *testing.T) string {
	t.Skip("no /dev/zero on this platform")
	return ""
}
