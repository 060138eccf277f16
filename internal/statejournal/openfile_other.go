//go:build !unix

package statejournal

// noFollow is empty outside Unix. Windows has no O_NOFOLLOW; Open still
// checks with Lstat before the open, and with Stat of the opened file
// after it, that the path names a regular file, and creates every new
// file with O_EXCL so a planted file or link is never reused.
const noFollow = 0
