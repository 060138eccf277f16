//go:build unix

package ownjournal

import (
	"os"
	"syscall"
)

// openForRead opens path read-only without blocking: a named pipe opened
// for reading blocks until a writer appears, which would keep the daemon
// from starting, and O_NONBLOCK makes that open return at once so Read can
// see, with Stat on the opened file, that it is not a regular file. A
// regular file ignores the flag. (internal/pairinstall does the same for
// its files; this package imports nothing of the module.)
func openForRead(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
