package pairinstall

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The first start makes the key and every later start reads the same
// one: a mark made before a restart checks after it.
func TestTheIngressKeyIsMadeOnceAndReadBackAfter(t *testing.T) {
	app := t.TempDir()
	first, err := LoadIngressKey(app)
	if err != nil || !first.Created || first.Notice != "" || len(first.Key) != ingressKeyBytes {
		t.Fatalf("first start: %+v, %v", first, err)
	}
	again, err := LoadIngressKey(app)
	if err != nil || again.Created || !bytes.Equal(again.Key, first.Key) {
		t.Fatalf("second start: created %v, same key %v, %v", again.Created, bytes.Equal(again.Key, first.Key), err)
	}
	st, err := os.Stat(first.Path)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" && st.Mode().Perm() != 0o600 {
		t.Fatalf("the key file's mode is %v, want 0600", st.Mode().Perm())
	}
	if tmps, _ := filepath.Glob(filepath.Join(app, "*.tmp")); len(tmps) != 0 {
		t.Fatalf("temporary files left: %v", tmps)
	}
	if other, _ := LoadIngressKey(t.TempDir()); bytes.Equal(other.Key, first.Key) {
		t.Fatal("two app dirs got the same key")
	}
}

// A file at the key's name that is not a key costs the marks it made,
// never a start: it is set aside, with a notice, and a new key made.
func TestAFileThatIsNotAKeyIsSetAsideForANewOne(t *testing.T) {
	for name, plant := range map[string]func(path string) error{
		"short":       func(p string) error { return os.WriteFile(p, []byte("abcd\n"), 0o600) },
		"not hex":     func(p string) error { return os.WriteFile(p, []byte(strings.Repeat("z", 64)), 0o600) },
		"a directory": func(p string) error { return os.Mkdir(p, 0o700) },
	} {
		t.Run(name, func(t *testing.T) {
			app := t.TempDir()
			path := filepath.Join(app, IngressKeyFileName)
			if err := plant(path); err != nil {
				t.Fatal(err)
			}
			k, err := LoadIngressKey(app)
			if err != nil || !k.Created || len(k.Key) != ingressKeyBytes || !strings.Contains(k.Notice, "moved aside") {
				t.Fatalf("%+v, %v", k, err)
			}
			if aside, _ := filepath.Glob(path + ".aside-*"); len(aside) != 1 {
				t.Fatalf("set aside: %v, want the one file", aside)
			}
			if again, err := LoadIngressKey(app); err != nil || !bytes.Equal(again.Key, k.Key) {
				t.Fatalf("the new key is not read back: %v", err)
			}
		})
	}
}

// A key that cannot be made is an error for the caller to report: the
// daemon then writes no mark.
func TestAKeyThatCannotBeMadeIsAnError(t *testing.T) {
	if _, err := LoadIngressKey(filepath.Join(t.TempDir(), "missing", "dir")); err == nil {
		t.Fatal("no error for an app dir that is not there")
	}
}
