//go:build windows

package pairinstall

import (
	"errors"
	"os"
	"syscall"
)

// tryLockFile opens path for writing while sharing it only for reading:
// a second writer's open fails with a sharing violation for as long as
// this handle is open, and Windows closes it when the process ends,
// however it ends. Readers (the refused start reading the pid) share it.
func tryLockFile(path string) (*os.File, error) {
	p, err := syscall.UTF16PtrFromString(path)
	if err != nil {
		return nil, err
	}
	h, err := syscall.CreateFile(p, syscall.GENERIC_READ|syscall.GENERIC_WRITE,
		syscall.FILE_SHARE_READ, nil, syscall.OPEN_ALWAYS, syscall.FILE_ATTRIBUTE_NORMAL, 0)
	if err != nil {
		const errorSharingViolation syscall.Errno = 32
		if errors.Is(err, errorSharingViolation) {
			return nil, errLockHeld
		}
		return nil, err
	}
	return os.NewFile(uintptr(h), path), nil
}
