package statejournal

import (
	"os"
	"syscall"
)

// dataSync makes what was written to f durable with fdatasync(2): its data
// and the metadata a read of it needs (its size), not its times. Into the
// preallocated end of the file (preallocBytes) a group changes no
// metadata at all, so the device writes its data pages and nothing else.
func dataSync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}
