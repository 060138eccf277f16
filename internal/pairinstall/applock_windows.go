//go:build windows

package pairinstall

import (
	"errors"
	"os"
	"syscall"
)

// fileFlagOpenReparsePoint opens a symbolic link or junction itself rather
// than what it points at (winbase.h's FILE_FLAG_OPEN_REPARSE_POINT).
const fileFlagOpenReparsePoint = 0x00200000

// tryLockFile opens path for writing while sharing it only for reading:
// a second writer's open fails with a sharing violation for as long as
// this handle is open, and Windows closes it when the process ends,
// however it ends. Readers share it. A symbolic link (or any reparse
// point) at the lock file's name is opened itself, not followed, and
// refused, as O_NOFOLLOW refuses it elsewhere: following it would have
// the daemon write the file it points at.
func tryLockFile(path string) (*os.File, error) {
	p, err := syscall.UTF16PtrFromString(path)
	if err != nil {
		return nil, err
	}
	h, err := syscall.CreateFile(p, syscall.GENERIC_READ|syscall.GENERIC_WRITE,
		syscall.FILE_SHARE_READ, nil, syscall.OPEN_ALWAYS, syscall.FILE_ATTRIBUTE_NORMAL|fileFlagOpenReparsePoint, 0)
	if err != nil {
		const errorSharingViolation syscall.Errno = 32
		if errors.Is(err, errorSharingViolation) {
			return nil, errLockHeld
		}
		return nil, err
	}
	if err := checkLockHandle(h); err != nil {
		syscall.CloseHandle(h)
		return nil, err
	}
	return os.NewFile(uintptr(h), path), nil
}

// checkLockHandle refuses a lock file that is a reparse point (a symbolic
// link, a junction) or a directory.
func checkLockHandle(h syscall.Handle) error {
	var info syscall.ByHandleFileInformation
	if err := syscall.GetFileInformationByHandle(h, &info); err != nil {
		return err
	}
	switch {
	case info.FileAttributes&syscall.FILE_ATTRIBUTE_REPARSE_POINT != 0:
		return errors.New("it is a symbolic link, which the lock file never is: remove it")
	case info.FileAttributes&syscall.FILE_ATTRIBUTE_DIRECTORY != 0:
		return errors.New("it is not a regular file (a directory): remove it")
	}
	return nil
}
