package pairinstall

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// LockFileName is the lock a running daemon holds in its app dir. The name
// says whose lock it is: other files in the app dir belong to PAIR or to
// other parts of this daemon (a journal, node-id.json), and none of them is
// a lock.
const LockFileName = "workload-manager.lock"

// AppDirLock is the app dir's lock, held for the life of the process. The
// operating system releases it when the process ends, however it ends, so
// a crashed or killed daemon's lock never blocks the next start; the file
// itself stays behind (removing it would let two starts lock two different
// files of the same name).
type AppDirLock struct {
	f    *os.File
	Path string
}

// HeldError is the lock taken by another process: its pid when the
// operating system names the holder of a lock (Linux, from /proc/locks),
// else 0. The pid a daemon wrote into the file is never read for it: it
// may be an exited daemon's, and an operator who acted on it could stop an
// unrelated process.
type HeldError struct {
	Path string
	PID  int
}

// Error says, in one line, who holds the lock as far as the system can
// tell, and what the operator can do.
func (e *HeldError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("another nvpair-workload-manager already runs on this app dir: pid %d holds %s; stop that process first, or give this start another --app-dir", e.PID, e.Path)
	}
	return fmt.Sprintf("another nvpair-workload-manager already runs on this app dir: a process holds %s (%s); stop that process first, or give this start another --app-dir", e.Path, holderHint(e.Path))
}

// ReadOnlyError is an app dir the daemon cannot write: on a read-only file
// system, or not writable for this user. The daemon refuses to start on
// one (spec 3.4.1): it keeps its lock, the node id it may have to mint and
// the journal of owners and leases there, and a daemon running without its
// journal would lose ownership at its next restart without a word.
type ReadOnlyError struct {
	Dir string
	Err error
}

// Error says, in one line, what is wrong and what the operator can do.
func (e *ReadOnlyError) Error() string {
	return fmt.Sprintf("app dir %s is read-only (%v): the daemon keeps its lock, node id and journal there and does not start without them; make it writable, or give this start another --app-dir", e.Dir, e.Err)
}

func (e *ReadOnlyError) Unwrap() error { return e.Err }

// readOnly reports whether err, from opening or creating the lock file,
// says the app dir cannot be written.
func readOnly(err error) bool {
	return errors.Is(err, syscall.EROFS) || errors.Is(err, fs.ErrPermission)
}

// LockAppDir takes the app dir's lock, waiting up to wait for a holder
// that is on its way out (a supervisor that restarts the worker while the
// old one still drains). It creates the app dir when missing, as minting a
// node id would. On success the file names this process's pid, for an
// operator's eyes only. A lock held past wait is a *HeldError naming the
// holder's pid when the system can tell it; an app dir it cannot write
// is a *ReadOnlyError. The lock file is never a
// symbolic link (it is opened without following one, and created only
// where nothing is): a link planted in the app dir would otherwise have
// the daemon truncate and write whatever file it points at.
func LockAppDir(appDir string, wait time.Duration) (*AppDirLock, error) {
	if err := os.MkdirAll(appDir, 0o700); err != nil {
		return nil, fmt.Errorf("create app dir %s: %w", appDir, err)
	}
	path := filepath.Join(appDir, LockFileName)
	deadline := time.Now().Add(wait)
	for {
		f, err := tryLockFile(path)
		if err == nil {
			// The pid is for the operator and for the refusal of a second
			// start; the lock is the OS's, not the file's content.
			if err := f.Truncate(0); err == nil {
				_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			}
			return &AppDirLock{f: f, Path: path}, nil
		}
		if readOnly(err) {
			return nil, &ReadOnlyError{Dir: appDir, Err: err}
		}
		if !errors.Is(err, errLockHeld) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !time.Now().Before(deadline) {
			return nil, &HeldError{Path: path, PID: lockHolder(path)}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Release gives the lock back; the process's end does the same.
func (l *AppDirLock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	return l.f.Close()
}

// errLockHeld is tryLockFile's answer for a lock another process holds.
var errLockHeld = errors.New("held by another process")
