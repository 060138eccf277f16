package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"nvpair-workload-manager/internal/dev/pairshadow"
)

// The tests that start the daemon's binary live in e2e/, with their own
// harness. What stays here is what the root package's own tests share.

func TestMain(m *testing.M) {
	code := m.Run()
	pairshadow.RemoveProgram() // PAIR's store program, when a Jobs list built it
	os.Exit(code)
}

// goToolPath is the go command that builds the daemon under test.
func goToolPath() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}
