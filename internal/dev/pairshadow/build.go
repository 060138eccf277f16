// Package pairshadow runs PAIR's own broker workload store beside the model
// in internal/dev/pairbroker, so that every run that plays a broker is judged
// by the real thing: the same frames go to both, and their Jobs lists must
// agree. PAIR's store is kept beside this repository (../shared/upstream,
// services/nvpair-ui-broker/workloadstore) and is never copied here: this
// package finds it, builds a small program of ours against it
// (_storeproc, a separate module whose go.mod is written at build time)
// and speaks to that program in JSON lines over its stdin and stdout.
//
// A clone without ../shared has no shadow: Find returns ErrNotFound, and a
// caller says so in one line and goes on without it.
package pairshadow

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"

	"nvpair-workload-manager/internal/dev/stockwlm"
)

// storeRel is PAIR's broker module inside the upstream tree.
const storeRel = "services/nvpair-ui-broker"

// upstreamRel is where the upstream tree sits relative to a directory on
// the way up from this module, as internal/dev/stockwlm looks for it.
const upstreamRel = "shared/upstream"

// ErrNotFound is returned by Find when no upstream tree holds PAIR's store.
var ErrNotFound = errors.New("PAIR's broker workload store was not found")

// The program and the file that gives the store a settable clock are ours;
// they live in a directory the go command ignores (its name starts with
// "_"), since they import PAIR's module, which the root module must not
// require.
var (
	//go:embed _storeproc/main.go
	programSource []byte
	//go:embed _storeproc/overlay/clock.go
	clockSource []byte
)

// Find returns the directory of PAIR's broker module (holding
// workloadstore): under $NVPAIR_UPSTREAM_DIR when that is set, else under
// the first shared/upstream found in start or a directory above it, the
// way internal/dev/stockwlm finds the stock worker.
func Find(start string) (string, error) {
	if dir := os.Getenv(stockwlm.EnvDir); dir != "" {
		mod := filepath.Join(dir, filepath.FromSlash(storeRel))
		if !isStoreModule(mod) {
			return "", fmt.Errorf("%w: $%s is %s, which has no %s/workloadstore", ErrNotFound, stockwlm.EnvDir, dir, storeRel)
		}
		// Absolute: a go.mod replace takes a relative path only from the
		// module that holds it.
		return filepath.Abs(mod)
	}
	abs, err := filepath.Abs(start)
	if err != nil {
		return "", err
	}
	for dir := abs; ; {
		mod := filepath.Join(dir, filepath.FromSlash(upstreamRel), filepath.FromSlash(storeRel))
		if isStoreModule(mod) {
			return mod, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%w: no %s/%s in %s or any directory above it (set $%s to the upstream tree)",
				ErrNotFound, upstreamRel, storeRel, abs, stockwlm.EnvDir)
		}
		dir = parent
	}
}

func isStoreModule(dir string) bool {
	_, errMod := os.Stat(filepath.Join(dir, "go.mod"))
	_, errStore := os.Stat(filepath.Join(dir, "workloadstore", "store.go"))
	return errMod == nil && errStore == nil
}

// goLine reads the go directive of PAIR's module: the program's module
// must declare at least that version, and declaring the same one leaves
// its go.mod with nothing to tidy.
var goLine = regexp.MustCompile(`(?m)^go\s+(\S+)\s*$`)

// Build builds the store program against PAIR's module in mod (as Find
// returns it) into outDir and returns the executable's path. Like
// stockwlm.Build it never changes the upstream tree nor reaches the
// network: the program's go.mod and the overlay that adds the clock file
// to PAIR's package are written into outDir, which the build alone reads.
func Build(mod, outDir string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(mod, "go.mod"))
	if err != nil {
		return "", err
	}
	m := goLine.FindSubmatch(gomod)
	if m == nil {
		return "", fmt.Errorf("%s/go.mod has no go line", mod)
	}
	src := filepath.Join(outDir, "storeproc-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	// The overlay adds our clock file to PAIR's package for this build
	// only: go build reads it in place of a file that does not exist.
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {
		filepath.Join(mod, "workloadstore", "zz_pairshadow_clock.go"): filepath.Join(src, "clock.go.overlay"),
	}})
	if err != nil {
		return "", err
	}
	files := map[string][]byte{
		"main.go": programSource,
		"go.mod": fmt.Appendf(nil, "module nvpair-pairshadow-storeproc\n\ngo %s\n\nrequire nvpair-ui-broker v0.0.0\n\nreplace nvpair-ui-broker => %s\n",
			m[1], modPath(mod)),
		"clock.go.overlay": clockSource,
		"overlay.json":     overlay,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			return "", err
		}
	}
	out := filepath.Join(outDir, "pair-workloadstore")
	if runtime.GOOS == "windows" {
		out += ".exe"
	}
	cmd := exec.Command(stockwlm.GoTool(), "build", "-mod=readonly", "-buildvcs=false", "-overlay", "overlay.json", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOPROXY=off", "GOTOOLCHAIN=local", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building PAIR's workload store program against %s: %v\n%s", mod, err, b)
	}
	return out, nil
}

// modPath quotes dir for a go.mod replace directive when it holds a space
// or another character the directive cannot take bare.
func modPath(dir string) string {
	if strings.ContainsAny(dir, " \t\"'`") {
		return strconv.Quote(dir)
	}
	return dir
}
