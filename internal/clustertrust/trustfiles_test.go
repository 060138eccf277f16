package clustertrust

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/pairinstall"
)

// longAgo is a modification time well outside the settle window: a file
// the cluster manager wrote long before the reload looks at it.
var longAgo = time.Now().Add(-time.Hour)

// age sets path's modification time to longAgo. Only for regular files: on
// a symlink it would date the link's target.
func age(t testing.TB, paths ...string) {
	t.Helper()
	for _, p := range paths {
		netMust(t, os.Chtimes(p, longAgo, longAgo))
	}
}

// symlinkOrSkip makes link point at target, or skips the test where the
// platform does not let this user make symlinks (Windows without the
// privilege).
func symlinkOrSkip(t testing.TB, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Skipf("symlinks unavailable: %v", err)
	}
}

// pinDocument is a valid pin for id, padded with trailing spaces (which
// JSON ignores) to size bytes when size is larger than the document.
func pinDocument(t testing.TB, id devpki.Identity, size int) string {
	t.Helper()
	b, err := json.Marshal(devpki.Pin{NodeUUID: id.Principal, CertPEM: string(id.CertPEM)})
	netMust(t, err)
	if pad := size - len(b); pad > 0 {
		b = append(b, strings.Repeat(" ", pad)...)
	}
	return string(b)
}

func TestReadRegularFileRefusesWhatIsNotARegularFileOfAtMost64KiB(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "regular")
	writeFile(t, regular, "content")
	cases := []struct {
		name    string
		path    func(t *testing.T) string
		want    string // the content read, when it is read
		refusal error  // the refusal, when it is refused
	}{
		{"a regular file is read", func(*testing.T) string { return regular }, "content", nil},
		{"a symlink to a regular file is read", func(t *testing.T) string {
			link := filepath.Join(t.TempDir(), "link")
			symlinkOrSkip(t, regular, link)
			return link
		}, "content", nil},
		{"a file of exactly 64 KiB is read", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "max")
			writeFile(t, p, strings.Repeat("x", pairinstall.MaxFileBytes))
			return p
		}, strings.Repeat("x", pairinstall.MaxFileBytes), nil},
		{"a file of 64 KiB and one byte is refused", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "over")
			writeFile(t, p, strings.Repeat("x", pairinstall.MaxFileBytes+1))
			return p
		}, "", pairinstall.ErrFileTooLarge},
		{"a directory is refused", func(t *testing.T) string { return t.TempDir() }, "", pairinstall.ErrNotRegularFile},
		{"a symlink to a directory is refused", func(t *testing.T) string {
			link := filepath.Join(t.TempDir(), "link")
			symlinkOrSkip(t, t.TempDir(), link)
			return link
		}, "", pairinstall.ErrNotRegularFile},
		{"a symlink to /dev/zero is refused", func(t *testing.T) string {
			link := filepath.Join(t.TempDir(), "zero")
			symlinkOrSkip(t, testkit.EndlessDevice(t), link)
			return link
		}, "", pairinstall.ErrNotRegularFile},
		{"a named pipe is refused without blocking", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "fifo")
			testkit.MakeFIFO(t, p)
			return p
		}, "", pairinstall.ErrNotRegularFile},
		{"a symlink to a named pipe is refused without blocking", func(t *testing.T) string {
			p, link := filepath.Join(t.TempDir(), "fifo"), filepath.Join(t.TempDir(), "link")
			testkit.MakeFIFO(t, p)
			symlinkOrSkip(t, p, link)
			return link
		}, "", pairinstall.ErrNotRegularFile},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := c.path(t)
			type result struct {
				b   []byte
				err error
			}
			done := make(chan result, 1)
			go func() { b, _, err := pairinstall.ReadRegularFile(path); done <- result{b, err} }()
			var r result
			select {
			case r = <-done:
			case <-time.After(waitTimeout):
				t.Fatalf("pairinstall.ReadRegularFile(%s) still blocked after %v", path, waitTimeout)
			}
			if c.refusal != nil {
				if !errors.Is(r.err, c.refusal) {
					t.Fatalf("pairinstall.ReadRegularFile = %d bytes, error %v; want %v", len(r.b), r.err, c.refusal)
				}
				return
			}
			if r.err != nil || string(r.b) != c.want {
				t.Fatalf("pairinstall.ReadRegularFile = %d bytes, error %v; want %d bytes", len(r.b), r.err, len(c.want))
			}
		})
	}
}

