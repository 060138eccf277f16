//go:build unix

package pairinstall

import (
	"os"
	"syscall"
)

// openForRead opens path read-only without blocking: a named pipe opened
// for reading blocks until a writer appears, and O_NONBLOCK makes that open
// return at once so the caller can see, with Stat on the opened file, that
// it is not a regular file. A regular file ignores the flag.
func openForRead(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}

// syncDir makes a file just linked into dir durable: on Unix a new name
// is durable only once its directory is synced.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
