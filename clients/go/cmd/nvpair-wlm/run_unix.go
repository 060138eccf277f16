//go:build unix

package main

import (
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// forwardedSignals are the signals `run` passes on to its command: those
// that ask a program to stop or to act (SIGWINCH and job control reach it
// from its terminal by themselves).
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// isInterrupt reports whether s interrupts the wrapper: the job is then
// cancelled unless the command still exits 0.
func isInterrupt(s os.Signal) bool {
	return s == syscall.SIGINT || s == syscall.SIGTERM || s == syscall.SIGHUP
}

// forward passes s on to the command. SIGINT and SIGQUIT are not passed
// on when this process is in its terminal's foreground process group: the
// terminal (Ctrl-C, Ctrl-\) sent them to the whole group, the command
// included, and a second copy would interrupt the command's own handling
// of the first.
func forward(p *os.Process, s os.Signal) {
	if (s == syscall.SIGINT || s == syscall.SIGQUIT) && inForeground() {
		return
	}
	p.Signal(s)
}

// killedBy names the signal that killed the command, "" when none did.
func killedBy(st *os.ProcessState) string {
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return ""
	}
	return signalName(ws.Signal())
}

// signalName is "SIGTERM (15)".
func signalName(s os.Signal) string {
	n, ok := s.(syscall.Signal)
	if !ok {
		return s.String()
	}
	if name := sigNames[n]; name != "" {
		return name + " (" + strconv.Itoa(int(n)) + ")"
	}
	return "signal " + strconv.Itoa(int(n))
}

var sigNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT", syscall.SIGILL: "SIGILL",
	syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE",
	syscall.SIGKILL: "SIGKILL", syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
}

// reraised are the signals this process can die of as the command did:
// those Go's runtime ends a program with by the signal itself once no
// handler is installed (SIGKILL cannot be caught at all). Any other (one
// that would make the runtime print a stack dump, or that it ignores)
// ends it with 128+N, as a shell reports a command killed by it.
var reraised = map[syscall.Signal]bool{syscall.SIGHUP: true, syscall.SIGINT: true, syscall.SIGTERM: true,
	syscall.SIGKILL: true, syscall.SIGALRM: true, syscall.SIGUSR1: true, syscall.SIGUSR2: true}

// exitLike ends this process as the command ended: its exit code, or the
// signal that killed it (so a parent that waits sees the same status).
func exitLike(st *os.ProcessState) int {
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return st.ExitCode()
	}
	sig := ws.Signal()
	if reraised[sig] {
		resetSignals()
		syscall.Kill(os.Getpid(), sig)
		time.Sleep(time.Second) // the signal is delivered on the way out of the kill
	}
	return 128 + int(sig)
}

// processAlive reports whether a process of that id exists (one of
// another user answers EPERM, and exists).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}

// resetSignals gives every forwarded signal back its default action.
func resetSignals() { signal.Reset(forwardedSignals...) }
