package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

var uuidV4Pattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestLoadNodeIDCreatesAV4UUIDWithMode0600(t *testing.T) {
	appDir := filepath.Join(t.TempDir(), "not", "yet", "there")
	id, err := loadNodeID(appDir)
	if err != nil {
		t.Fatal(err)
	}
	if !uuidV4Pattern.MatchString(id) {
		t.Fatalf("created id %q is not a lowercase version 4 UUID", id)
	}
	path := filepath.Join(appDir, "node-id")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(b)) != id || strings.Count(string(b), "\n") > 1 {
		t.Fatalf("node-id file holds %q, want the id %q on one line", b, id)
	}
	if runtime.GOOS != "windows" {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if perm := st.Mode().Perm(); perm != 0o600 {
			t.Fatalf("node-id mode = %v, want 0600", perm)
		}
	}

	again, err := loadNodeID(appDir)
	if err != nil || again != id {
		t.Fatalf("second load = %q, %v; want the same id %q", again, err, id)
	}
}

func TestLoadNodeIDCreatesDistinctIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 20 {
		id, err := loadNodeID(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			t.Fatalf("id %s created twice", id)
		}
		seen[id] = true
	}
}

func TestLoadNodeIDReadsAnExistingID(t *testing.T) {
	const id = "3F2504E0-4F89-41D3-9A0C-0305E82C3301"
	for _, content := range []string{id, id + "\n", "  " + id + "  \r\n", "\n\t" + id + "\n\n"} {
		appDir := t.TempDir()
		writeFile(t, filepath.Join(appDir, "node-id"), content)
		got, err := loadNodeID(appDir)
		if err != nil || got != id {
			t.Errorf("node-id %q: loaded %q, %v; want %q", content, got, err, id)
		}
		if b, _ := os.ReadFile(filepath.Join(appDir, "node-id")); string(b) != content {
			t.Errorf("loading rewrote node-id %q to %q", content, b)
		}
	}
}

func TestLoadNodeIDRefusesAFileThatIsNotAUUID(t *testing.T) {
	for _, content := range []string{
		"",
		"\n",
		"not-a-uuid",
		"3f2504e0-4f89-41d3-9a0c-0305e82c330",   // one digit short
		"3f2504e0-4f89-41d3-9a0c-0305e82c33011", // one digit long
		"3f2504e04f8941d39a0c0305e82c3301",      // no dashes
		"{3f2504e0-4f89-41d3-9a0c-0305e82c3301}",
		"3f2504e0-4f89-41d3-9a0c-0305e82c3301\n3f2504e0-4f89-41d3-9a0c-0305e82c3302",
		"g f2504e0-4f89-41d3-9a0c-0305e82c3301",
	} {
		appDir := t.TempDir()
		writeFile(t, filepath.Join(appDir, "node-id"), content)
		if id, err := loadNodeID(appDir); err == nil {
			t.Errorf("node-id %q accepted as %q", content, id)
		}
		if b, _ := os.ReadFile(filepath.Join(appDir, "node-id")); string(b) != content {
			t.Errorf("a refused node-id %q was overwritten with %q", content, b)
		}
	}
}

func TestLoadNodeIDRefusesAnUnreadablePath(t *testing.T) {
	appDir := t.TempDir()
	if err := os.Mkdir(filepath.Join(appDir, "node-id"), 0o700); err != nil {
		t.Fatal(err)
	}
	if id, err := loadNodeID(appDir); err == nil {
		t.Fatalf("node-id that is a directory resolved to %q", id)
	}
}

func TestLoadNodeIDRefusesAnAppDirThatCannotBeCreated(t *testing.T) {
	parent := t.TempDir()
	blocker := filepath.Join(parent, "file")
	writeFile(t, blocker, "x")
	if id, err := loadNodeID(filepath.Join(blocker, "app")); err == nil {
		t.Fatalf("app dir under a regular file resolved to %q", id)
	}
}

func TestLoadNodeIDRefusesADanglingSymlinkWithoutLooping(t *testing.T) {
	// A dangling symlink is "not there" to a read and "already there" to an
	// exclusive create: loading must end in an error, not go back and forth
	// between the two. The check runs in a child process because an endless
	// recursion is a fatal stack overflow that no test could recover from.
	if runtime.GOOS == "windows" {
		t.Skip("symlinks need a privilege on Windows")
	}
	if os.Getenv("NVPAIR_NODEID_DANGLING_CHILD") == "1" {
		debug.SetMaxStack(32 << 20) // an unbounded recursion dies in well under a second
		dir := t.TempDir()
		if err := os.Symlink(filepath.Join(dir, "missing"), filepath.Join(dir, "node-id")); err != nil {
			t.Fatal(err)
		}
		if id, err := loadNodeID(dir); err == nil {
			t.Fatalf("a dangling node-id symlink resolved to %q", id)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestLoadNodeIDRefusesADanglingSymlinkWithoutLooping$", "-test.count=1")
	cmd.Env = append(os.Environ(), "NVPAIR_NODEID_DANGLING_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		lines := strings.SplitN(string(out), "\n", 6)
		t.Fatalf("loadNodeID on a dangling node-id symlink: child %v:\n%s", err, strings.Join(lines[:min(5, len(lines))], "\n"))
	}
}
