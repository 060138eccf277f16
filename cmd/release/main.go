// Command release builds the daemon's release binaries: one per supported
// platform (Linux, macOS and Windows on amd64 and arm64), stamped with the
// version, reproducible (-trimpath, no cgo, no build ID, no local paths),
// into dist/ with a SHA256SUMS file that `sha256sum -c` (Linux) and
// `shasum -a 256 -c` (macOS) check. Run it from a clone:
//
//	go run ./cmd/release                   # version from git describe
//	go run ./cmd/release --version 1.0.0   # a stamped release
//
// Each binary is named nvpair-workload-manager-VERSION-GOOS-GOARCH (.exe on
// Windows); rename it to nvpair-workload-manager(.exe) when installing. The
// binary for the machine it runs on is run once with --version, and the
// build fails unless it prints the version it was stamped with.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"

	"nvpair-workload-manager/internal/cliflags"
)

// daemonName is the daemon's binary name, the prefix of every release file.
const daemonName = "nvpair-workload-manager"

// targets are the platforms PAIR ships on, as GOOS/GOARCH.
var targets = []string{
	"linux/amd64", "linux/arm64",
	"darwin/amd64", "darwin/arm64",
	"windows/amd64", "windows/arm64",
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	version string
	out     string
	targets []string
}

// versionPattern keeps the version safe in a file name and an -ldflags
// value: a tag like v1.0.0, 1.0.0-rc.1 or a git describe output.
var versionPattern = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$`)

func parseFlags(args []string) (config, error) {
	var c config
	var only string
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.version, "version", "", "the version to stamp (default: git describe --tags --always --dirty, else dev)")
	fs.StringVar(&c.out, "out", "dist", "the directory the binaries and SHA256SUMS go to")
	fs.StringVar(&only, "targets", strings.Join(targets, ","), "GOOS/GOARCH pairs to build, comma-separated")
	explain := cliflags.Explain(fs, map[string]string{"version": "VERSION", "out": "DIR", "targets": "OS/ARCH,..."})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stdout, "usage: go run ./cmd/release [flags]\n\nBuilds stamped release binaries and SHA256SUMS.\n\n")
			fs.SetOutput(os.Stdout)
			fs.PrintDefaults()
		}
		return c, explain(err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.version != "" && !versionPattern.MatchString(c.version) {
		return c, fmt.Errorf("--version %q: must be letters, digits, '.', '+', '_' or '-', like 1.0.0", c.version)
	}
	if c.out == "" {
		return c, errors.New("--out: must name a directory, like --out dist")
	}
	for _, t := range strings.Split(only, ",") {
		if !slices.Contains(targets, t) {
			return c, fmt.Errorf("--targets: %q is not one of %s", t, strings.Join(targets, ", "))
		}
		c.targets = append(c.targets, t)
	}
	return c, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	c, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "release: %v\n", err)
		return 2
	}
	if err := release(c, stdout); err != nil {
		fmt.Fprintf(stderr, "release: %v\n", err)
		return 1
	}
	return 0
}

// release builds every target into c.out and writes SHA256SUMS.
func release(c config, stdout io.Writer) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if c.version == "" {
		c.version = gitVersion(root)
	}
	out := c.out
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	// Only this tool's own files are removed: --out may name a directory
	// that holds other things.
	old, _ := filepath.Glob(filepath.Join(out, daemonName+"-*"))
	for _, f := range append(old, filepath.Join(out, "SHA256SUMS")) {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	var sums strings.Builder
	for _, t := range c.targets {
		goos, goarch, _ := strings.Cut(t, "/")
		name := fmt.Sprintf("%s-%s-%s-%s", daemonName, c.version, goos, goarch)
		if goos == "windows" {
			name += ".exe"
		}
		bin := filepath.Join(out, name)
		build := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
			"-ldflags", "-s -w -buildid= -X main.Version="+c.version, "-o", bin, ".")
		build.Dir = root
		build.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0", "GOFLAGS=")
		if msg, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("go build for %s: %v\n%s", t, err, msg)
		}
		sum, err := fileSHA256(bin)
		if err != nil {
			return err
		}
		fmt.Fprintf(&sums, "%s  %s\n", sum, name) // sha256sum's format: two spaces
		if goos == runtime.GOOS && goarch == runtime.GOARCH {
			if err := checkVersion(bin, c.version); err != nil {
				return err
			}
		}
		fmt.Fprintf(stdout, "%s  %s\n", sum, filepath.Join(c.out, name))
	}
	if err := os.WriteFile(filepath.Join(out, "SHA256SUMS"), []byte(sums.String()), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %d binaries of %s %s and %s\n", len(c.targets), daemonName, c.version, filepath.Join(c.out, "SHA256SUMS"))
	return nil
}

// moduleRoot is the directory of the module's go.mod.
func moduleRoot() (string, error) {
	b, err := exec.Command("go", "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(b))
	if err != nil || gomod == "" || gomod == os.DevNull {
		return "", errors.New("run it inside the module (go run ./cmd/release from the clone's root)")
	}
	return filepath.Dir(gomod), nil
}

// gitVersion is git describe's name of the checkout, else "dev". A version
// taken from git is cleaned to what versionPattern allows.
func gitVersion(root string) string {
	cmd := exec.Command("git", "describe", "--tags", "--always", "--dirty")
	cmd.Dir = root
	b, err := cmd.Output()
	v := strings.TrimSpace(string(b))
	if err != nil || !versionPattern.MatchString(v) {
		return "dev"
	}
	return v
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// checkVersion runs bin --version and wants the stamped version in it.
func checkVersion(bin, version string) error {
	b, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %v", bin, err)
	}
	if f := strings.Fields(string(b)); len(f) < 2 || f[0] != daemonName || f[1] != version {
		return fmt.Errorf("%s --version printed %q, want %q second", bin, bytes.TrimSpace(b), version)
	}
	return nil
}
