//go:build !unix

package main

import "syscall"

// childProcAttr: outside Unix the daemons share the console; a Ctrl-C
// reaches them too and each shuts down cleanly on its own.
func childProcAttr() *syscall.SysProcAttr { return nil }
