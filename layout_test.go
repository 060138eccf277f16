package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
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
		{pkg: "internal/clustertrust", may: []string{"internal/pairinstall"}, never: []string{"net/http"}},
		{pkg: "internal/promtext", may: nil, never: []string{"net/http"}},
		{pkg: "internal/wireframe", may: nil, never: []string{"net/http"}},
		{pkg: "internal/dev/testframe", may: []string{"internal/wireframe"}, never: []string{"net", "net/http"}},
		{pkg: "internal/httpguard", may: []string{"internal/promtext"}},
		{pkg: "internal/dev/pairbroker", may: nil, never: []string{"net", "net/http", "os/exec"}},
		{pkg: "internal/cliflags", may: nil, never: []string{"net/http"}},
		{pkg: "internal/dev/stockwlm", may: nil, never: []string{"net/http"}},
		{pkg: "internal/statejournal", may: nil, never: []string{"net/http"}},
		{pkg: "internal/statetable", may: []string{"internal/wireframe"}, never: []string{"net/http"}},
		{pkg: "internal/ingressmark", may: []string{"internal/wireframe"}, never: []string{"net", "net/http"}},
		{pkg: "internal/dev/procstat", may: nil, never: []string{"net", "net/http"}},
		{pkg: "internal/dev/pairshadow", may: []string{"internal/dev/pairbroker", "internal/dev/stockwlm"}, never: []string{"net", "net/http"}},
		{pkg: "internal/ratelog", may: nil},
		{pkg: "internal/gcpace", may: nil, never: []string{"net/http"}},
		// The peer port: its wire, its inbound server and its outbound
		// senders. The server and the senders share the wire and never
		// reach each other; the server never reaches the state table (a
		// peer's frame changes nothing this node asserts).
		{pkg: "internal/peerwire", may: []string{"internal/wireframe", "internal/httpguard", "internal/promtext"}},
		{pkg: "internal/brokerio", may: []string{"internal/wireframe", "internal/httpguard", "internal/promtext", "internal/ratelog"}},
		{pkg: "internal/peerserver", may: []string{"internal/peerwire", "internal/brokerio", "internal/wireframe", "internal/httpguard", "internal/promtext", "internal/ratelog", "internal/clustertrust", "internal/pairinstall"}},
		{pkg: "internal/peersend", may: []string{"internal/peerwire", "internal/statetable", "internal/wireframe", "internal/httpguard", "internal/promtext", "internal/ratelog", "internal/clustertrust", "internal/pairinstall"}},
		// The ingress's HTTP surface reaches the relay through interfaces
		// and reads the state table's types; never the peer port.
		{pkg: "internal/ingress", may: []string{"internal/statetable", "internal/brokerio", "internal/wireframe", "internal/httpguard", "internal/promtext", "internal/ratelog"}},
		// The journal's inspection command: the journal's reader and the
		// table's decoding of a record, nothing of the daemon's.
		{pkg: "cmd/wlmjournal", may: []string{"internal/statejournal", "internal/statetable", "internal/wireframe", "internal/cliflags"}, never: []string{"net/http"}},
		// The test kit: shared by the root's tests and e2e, never by
		// non-test code (internal/dev/testframe's tests check that).
		{pkg: "internal/dev/testkit", may: []string{"internal/wireframe", "internal/dev/devpki", "internal/dev/pairbroker", "internal/dev/pairshadow", "internal/dev/stockwlm"}},
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

