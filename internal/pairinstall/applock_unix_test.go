//go:build unix

package pairinstall

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A symbolic link planted at the lock file's name is refused, and the file
// it points at is neither truncated nor written.
func TestLockAppDirRefusesALockFileThatIsASymlink(t *testing.T) {
	dir := t.TempDir()
	precious := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(precious, []byte("keep me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(precious, filepath.Join(dir, LockFileName)); err != nil {
		t.Fatal(err)
	}
	l, err := LockAppDir(dir, 0)
	if err == nil {
		l.Release()
		t.Fatal("a lock file that is a symlink was taken")
	}
	if !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("error %q: want it to say the lock file is a symbolic link", err)
	}
	if b, _ := os.ReadFile(precious); string(b) != "keep me\n" {
		t.Errorf("the symlink's target now holds %q", b)
	}
	// A dangling link is refused too, and creates nothing where it points.
	dangling := filepath.Join(t.TempDir(), "made")
	dir2 := t.TempDir()
	if err := os.Symlink(dangling, filepath.Join(dir2, LockFileName)); err != nil {
		t.Fatal(err)
	}
	if l, err := LockAppDir(dir2, 0); err == nil {
		l.Release()
		t.Fatal("a dangling symlink was taken as the lock file")
	}
	if _, err := os.Lstat(dangling); !os.IsNotExist(err) {
		t.Errorf("the dangling link's target was created: %v", err)
	}
}

func TestLockAppDirRefusesALockFileThatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, LockFileName), 0o700); err != nil {
		t.Fatal(err)
	}
	if l, err := LockAppDir(dir, 0); err == nil {
		l.Release()
		t.Fatal("a directory was taken as the lock file")
	}
}