// TestReadRegularFileCutsAFileLongerThanItsStatSaysAtTheBound reads a
// regular file whose Stat size (0) says nothing of its length: the bound is
// the limited read, not the size Stat reports, and no more than the bound
// is ever held in memory.
func TestReadRegularFileCutsAFileLongerThanItsStatSaysAtTheBound(t *testing.T) {
	const path = "/proc/kallsyms" // regular, size 0, megabytes long
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Skipf("%s is not a regular file of size 0 here", path)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err = pairinstall.ReadRegularFile(path)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, pairinstall.ErrFileTooLarge) {
		t.Fatalf("pairinstall.ReadRegularFile(%s) error = %v, want %v", path, err, pairinstall.ErrFileTooLarge)
	}
	// io.ReadAll grows its buffer by doubling: about twice the bound.
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 8*pairinstall.MaxFileBytes {
		t.Fatalf("reading %s allocated %d bytes, want at most %d: the read was not cut at the bound", path, allocated, 8*pairinstall.MaxFileBytes)
	}
}

func TestPinFileIsReadOnlyWhenARegularFileOfAtMost64KiB(t *testing.T) {
	cases := []struct {
		name    string
		make    func(t *testing.T, pin string, id devpki.Identity) // writes the pin file for id at pin
		pinned  bool
		refused string // the refusal counter that counts it: "not_regular", "too_large" or ""
		reason  string // a fragment of the warning's reason
	}{
		{"a symlink to a regular pin file is read", func(t *testing.T, pin string, id devpki.Identity) {
			target := filepath.Join(t.TempDir(), "elsewhere.json")
			writeFile(t, target, pinDocument(t, id, 0))
			age(t, target)
			symlinkOrSkip(t, target, pin)
		}, true, "", ""},
		{"a pin of exactly 64 KiB is read", func(t *testing.T, pin string, id devpki.Identity) {
			writeFile(t, pin, pinDocument(t, id, pairinstall.MaxFileBytes))
			age(t, pin)
		}, true, "", ""},
		{"a pin of 64 KiB and one byte is skipped", func(t *testing.T, pin string, id devpki.Identity) {
			writeFile(t, pin, pinDocument(t, id, pairinstall.MaxFileBytes+1))
			age(t, pin)
		}, false, "too_large", "larger than 65536 bytes"},
		{"a symlink to /dev/zero is skipped", func(t *testing.T, pin string, _ devpki.Identity) {
			symlinkOrSkip(t, testkit.EndlessDevice(t), pin)
		}, false, "not_regular", "not a regular file: a character device"},
		{"a named pipe is skipped", func(t *testing.T, pin string, _ devpki.Identity) {
			testkit.MakeFIFO(t, pin)
		}, false, "not_regular", "not a regular file: a named pipe"},
		{"a symlink to a directory is skipped", func(t *testing.T, pin string, _ devpki.Identity) {
			symlinkOrSkip(t, t.TempDir(), pin)
		}, false, "not_regular", "not a regular file: a directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, _ := netMemberDir(t)
			control := netMint(t, devpki.NewUUID())
			netMust(t, devpki.PinIdentity(dir, control))
			id := netMint(t, devpki.NewUUID())
			name := id.Principal + ".json"
			c.make(t, filepath.Join(dir, "trusted", name), id)
			logs := &testkit.LogBuffer{}
			tr := NewClusterTrust(dir, netLogger(logs))
			for range 3 {
				tr.Reload()
			}

			if _, ok := tr.Pin(control.Principal); !ok {
				t.Fatal("the valid pin beside it was lost")
			}
			if _, ok := tr.Pin(id.Principal); ok != c.pinned {
				t.Fatalf("pinned = %v, want %v", ok, c.pinned)
			}
			warnings := 0
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "ignoring pin") && strings.Contains(line, "file="+name) {
					warnings++
					if !strings.Contains(line, c.reason) {
						t.Fatalf("warning %q does not say %q", line, c.reason)
					}
				}
			}
			if want := map[bool]int{true: 0, false: 1}[c.pinned]; warnings != want {
				t.Fatalf("%d warnings naming %s over three reloads, want %d; logs:\n%s", warnings, name, want, logs)
			}
			notRegular, tooLarge := tr.files.notRegular.Load(), tr.files.tooLarge.Load()
			want := map[string][2]uint64{"": {0, 0}, "not_regular": {1, 0}, "too_large": {0, 1}}[c.refused]
			if notRegular != want[0] || tooLarge != want[1] {
				t.Fatalf("refusals counted not_regular %d, too_large %d over three reloads; want %d, %d (once per file and change)", notRegular, tooLarge, want[0], want[1])
			}
		})
	}
}

