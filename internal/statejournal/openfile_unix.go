//go:build unix

package statejournal

import (
	"os"
	"syscall"
)

// openJournalFile opens a journal file, or creates one (flag as os.OpenFile's),
// never through a symbolic link: O_NOFOLLOW makes an open of a link fail
// instead of opening its target, so a link planted at the journal's path or
// at its temporary file never lets the daemon truncate or overwrite the
// file it points to.
func openJournalFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	return os.OpenFile(name, flag|syscall.O_NOFOLLOW, perm)
}
