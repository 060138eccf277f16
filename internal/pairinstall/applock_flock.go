//go:build linux || darwin || freebsd || openbsd || netbsd || dragonfly

package pairinstall

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// tryLockFile opens path and takes flock's exclusive lock on it without
// waiting. flock belongs to the open file, so the kernel drops it when the
// process ends, SIGKILL included.
func tryLockFile(path string) (*os.File, error) {
	f, err := openLockFile(path)
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

// openLockFile opens the lock file, never through a symbolic link, and
// creates it only where no file is (O_EXCL): a link planted at its name
// would otherwise have the daemon truncate and write the file it points
// at. Between a failed open and the create another start may create it;
// then the open is tried once more. Anything but a regular file is
// refused.
func openLockFile(path string) (*os.File, error) {
	const flags = os.O_RDWR | syscall.O_CLOEXEC | syscall.O_NOFOLLOW | syscall.O_NONBLOCK
	f, err := os.OpenFile(path, flags, 0)
	if errors.Is(err, os.ErrNotExist) {
		f, err = os.OpenFile(path, flags|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			f, err = os.OpenFile(path, flags, 0)
		}
	}
	if errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.EMLINK) {
		return nil, errors.New("it is a symbolic link, which the lock file never is: remove it")
	}
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = fmt.Errorf("it is not a regular file (%s): remove it", st.Mode().Type())
		}
		return nil, err
	}
	return f, nil
}
