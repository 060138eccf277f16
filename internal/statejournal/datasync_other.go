//go:build !linux

package statejournal

import "os"

// dataSync is File.Sync outside Linux: fcntl(F_FULLFSYNC) on macOS,
// FlushFileBuffers on Windows, fsync(2) elsewhere (see the package
// comment). Go offers no fdatasync there, and a preallocated end costs
// nothing to keep.
func dataSync(f *os.File) error { return f.Sync() }
