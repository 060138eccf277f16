//go:build unix

package statejournal

import "syscall"

// noFollow makes an open of a symbolic link fail instead of opening its
// target: a link planted at the journal's path or at its temporary file
// must never let the daemon truncate or overwrite the file it points to.
const noFollow = syscall.O_NOFOLLOW
