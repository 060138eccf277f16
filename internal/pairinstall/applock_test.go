package pairinstall

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestLockAppDirRefusesASecondHolderNamingThePidUntilReleased(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "app") // created by the lock, as minting would
	first, err := LockAppDir(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, LockFileName))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q, %v; want this pid", b, err)
	}
	_, err = LockAppDir(dir, 0)
	var held *HeldError
	if !errors.As(err, &held) || held.PID != os.Getpid() {
		t.Fatalf("second lock: %v, want a HeldError naming pid %d", err, os.Getpid())
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
