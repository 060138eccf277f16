//go:build windows

package statejournal

import (
	"os"
	"syscall"
)

// openJournalFile opens a journal file, or creates one (flag as os.OpenFile's:
// O_RDWR, O_CREATE, O_EXCL), shared for deletion. A compaction or rebuild
// renames its new file over the journal while both are open, and Windows
// refuses to rename a file, or replace one, that some handle opened without
// FILE_SHARE_DELETE -- which os.OpenFile leaves out (golang/go#32088). Windows
// has no O_NOFOLLOW: Open checks with Lstat before the open, and with Stat
// of the opened file after it, that the path names a regular file, and
// creates every new file with O_EXCL (CREATE_NEW), so a planted file or
// link is never reused.
func openJournalFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	path, err := syscall.UTF16PtrFromString(name)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	access := uint32(syscall.GENERIC_READ)
	if flag&(os.O_WRONLY|os.O_RDWR) != 0 {
		access |= syscall.GENERIC_WRITE
	}
	var create uint32
	switch {
	case flag&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL:
		create = syscall.CREATE_NEW
	case flag&os.O_CREATE != 0:
		create = syscall.OPEN_ALWAYS
	default:
		create = syscall.OPEN_EXISTING
	}
	share := uint32(syscall.FILE_SHARE_READ | syscall.FILE_SHARE_WRITE | syscall.FILE_SHARE_DELETE)
	h, err := syscall.CreateFile(path, access, share, nil, create, syscall.FILE_ATTRIBUTE_NORMAL, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(h), name), nil
}
