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

// killGroups kills every daemon the cluster started that is still running
// (outside Unix there are no process groups: each process alone).
func killGroups(c *cluster) {
	for _, n := range c.nodes {
		if p := n.current(); p != nil {
			select {
			case <-p.done:
			default:
				p.cmd.Process.Kill()
			}
		}
	}
}

// openFileLimit: outside Unix there is no RLIMIT_NOFILE to check.
func openFileLimit() (uint64, bool) { return 0, false }
