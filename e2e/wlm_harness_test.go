//go:build unix

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"nvpair-workload-manager/internal/dev/pairbroker"
)

// The producer command, nvpair-wlm (clients/go/cmd/nvpair-wlm), as its
// users run it: built from this checkout's client module, started as a
// process of its own against the real daemon. Its run tests are in
// wlmrun_test.go, its Slurm bridge's in slurm_test.go.

var (
	wlmOnce sync.Once
	wlmPath string
	wlmErr  error
)

// wlmBinary builds nvpair-wlm once per test run, beside the daemon (so
// TestMain removes both), and returns its path. It skips under -short.
func wlmBinary(t testing.TB) string {
	t.Helper()
	daemonBinary(t) // makes binDir, and skips under -short
	wlmOnce.Do(func() {
		out := filepath.Join(binDir, "nvpair-wlm")
		build := exec.Command(goToolPath(), "build", "-o", out, "./cmd/nvpair-wlm")
		build.Dir = filepath.Join(moduleRoot(t), "clients", "go") // a module of its own (decision 0028)
		if b, err := build.CombinedOutput(); err != nil {
			wlmErr = fmt.Errorf("go build ./cmd/nvpair-wlm in clients/go: %v\n%s", err, b)
			return
		}
		wlmPath = out
	})
	if wlmErr != nil {
		t.Fatal(wlmErr)
	}
	return wlmPath
}

// shownOf is what a Jobs list shows of workload id: its record, and
// whether it holds one.
func shownOf(s *pairbroker.Store, origin, id string) (pairbroker.Record, bool) {
	return s.Get(origin, id)
}

// infoOf decodes a record's workload object.
func infoOf(t testing.TB, r pairbroker.Record) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Info, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// upsertStates are the states d wrote to its broker for workload id, in
// order, a state repeated in a row (a lease's renewal, a re-assertion)
// written once.
func upsertStates(d *daemonProc, id string) []string {
	var out []string
	for _, w := range d.Upserts() {
		s, _ := w["state"].(string)
		if w["id"] == id && (len(out) == 0 || out[len(out)-1] != s) {
			out = append(out, s)
		}
	}
	return out
}

// skipOrFailWithout skips a test this machine cannot run, saying why,
// and fails it under CI=true, where .ci/run installs what it needs.
func skipOrFailWithout(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s (.ci/run installs it)", why)
	}
	t.Skip(why)
}
