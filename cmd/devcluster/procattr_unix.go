//go:build unix

package main

import (
	"os"
	"syscall"
)

// childProcAttr puts each daemon in its own process group, so a Ctrl-C in
// the terminal reaches only the devcluster, which then stops the daemons in
// order (traffic first, then their stdin) instead of racing them.
func childProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// terminate is the stop sequence's terminate step: SIGTERM.
func terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }

// killGroups kills, with SIGKILL, the process group of every daemon the
// cluster started (childProcAttr makes each its own group's leader): what
// the stop sequence left, a daemon's children included. A group already
// gone is no error.
func killGroups(c *cluster) {
	for _, pid := range c.allPIDs() {
		syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// openFileLimit is this process's RLIMIT_NOFILE (the Go runtime raised its
// soft limit to the hard one at start; each daemon does the same).
func openFileLimit() (uint64, bool) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, false
	}
	return uint64(l.Cur), true
}
