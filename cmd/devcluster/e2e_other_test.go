//go:build !unix

package main

import (
	"os"
	"testing"
)

// assertExited checks that none of pids is running any more; outside Unix
// finding a process opens it, which fails once it is gone.
func assertExited(t *testing.T, pids []int) {
	t.Helper()
	if len(pids) == 0 {
		t.Error("no daemon process was recorded")
	}
	for _, pid := range pids {
		if p, err := os.FindProcess(pid); err == nil {
			p.Release()
			t.Errorf("daemon pid %d is still there after the devcluster ended", pid)
		}
	}
}
