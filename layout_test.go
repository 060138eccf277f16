package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// modulePath is this module's path, the prefix of every package of its own.
const modulePath = "nvpair-workload-manager"

// TestInternalPackagesImportOnlyWhatTheyMay holds the layout of spec.md
// section 2 to its one-way dependencies. Each internal package names the
// packages of this module it may reach, directly or through another, and
// `go list -deps` shows it reaches no other; so a contributor who makes,
// say, the PAIR installation import the frame format learns it here rather
// than in review. Each carved package adds its row.
func TestInternalPackagesImportOnlyWhatTheyMay(t *testing.T) {
	rules := []struct {
		pkg string   // the package, relative to the module
		may []string // the module's packages it may reach, relative to the module
		// never lists standard packages it must not reach either, where its
		// package comment promises so.
		never []string
	}{
		{pkg: "internal/pairinstall", may: nil, never: []string{"net/http"}},
		{pkg: "internal/promtext", may: nil, never: []string{"net/http"}},
		{pkg: "internal/brokeripc", may: nil, never: []string{"net/http"}},
		{pkg: "internal/wireframe", may: nil, never: []string{"net/http"}},
		{pkg: "internal/testframe", may: []string{"internal/wireframe"}, never: []string{"net", "net/http"}},
		{pkg: "internal/httpguard", may: []string{"internal/promtext"}},
		{pkg: "internal/pairbroker", may: nil, never: []string{"net", "net/http", "os/exec"}},
		{pkg: "internal/cliflags", may: nil, never: []string{"net/http"}},
		{pkg: "internal/stockwlm", may: nil, never: []string{"net/http"}},
		{pkg: "internal/statejournal", may: nil, never: []string{"net/http"}},
		{pkg: "internal/statetable", may: []string{"internal/wireframe"}, never: []string{"net/http"}},
		{pkg: "internal/pairshadow", may: []string{"internal/pairbroker", "internal/stockwlm"}, never: []string{"net", "net/http"}},
	}
	for _, r := range rules {
		t.Run(r.pkg, func(t *testing.T) {
			deps := listDeps(t, "./"+r.pkg)
			if !slices.Contains(deps, modulePath+"/"+r.pkg) {
				t.Fatalf("go list -deps ./%s does not list the package itself: %q", r.pkg, deps)
			}
			for _, dep := range deps {
				rel, own := strings.CutPrefix(dep, modulePath+"/")
				switch {
				case dep == modulePath:
					t.Errorf("%s reaches the root package", r.pkg)
				case own && rel != r.pkg && !slices.Contains(r.may, rel):
					t.Errorf("%s reaches %s, which it must never import (allowed: %q; spec.md section 2)", r.pkg, rel, r.may)
				case slices.Contains(r.never, dep):
					t.Errorf("%s reaches the standard package %s, which its package comment says it does not need", r.pkg, dep)
				}
			}
		})
	}
}

// listDeps returns the import paths of pkg and every package it reaches,
// test files left out: what it compiles into the daemon.
func listDeps(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command(goToolPath(), "list", "-deps", "-f", "{{.ImportPath}}", pkg)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr)
	}
	return strings.Fields(string(out))
}
