//go:build !linux

package pairinstall

import "runtime"

// lockHolder returns 0: outside Linux the system has no way to name the
// process holding a flock or a Windows share lock that this daemon uses,
// and the pid written into the file may be an exited daemon's.
func lockHolder(string) int { return 0 }

// holderHint says how an operator finds the holder on this platform.
func holderHint(path string) string {
	if runtime.GOOS == "windows" {
		return "the system does not name it; Resource Monitor's handle search finds it"
	}
	return "the system does not name it; find it with: lsof " + path
}
