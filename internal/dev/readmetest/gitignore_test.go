//go:build unix

package readmetest

import (
	"os/exec"
	"path"
	"strings"
	"testing"
)

// TestGoBuildOutputsAreIgnored: the binary `go build ./<pkg>` leaves in
// the module root (the producer example's and the client module's
// commands' in their own module's directory), for every main package (the
// daemon, the dev cluster, the benchmark harness, the producer example,
// the CPU burner, nvpair-wlm, the conformance producer), for Linux, macOS
// and Windows, is one git ignores, so a build never shows in git status.
func TestGoBuildOutputsAreIgnored(t *testing.T) {
	root := moduleRoot(t)
	git, err := exec.LookPath("git")
	if err != nil {
		skipOrFail(t, "git is not installed")
	}
	if err := exec.Command(git, "-C", root, "rev-parse", "--git-dir").Run(); err != nil {
		skipOrFail(t, "the module root is not a git checkout")
	}
	// The example producer is a module of its own (it takes the client as
	// a producer outside the repository does), so go build leaves its
	// binary in its own directory.
	var mains []string // paths from the root
	for _, dir := range []string{".", "examples/producer", "clients/go"} {
		list := exec.Command("go", "list", "-f", "{{.Name}} {{.ImportPath}}", "./...")
		list.Dir = path.Join(root, dir)
		out, err := list.Output()
		if err != nil {
			t.Fatalf("go list in %s: %v", dir, err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if name, importPath, ok := strings.Cut(line, " "); ok && name == "main" {
				mains = append(mains, path.Join(dir, path.Base(importPath))) // go build names the binary so
			}
		}
	}
	if len(mains) < 7 {
		t.Fatalf("found main packages %v, want the daemon, devcluster, wlmbench, producer, cpuburn, nvpair-wlm and conformproducer", mains)
	}
	for _, m := range mains {
		for _, bin := range []string{m, m + ".exe"} {
			check := exec.Command(git, "-C", root, "check-ignore", "-q", "--no-index", bin)
			if err := check.Run(); err != nil {
				t.Errorf("go build leaves %s and git does not ignore it (%v)", bin, err)
			}
		}
	}
	if err := exec.Command(git, "-C", root, "check-ignore", "-q", "--no-index", "README.md").Run(); err == nil {
		t.Error("git ignores README.md: the ignore rules are too broad")
	}
}
