//go:build unix

package readmetest

import (
	"os/exec"
	"path"
	"strings"
	"testing"
)

// TestGoBuildOutputsAreIgnored: the binary `go build ./<pkg>` leaves in
// the module root, for every main package of the module (the daemon, the
// dev cluster, the benchmark harness, the producer example, the CPU
// burner), for Linux, macOS and Windows, is one git ignores, so a build
// never shows in git status.
func TestGoBuildOutputsAreIgnored(t *testing.T) {
	root := moduleRoot(t)
	git, err := exec.LookPath("git")
	if err != nil {
		skipOrFail(t, "git is not installed")
	}
	if err := exec.Command(git, "-C", root, "rev-parse", "--git-dir").Run(); err != nil {
		skipOrFail(t, "the module root is not a git checkout")
	}
	list := exec.Command("go", "list", "-f", "{{.Name}} {{.ImportPath}}", "./...")
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var mains []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if name, importPath, ok := strings.Cut(line, " "); ok && name == "main" {
			mains = append(mains, path.Base(importPath)) // go build names the binary so
		}
	}
	if len(mains) < 5 {
		t.Fatalf("found main packages %v, want the daemon, devcluster, wlmbench, producer and cpuburn", mains)
	}
	for _, m := range mains {
		for _, bin := range []string{m, m + ".exe"} {
			check := exec.Command(git, "-C", root, "check-ignore", "-q", "--no-index", bin)
			if err := check.Run(); err != nil {
				t.Errorf("go build leaves %s in the module root and git does not ignore it (%v)", bin, err)
			}
		}
	}
	if err := exec.Command(git, "-C", root, "check-ignore", "-q", "--no-index", "README.md").Run(); err == nil {
		t.Error("git ignores README.md: the ignore rules are too broad")
	}
}
