package pairinstall

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// MaxFileBytes bounds every file the daemon reads from its cluster
// and app directories: node.crt, node.key, admission.json, the pins in
// trusted/, identity.json and node-id.json. Each is a few kilobytes at
// most (a pin is one certificate, about 1 KiB); anything far larger is not
// one of them, and reading it whole (a file replaced by a device or a huge
// log) would grow the daemon without bound.
const MaxFileBytes = 64 << 10

// ErrNotRegularFile and ErrFileTooLarge are the two reasons a present file
// is refused without being parsed; the trust reload counts them apart.
var (
	ErrNotRegularFile = errors.New("not a regular file")
	ErrFileTooLarge   = fmt.Errorf("larger than %d bytes", MaxFileBytes)
)

// ReadBounded reads a small file, refusing one that is not a regular file
// or is over MaxFileBytes. A missing file is an error wrapping
// os.ErrNotExist.
func ReadBounded(path string) ([]byte, error) {
	b, _, err := ReadRegularFile(path)
	return b, err
}

// ReadRegularFile reads path when it is a regular file (a symlink is
// followed to one) of at most MaxFileBytes, and returns its content
// and what Stat said of the opened file. The check is made on the opened
// file, not on the path, so a file swapped in between the check and the
// read cannot slip past it; and the open does not block, so a named pipe is
// refused rather than waited on. The FileInfo is returned whenever the file
// was opened, refused or not, so the caller can tell later whether it
// changed.
func ReadRegularFile(path string) ([]byte, os.FileInfo, error) {
	f, err := openForRead(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fi, fmt.Errorf("%w: %s", ErrNotRegularFile, fileKind(fi.Mode()))
	}
	// The size Stat reports is only a hint (a file may grow while it is
	// read): the limited read below is the bound.
	if fi.Size() > MaxFileBytes {
		return nil, fi, ErrFileTooLarge
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fi, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > MaxFileBytes {
		return nil, fi, ErrFileTooLarge
	}
	return b, fi, nil
}

// fileKind names the type of a file that is not regular, for a warning.
func fileKind(mode fs.FileMode) string {
	switch t := mode.Type(); {
	case t&fs.ModeDir != 0:
		return "a directory"
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case t&fs.ModeCharDevice != 0:
		return "a character device"
	case t&fs.ModeDevice != 0:
		return "a device"
	case t&fs.ModeSocket != 0:
		return "a socket"
	default:
		return "an irregular file"
	}
}

// maxReasonBytes bounds a value a file put into a log line or an error: an
// admission record's clusterId, an identity document's node_uuid. It is the
// daemon's bound on every client-caused reason (spec.md 3.7), kept here
// because this package imports nothing of the daemon's.
const maxReasonBytes = 256

// ClipReason bounds s to maxReasonBytes, on a UTF-8 boundary, as the
// daemon's httpguard.ClipReason does.
func ClipReason(s string) string {
	if len(s) <= maxReasonBytes {
		return s
	}
	return strings.ToValidUTF8(s[:maxReasonBytes], "") + "... (truncated)"
}
