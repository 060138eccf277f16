//go:build !unix

package pairinstall

import "os"

// openForRead opens path read-only. Outside Unix no file a directory lists
// blocks its open (Windows named pipes live in their own namespace), so a
// plain open is enough; the caller still checks the opened file is regular.
func openForRead(path string) (*os.File, error) {
	return os.Open(path)
}

// syncDir is a no-op outside Unix: Windows cannot open a directory to
// sync it, and NTFS journals the link itself.
func syncDir(string) error { return nil }
