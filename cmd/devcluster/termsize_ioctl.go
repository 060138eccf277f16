//go:build linux || darwin

package main

import (
	"os"
	"syscall"
	"unsafe"
)

// terminalSize returns the width and height of the terminal f is, or
// $COLUMNS and $LINES when it cannot ask (0 for what is unknown).
func terminalSize(f *os.File) (cols, rows int) {
	var ws struct{ row, col, x, y uint16 }
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TIOCGWINSZ), uintptr(unsafe.Pointer(&ws)))
	if errno != 0 || ws.col == 0 {
		return columnsEnv(), linesEnv()
	}
	return int(ws.col), int(ws.row)
}