func TestIdentityFilesAreReadOnlyWhenRegularFilesOfAtMost64KiB(t *testing.T) {
	// Each file, replaced by something that is not a regular file of at
	// most 64 KiB, is refused, warned about once, and the rule for an
	// unreadable file of its kind holds: the identity is kept, an admission
	// record is no admission.
	makeFIFO := func(t *testing.T, p string) { testkit.MakeFIFO(t, p) }
	cases := []struct {
		name    string
		file    string
		replace func(t *testing.T, path string)
		warning string
	}{
		{"node.crt as a symlink to /dev/zero", "node.crt", func(t *testing.T, p string) { symlinkOrSkip(t, testkit.EndlessDevice(t), p) }, "cluster identity unreadable, keeping the previous one"},
		{"node.crt as a named pipe", "node.crt", makeFIFO, "cluster identity unreadable, keeping the previous one"},
		{"node.crt over 64 KiB", "node.crt", func(t *testing.T, p string) { writeFile(t, p, strings.Repeat("x", pairinstall.MaxFileBytes+1)) }, "cluster identity unreadable, keeping the previous one"},
		{"node.key as a named pipe", "node.key", makeFIFO, "cluster identity unreadable, keeping the previous one"},
		{"admission.json as a named pipe", admissionFileName, makeFIFO, "admission record ignored"},
		{"admission.json over 64 KiB", admissionFileName, func(t *testing.T, p string) { writeFile(t, p, strings.Repeat(" ", pairinstall.MaxFileBytes+1)) }, "admission record ignored"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, self := netMemberDir(t)
			peer := netMint(t, devpki.NewUUID())
			netMust(t, devpki.PinIdentity(dir, peer)) // a member without its admission too
			logs := &testkit.LogBuffer{}
			tr := NewClusterTrust(dir, netLogger(logs))
			tr.Reload()
			path := filepath.Join(dir, c.file)
			netMust(t, os.Remove(path))
			c.replace(t, path)
			for range 3 {
				tr.Reload()
			}
			if id := tr.CurrentIdentity(); id == nil || PrincipalOf(id.Leaf) != self.Principal {
				t.Fatal("the member's identity was lost")
			}
			if n := strings.Count(logs.String(), c.warning); n != 1 {
				t.Fatalf("%d warnings %q over three reloads, want 1; logs:\n%s", n, c.warning, logs)
			}
			if n := tr.files.notRegular.Load() + tr.files.tooLarge.Load(); n != 1 {
				t.Fatalf("%d refusals counted over three reloads, want 1 (once per file and change)", n)
			}
		})
	}
}

func TestNodeIDFileThatIsNotARegularFileIsAStartupErrorNotAHang(t *testing.T) {
	const identityFileName = "identity.json" // the node id's file (pairinstall)
	app, cluster := t.TempDir(), t.TempDir()
	testkit.MakeFIFO(t, filepath.Join(cluster, identityFileName))
	done := make(chan error, 1)
	go func() { _, err := pairinstall.ResolveNodeID(app, cluster); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), identityFileName) || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("ResolveNodeID error = %v, want one naming %s as not a regular file", err, identityFileName)
		}
	case <-time.After(waitTimeout):
		t.Fatal("ResolveNodeID blocked on a named pipe")
	}
}

