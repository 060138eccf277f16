package stockwlm

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A tree laid out as the repository's neighbourhood is: the module two
// levels below a directory holding shared/upstream.
func TestFindWalksUpToTheSharedUpstreamTree(t *testing.T) {
	root := t.TempDir()
	src := filepath.Join(root, "shared", "upstream", "services", "nvpair-workload-manager")
	module := filepath.Join(root, "wt", "repo")
	for _, d := range []string{src, module} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(EnvDir, "")
	if _, err := Find(module); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Find with an empty source dir: %v, want ErrNotFound", err)
	}
	for name, text := range map[string]string{"go.mod": "module x\n", "main.go": "package main\n"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := Find(module); err != nil || got != src {
		t.Fatalf("Find(%s) = %q, %v; want %q", module, got, err, src)
	}
	t.Setenv(EnvDir, filepath.Join(root, "elsewhere"))
	if _, err := Find(module); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Find with $%s naming a dir without the source: %v, want ErrNotFound (the variable is not a hint)", EnvDir, err)
	}
	t.Setenv(EnvDir, filepath.Join(root, "shared", "upstream"))
	if got, err := Find(t.TempDir()); err != nil || got != src {
		t.Fatalf("Find with $%s set = %q, %v; want %q", EnvDir, got, err, src)
	}
}
