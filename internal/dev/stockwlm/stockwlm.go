// Package stockwlm finds the stock upstream workload manager's published
// source, which is kept beside this repository (../shared/upstream) as a
// test peer, and builds it, so that the tests and the dev cluster can run
// it next to this daemon. Nothing of that source is copied here: it is
// only located and handed to the go command. The package must never
// import another package of this module, nor net/http: it runs the go
// command and reads directories, nothing more.
package stockwlm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// EnvDir names the environment variable that overrides where the upstream
// tree is: the directory holding services/nvpair-workload-manager (the
// repository's ../shared/upstream). When it is set, nothing is searched.
const EnvDir = "NVPAIR_UPSTREAM_DIR"

// sourceRel is the stock daemon's package inside the upstream tree.
const sourceRel = "services/nvpair-workload-manager"

// upstreamRel is where the upstream tree sits relative to a directory on
// the way up from this module: the module is checked out (or worked on,
// as a git worktree) next to a shared directory holding it.
const upstreamRel = "shared/upstream"

// ErrNotFound is returned by Find when no upstream tree holds the stock
// daemon's source. A caller that can do without the stock peer (a test)
// skips on it; its message says where it looked.
var ErrNotFound = errors.New("the stock workload manager's source was not found")

// Find returns the stock daemon's source directory: the one under
// $NVPAIR_UPSTREAM_DIR when that is set, else under the first
// shared/upstream found in start or a directory above it. An error wraps
// ErrNotFound when there is none, and names where it looked.
func Find(start string) (string, error) {
	if dir := os.Getenv(EnvDir); dir != "" {
		src := filepath.Join(dir, filepath.FromSlash(sourceRel))
		if !isPackageDir(src) {
			return "", fmt.Errorf("%w: $%s is %s, which has no %s with Go files", ErrNotFound, EnvDir, dir, sourceRel)
		}
		return src, nil
	}
	abs, err := filepath.Abs(start)
	if err != nil {
		return "", err
	}
	for dir := abs; ; {
		src := filepath.Join(dir, filepath.FromSlash(upstreamRel), filepath.FromSlash(sourceRel))
		if isPackageDir(src) {
			return src, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%w: no %s/%s in %s or any directory above it (set $%s to the upstream tree)",
				ErrNotFound, upstreamRel, sourceRel, abs, EnvDir)
		}
		dir = parent
	}
}

// isPackageDir reports whether dir is a directory holding a go.mod and at
// least one Go file: the stock daemon's module, not an empty checkout.
func isPackageDir(dir string) bool {
	if fi, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") {
			return true
		}
	}
	return false
}

// Build builds the stock daemon from src (as Find returns it) into outDir
// and returns the executable's path. goTool is the go command to use ("":
// the one on PATH, else GOROOT's).
//
// The build must neither change the upstream tree nor reach the network:
// the module is read only (-mod=readonly, and the output goes to outDir),
// no module proxy is asked (GOPROXY=off: the stock daemon needs no module
// outside its tree, and one that did should fail here rather than be
// fetched), no toolchain is downloaded (GOTOOLCHAIN=local), no workspace
// file of the caller's applies (GOWORK=off), and no VCS stamping is
// attempted on a tree that may not be a repository (-buildvcs=false).
func Build(goTool, src, outDir string) (string, error) {
	if goTool == "" {
		goTool = GoTool()
	}
	out := filepath.Join(outDir, "stock-nvpair-workload-manager")
	if runtime.GOOS == "windows" {
		out += ".exe"
	}
	cmd := exec.Command(goTool, "build", "-mod=readonly", "-buildvcs=false", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOPROXY=off", "GOTOOLCHAIN=local", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the stock workload manager in %s: %v\n%s", src, err, b)
	}
	if _, err := os.Stat(out); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("building the stock workload manager in %s: go build wrote no %s", src, out)
	}
	return out, nil
}

// GoTool is the go command: the one on PATH, else GOROOT's.
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}
