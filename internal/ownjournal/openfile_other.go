//go:build !unix

package ownjournal

import "os"

// openForRead opens path read-only. Outside Unix no file a directory lists
// blocks its open (Windows named pipes live in their own namespace), so a
// plain open is enough; Read still checks the opened file is regular.
func openForRead(path string) (*os.File, error) {
	return os.Open(path)
}