// TestTheDaemonNeverImportsItsTooling holds the wall between the daemon
// and what serves its tests and tools (issue 40): the daemon's packages
// are the root and internal/ outside internal/dev/; the tooling, under
// internal/dev/ (the test kit, the stand-ins, the dev PKI, PAIR's broker
// model, the supervisor), may import the daemon's packages, and the
// commands and every package's tests may import the tooling, but no
// package the daemon compiles in may reach internal/dev/.
func TestTheDaemonNeverImportsItsTooling(t *testing.T) {
	cmd := exec.Command(goToolPath(), "list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", ".", "./internal/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dev := modulePath + "/internal/dev/"
	daemon, tooling := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if strings.HasPrefix(f[0], dev) {
			tooling++
			continue
		}
		daemon++
		for _, dep := range f[1:] {
			if strings.HasPrefix(dep, dev) {
				t.Errorf("%s reaches %s: a daemon package never imports the tooling under internal/dev/", f[0], dep)
			}
		}
	}
	if daemon == 0 || tooling == 0 {
		t.Fatalf("go list found %d daemon packages and %d tooling packages", daemon, tooling)
	}
	t.Logf("%d daemon packages (the root and internal/), %d tooling packages (internal/dev/)", daemon, tooling)
}

// rootFiles are the root package's non-test files, each with what it owns.
// The Manager's methods live with their concern: a file that owns none
// says so (methods false), and a new concern gets a row here.
var rootFiles = map[string]struct {
	owns    string
	methods bool // it may define methods of the Manager
}{
	"main.go":         {"the wiring: flags, identity, the Manager's start", false},
	"flaghelp.go":     {"the usage text and the listeners' address errors", false},
	"logging.go":      {"the log levels", false},
	"manager.go":      {"the Manager's core: Config, NewManager, Run, the local channel, the commit, ownership", true},
	"localframe.go":   {"a local-origin frame and its lines", false},
	"localingress.go": {"the ingress: its address and config file, its server's setup, the node endpoint", true},
	"ingressorder.go": {"an ingress frame's way in (Ingest) and its order: frames in flight, their place in the broker order, the live limit", true},
	"lease.go":        {"producer leases and their expiry", true},
	"discovery.go":    {"discovery and the broadcast targets", true},
	"bounds.go":       {"the bounds: the state table's, and the refusals over a bound", true},
	"metrics.go":      {"the metrics endpoint and every series it renders", true},
	"tablejournal.go": {"the state table's journal", false},
}

// TestTheRootStaysThin holds the root package, the relay's heart, to its
// bounds (issues 32, 40): at most 15 non-test files and 4,000 lines, each
// file one of rootFiles, and the Manager's methods only in the files that
// own a concern of it. What does not need the daemon goes under
// internal/, behind a package comment and a row above.
func TestTheRootStaysThin(t *testing.T) {
	const maxFiles, maxLines = 15, 4000
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	n, lines := 0, 0
	seen := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n++
		lines += bytes.Count(b, []byte("\n"))
		seen[f] = true
		row, listed := rootFiles[f]
		switch {
		case !listed:
			t.Errorf("%s is not one of the root's files (rootFiles): say what it owns there, or move it under internal/", f)
		case !row.methods && bytes.Contains(b, []byte("\nfunc (m *Manager) ")):
			t.Errorf("%s defines a method of the Manager, but owns %s: the method belongs with its concern", f, row.owns)
		}
	}
	for f := range rootFiles {
		if !seen[f] {
			t.Errorf("rootFiles lists %s, which the root no longer has", f)
		}
	}
	if n > maxFiles || lines > maxLines {
		t.Errorf("the root holds %d non-test files and %d lines; its bound is %d files and %d lines", n, lines, maxFiles, maxLines)
	}
}

// TestNoTestTakesTheRelaysLocks keeps the tests on the relay's behaviour,
// not its locking: a test that holds one of the Manager's locks to stall
// it tests a state the daemon never reaches, and breaks when the lock
// order changes. A test stalls the relay the way the world does: a broker
// that stops reading, a peer that does not answer.
func TestNoTestTakesTheRelaysLocks(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f == "layout_test.go" {
			continue // it names them
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, lock := range []string{".ingestMu.", ".discoveryMu."} {
			if bytes.Contains(b, []byte(lock)) {
				t.Errorf("%s takes the Manager's %s", f, strings.Trim(lock, "."))
			}
		}
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
