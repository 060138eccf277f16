//go:build !unix

package main

import (
	"os"
)

// On Windows a console's Ctrl-C reaches every process attached to it, the
// command included, so nothing is forwarded: the wrapper only notes that
// it was interrupted.
var forwardedSignals = []os.Signal{os.Interrupt}

func isInterrupt(os.Signal) bool { return true }

func forward(*os.Process, os.Signal) {}

func killedBy(*os.ProcessState) string { return "" }

func signalName(s os.Signal) string { return s.String() }

func exitLike(st *os.ProcessState) int { return st.ExitCode() }

// processAlive reports whether a process of that id exists: on Windows,
// finding a process opens it, which fails when there is none.
func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	p.Release()
	return true
}
