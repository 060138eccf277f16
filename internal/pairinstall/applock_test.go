package pairinstall

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestLockAppDirRefusesASecondHolderNamingThePidUntilReleased(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "app") // created by the lock, as minting would
	first, err := LockAppDir(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, LockFileName)
	b, err := os.ReadFile(path)
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q, %v; want this pid", b, err)
	}
	// The file names a pid that is not the holder's, as an exited daemon's
	// would: the refusal must not repeat it.
	const stale = "424242"
	if err := os.WriteFile(path, []byte(stale+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LockAppDir(dir, 0)
	var held *HeldError
	if !errors.As(err, &held) {
		t.Fatalf("second lock: %v, want a HeldError", err)
	}
	msg := err.Error()
	if strings.Contains(msg, stale) || strings.Count(msg, "\n") != 0 || !strings.Contains(msg, path) || !strings.Contains(msg, "stop that process first") {
		t.Errorf("refusal %q: want one line naming the lock file and what to do, never the file's stale pid", msg)
	}
	want := 0
	if runtime.GOOS == "linux" {
		want = os.Getpid() // the kernel names the holder: this process
	}
	if held.PID != want {
		t.Errorf("HeldError.PID %d, want %d (the holder as the system names it, or none)", held.PID, want)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := LockAppDir(dir, 0)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Release()
}

// An app dir the daemon cannot write, on a read-only file system or not
// writable for this user, is a ReadOnlyError whose one line says what to
// do; the process test (TestAReadOnlyAppDirIsRefusedWithOneLineAndExit1)
// provokes it for real.
func TestALockFileThatCannotBeWrittenIsAReadOnlyAppDir(t *testing.T) {
	for _, cause := range []error{syscall.EROFS, fs.ErrPermission, &fs.PathError{Op: "open", Path: "x", Err: syscall.EROFS}} {
		if !readOnly(cause) {
			t.Errorf("%v: not taken as a read-only app dir", cause)
		}
	}
	if readOnly(syscall.ENOSPC) {
		t.Error("a full disk taken as a read-only app dir")
	}
	msg := (&ReadOnlyError{Dir: "/app", Err: syscall.EROFS}).Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, "/app is read-only") || !strings.Contains(msg, "make it writable") {
		t.Errorf("%q: want one line naming the app dir and what to do", msg)
	}
}
