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
