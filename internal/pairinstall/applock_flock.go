//go:build linux || darwin || freebsd || openbsd || netbsd || dragonfly

package pairinstall

import (
	"errors"
	"os"
	"syscall"
)

// tryLockFile opens path and takes flock's exclusive lock on it without
// waiting. flock belongs to the open file, so the kernel drops it when the
// process ends, SIGKILL included.
func tryLockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLockHeld
		}
		return nil, err
	}
	return f, nil
}
