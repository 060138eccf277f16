//go:build !unix && !windows

package statejournal

import "os"

// openJournalFile is os.OpenFile where there is neither O_NOFOLLOW nor share
// modes to ask for; Open checks with Lstat before the open, and with Stat
// of the opened file after it, that the path names a regular file, and
// creates every new file with O_EXCL.
func openJournalFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	return os.OpenFile(name, flag, perm)
}
