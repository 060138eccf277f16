//go:build linux || darwin

package main

import (
	"syscall"
	"unsafe"
)

// inForeground reports whether this process's group is the foreground
// process group of the terminal on its stdin, stdout or stderr: the group
// a terminal's Ctrl-C and Ctrl-\ go to.
func inForeground() bool {
	own := syscall.Getpgrp()
	for fd := 0; fd <= 2; fd++ {
		var pgrp int32
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), uintptr(syscall.TIOCGPGRP), uintptr(unsafe.Pointer(&pgrp))); e == 0 {
			return int(pgrp) == own
		}
	}
	return false
}
