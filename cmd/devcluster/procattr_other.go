//go:build !unix

package main

import (
	"os"
	"syscall"
)

// childProcAttr: outside Unix the daemons share the console; a Ctrl-C
// reaches them too and each shuts down cleanly on its own.
func childProcAttr() *syscall.SysProcAttr { return nil }

// terminate is the stop sequence's terminate step; outside Unix a
// terminate is a kill (TerminateProcess), as it is for PAIR's broker.
func terminate(p *os.Process) error { return p.Kill() }