func TestUnchangedClusterDirectoryIsNotReadAgain(t *testing.T) {
	dir, _ := netMemberDir(t)
	peers := []devpki.Identity{netMint(t, devpki.NewUUID()), netMint(t, devpki.NewUUID())}
	for _, p := range peers {
		netMust(t, devpki.PinIdentity(dir, p))
	}
	pinPath := func(id devpki.Identity) string { return filepath.Join(dir, "trusted", id.Principal+".json") }
	ageAll := func() {
		age(t, filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key"), filepath.Join(dir, admissionFileName))
		entries, err := os.ReadDir(filepath.Join(dir, "trusted"))
		netMust(t, err)
		for _, e := range entries {
			age(t, filepath.Join(dir, "trusted", e.Name()))
		}
	}
	ageAll()
	tr := NewClusterTrust(dir, netLogger(&testkit.LogBuffer{}))
	tr.Reload()
	if got := tr.files.reads.Load(); got != 5 {
		t.Fatalf("the first reload read %d files, want 5 (node.crt, node.key, admission.json, 2 pins)", got)
	}

	newcomer := netMint(t, devpki.NewUUID())
	steps := []struct {
		name   string
		do     func()
		reads  uint64 // files read by the reload after do
		change bool
	}{
		{"nothing changed", func() {}, 0, false},
		{"still nothing changed", func() {}, 0, false},
		{"a pin appears", func() { netMust(t, devpki.PinIdentity(dir, newcomer)); ageAll() }, 1, true},
		{"a pin is rewritten in place with other content", func() {
			writeFile(t, pinPath(peers[0]), pinDocument(t, peers[0], 2000))
			ageAll()
		}, 1, false},
		{"a pin is removed", func() { netMust(t, os.Remove(pinPath(peers[1]))) }, 0, true},
		{"the identity is rotated", func() {
			netMust(t, devpki.WriteIdentity(dir, netMint(t, PrincipalOf(tr.CurrentIdentity().Leaf))))
			ageAll()
		}, 2, true},
		{"admission.json is rewritten", func() { netMust(t, devpki.WriteAdmission(dir, "test-cluster", 2)); ageAll() }, 1, false},
		{"nothing changed again", func() {}, 0, false},
		{"admission.json is removed", func() { netMust(t, os.Remove(filepath.Join(dir, admissionFileName))) }, 1, false},
		{"admission.json is still absent", func() {}, 0, false},
		{"node.key is removed", func() { netMust(t, os.Remove(filepath.Join(dir, "node.key"))) }, 1, false},
		{"node.key is still absent", func() {}, 0, false},
	}
	for _, s := range steps {
		s.do()
		before := tr.files.reads.Load()
		changed := tr.Reload()
		if got := tr.files.reads.Load() - before; got != s.reads || changed != s.change {
			t.Fatalf("%s: the reload read %d files and reported change %v; want %d and %v", s.name, got, changed, s.reads, s.change)
		}
	}
	if tr.PinCount() != 2 {
		t.Fatalf("pinCount = %d, want 2", tr.PinCount())
	}
}

func TestFileChangedWithinItsSettleWindowIsReadAgainWithTheSameSizeAndTime(t *testing.T) {
	// A file system with coarse timestamps gives a file written twice in
	// quick succession the same modification time; the restored time below
	// plays that file system.
	dir := t.TempDir()
	path := filepath.Join(dir, admissionFileName)
	writeFile(t, path, `{"clusterId":"aaaa","epoch":1}`)
	fi, err := os.Stat(path)
	netMust(t, err)
	f := newTrustFiles(dir)
	if got := f.loadAdmission().clusterID; got != "aaaa" {
		t.Fatalf("clusterId = %q, want aaaa", got)
	}
	writeFile(t, path, `{"clusterId":"bbbb","epoch":1}`)
	netMust(t, os.Chtimes(path, fi.ModTime(), fi.ModTime()))
	if got := f.loadAdmission().clusterID; got != "bbbb" {
		t.Fatalf("clusterId = %q after a same-size rewrite within the settle window, want bbbb", got)
	}
}

func TestFileReplacedByRenameIsReadAgainWithTheSameSizeAndTime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, admissionFileName)
	writeFile(t, path, `{"clusterId":"aaaa","epoch":1}`)
	age(t, path)
	f := newTrustFiles(dir)
	if got := f.loadAdmission().clusterID; got != "aaaa" {
		t.Fatalf("clusterId = %q, want aaaa", got)
	}
	tmp := path + ".tmp"
	writeFile(t, tmp, `{"clusterId":"bbbb","epoch":1}`)
	age(t, tmp)
	netMust(t, os.Rename(tmp, path))
	if got := f.loadAdmission().clusterID; got != "bbbb" {
		t.Fatalf("clusterId = %q after another file of the same size and time was renamed over it, want bbbb", got)
	}
}

// BenchmarkTrustReloadUnchanged measures one reload tick of a member whose
// cluster directory holds benchPinCount valid pins, none of which changed
// since the previous tick: the cost of trust at idle.
func BenchmarkTrustReloadUnchanged(b *testing.B) {
	const benchPinCount = 10_000
	dir, _ := netMemberDir(b)
	for range benchPinCount {
		netMust(b, devpki.PinIdentity(dir, netMint(b, devpki.NewUUID())))
	}
	entries, err := os.ReadDir(filepath.Join(dir, "trusted"))
	netMust(b, err)
	for _, e := range entries {
		age(b, filepath.Join(dir, "trusted", e.Name()))
	}
	age(b, filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key"), filepath.Join(dir, admissionFileName))
	tr := NewClusterTrust(dir, netLogger(&testkit.LogBuffer{}))
	tr.Reload()
	if got := tr.PinCount(); got != benchPinCount {
		b.Fatalf("pinCount = %d, want %d", got, benchPinCount)
	}
	b.ReportAllocs()
	for b.Loop() {
		if tr.Reload() {
			b.Fatal("an unchanged directory reported a change")
		}
	}
}
