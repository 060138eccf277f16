package pairinstall

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// HeldError is the lock taken by another process: the pid it wrote, or 0
// when it wrote none yet (it locked an instant ago) or the file is unreadable.
type HeldError struct {
	Path string
	PID  int
}

func (e *HeldError) Error() string {
	who := "another nvpair-workload-manager"
	if e.PID > 0 {
		who += " (pid " + strconv.Itoa(e.PID) + ")"
	}
	return fmt.Sprintf("%s already runs on this app dir: it holds %s; stop it first, or give this one another --app-dir", who, e.Path)
}

// LockAppDir takes the app dir's lock, waiting up to wait for a holder
// that is on its way out (a supervisor that restarts the worker while the
// old one still drains). It creates the app dir when missing, as minting a
// node id would. On success the file names this process's pid. A lock held
// past wait is a *HeldError naming the holder's pid.
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
		if !errors.Is(err, errLockHeld) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !time.Now().Before(deadline) {
			return nil, &HeldError{Path: path, PID: readLockPID(path)}
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

// readLockPID reads the pid a holder wrote; 0 when there is none to read.
func readLockPID(path string) int {
	f, err := openForRead(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	b := make([]byte, 32)
	n, _ := f.Read(b)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
