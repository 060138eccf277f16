//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// freezableFS is a real disk that stops answering: an ext4 file system on a
// loop device, mounted for one test, which FIFREEZE (the ioctl behind
// fsfreeze(8)) freezes. While it is frozen every write(2) to it waits in
// the kernel, uninterruptibly, until FITHAW; a SIGKILL sent meanwhile
// takes the process when the write wakes, before it writes a byte. So a
// daemon whose app dir is on it can be killed with its journal's write
// held, the way a crash between two system calls would leave it, with no
// hook in the daemon.
type freezableFS struct {
	t      *testing.T
	dir    string // the mount point
	mu     sync.Mutex
	frozen bool
}

// The ioctls of linux/fs.h: _IOWR('X', 119, int) and _IOWR('X', 120, int).
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// newFreezableFS mounts a fresh 32 MiB ext4 file system for the test, or
// skips it where the machine does not allow that (not root, no loop
// device, no mkfs.ext4, a container that refuses the mount). It is
// thawed and unmounted at the cleanup.
func newFreezableFS(t *testing.T) *freezableFS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a frozen file system needs root to mount a loop device")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("a frozen file system needs %s: %v", tool, err)
		}
	}
	root := t.TempDir()
	img := filepath.Join(root, "fs.img")
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(32 << 20)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4: %v: %s", err, out)
	}
	fs := &freezableFS{t: t, dir: filepath.Join(root, "mnt")}
	if err := os.Mkdir(fs.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, fs.dir).CombinedOutput(); err != nil {
		t.Skipf("the machine does not allow a loop mount: %v: %s", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		fs.thaw()
		if out, err := exec.Command("umount", fs.dir).CombinedOutput(); err != nil {
			// Something still holds it: detach it now, gone once released.
			t.Logf("umount %s: %v: %s; detaching it lazily", fs.dir, err, out)
			_ = exec.Command("umount", "-l", fs.dir).Run()
		}
	})
	return fs
}

// freeze holds every write to the file system until thaw. A test that
// freezes calls t.Cleanup(fs.thaw) after starting what writes to it: the
// cleanups run last first, so a test that fails while frozen thaws before
// the daemon's cleanup waits for the daemon to exit.
func (fs *freezableFS) freeze() {
	fs.t.Helper()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.ioctl(ioctlFIFREEZE); err != nil {
		fs.t.Skipf("the file system cannot be frozen here: %v", err)
	}
	fs.frozen = true
}

// thaw lets the writes held go on; it is a no-op when not frozen.
func (fs *freezableFS) thaw() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if !fs.frozen {
		return
	}
	if err := fs.ioctl(ioctlFITHAW); err != nil {
		fs.t.Errorf("thaw %s: %v", fs.dir, err)
		return
	}
	fs.frozen = false
}

func (fs *freezableFS) ioctl(req uintptr) error {
	d, err := os.Open(fs.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, d.Fd(), req, 0); errno != 0 {
		return errno
	}
	return nil
}
