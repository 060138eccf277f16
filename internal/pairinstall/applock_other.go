//go:build !(linux || darwin || freebsd || openbsd || netbsd || dragonfly || windows)

package pairinstall

import "os"

// tryLockFile has no lock to take on a platform without flock or Windows'
// share modes (PAIR ships on none of them): it opens the file, so the pid
// is still written, and never refuses.
func tryLockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}
