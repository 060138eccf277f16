package ownjournal

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func sample() State {
	return State{
		Owned:   []Owned{{Origin: "node-a", ID: "job-1", LeaseSeconds: 30, LeaseDeadline: 1789661457000}, {Origin: "node-a", ID: "job-\"2\"\n"}},
		Removed: []Removed{{Origin: "node-a", ID: "gone-1", At: 1789661450000}, {Origin: "node-a", ID: "gone-2", At: 1789661451000}},
	}
}

func TestEncodeDecodeRoundTrips(t *testing.T) {
	s := sample()
	file, omitted := Encode(s, DefaultMaxBytes)
	if omitted != 0 {
		t.Fatalf("omitted %d", omitted)
	}
	got, err := Decode(file, DefaultMaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("decoded %+v, want %+v", got, s)
	}
}

// TestEncodeAtTheBoundKeepsOwnedThenNewestRemovals fills a journal past
// its bound: the owned entries are kept, then the newest removals, and
// the rest are counted as omitted; the file is within the bound.
func TestEncodeAtTheBoundKeepsOwnedThenNewestRemovals(t *testing.T) {
	s := State{Owned: []Owned{{Origin: "n", ID: "owned"}}}
	for i := range 1000 {
		s.Removed = append(s.Removed, Removed{Origin: "n", ID: strings.Repeat("x", 20) + string(rune('a'+i%26)), At: int64(i)})
	}
	const bound = 4096
	file, omitted := Encode(s, bound)
	if len(file) > bound {
		t.Fatalf("file of %d bytes over its %d-byte bound", len(file), bound)
	}
	got, err := Decode(file, bound)
	if err != nil {
		t.Fatal(err)
	}
	if omitted == 0 || len(got.Removed)+omitted != 1000 || len(got.Owned) != 1 {
		t.Fatalf("kept %d owned, %d removals, omitted %d", len(got.Owned), len(got.Removed), omitted)
	}
	if last := got.Removed[len(got.Removed)-1]; last.At != 999 {
		t.Fatalf("the newest removal kept is at %d, want 999", last.At)
	}
	if first := got.Removed[0]; first.At != int64(1000-len(got.Removed)) {
		t.Fatalf("removals kept start at %d, want the newest %d in order", first.At, len(got.Removed))
	}
	// A file larger than the bound is refused as a whole.
	if _, err := Decode(file, len(file)-1); err == nil {
		t.Fatal("a file over the bound decoded")
	}
}

func TestDecodeRefusesTornAndCorruptFiles(t *testing.T) {
	file, _ := Encode(sample(), DefaultMaxBytes)
	cases := map[string][]byte{
		"empty":          nil,
		"torn":           file[:len(file)-7],
		"torn header":    file[:10],
		"flipped byte":   bytes.Replace(file, []byte("job-1"), []byte("job-9"), 1),
		"appended":       append(append([]byte(nil), file...), '\n'),
		"not a journal":  []byte(`{"owned":[],"removed":[]}`),
		"bad lease pair": mustReencode(t, `{"owned":[["n","id",5,0]],"removed":[]}`),
		"unknown member": mustReencode(t, `{"owned":[],"removed":[],"x":1}`),
		"short entry":    mustReencode(t, `{"owned":[["n","id",0]],"removed":[]}`),
		"empty id":       mustReencode(t, `{"owned":[],"removed":[["n","",1]]}`),
		"negative":       mustReencode(t, `{"owned":[],"removed":[["n","i",-1]]}`),
	}
	for name, f := range cases {
		if _, err := Decode(f, DefaultMaxBytes); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// mustReencode gives body a valid header, so only the body is wrong.
func mustReencode(t *testing.T, body string) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteString(magic)
	b.WriteString(" crc32c=")
	b.WriteString(hex8(crc(body)))
	b.WriteString(" bytes=")
	b.WriteString(itoa(len(body)))
	b.WriteByte('\n')
	b.WriteString(body)
	return b.Bytes()
}

// TestWriteReplacesWholeAndReadsBack writes twice and reads the second;
// a leftover temporary file of a write cut short is not the journal.
func TestWriteReplacesWholeAndReadsBack(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	if s, err := Read(path, DefaultMaxBytes); err != nil || len(s.Owned)+len(s.Removed) != 0 {
		t.Fatalf("a missing journal read as %+v, %v", s, err)
	}
	first, _ := Encode(State{Owned: []Owned{{Origin: "n", ID: "first"}}}, DefaultMaxBytes)
	if err := Write(path, first); err != nil {
		t.Fatal(err)
	}
	// A write cut short leaves a torn temporary file beside the journal:
	// the journal read is still the previous whole one.
	second, _ := Encode(sample(), DefaultMaxBytes)
	if err := os.WriteFile(path+".tmp-torn", second[:len(second)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Read(path, DefaultMaxBytes); err != nil || len(s.Owned) != 1 || s.Owned[0].ID != "first" {
		t.Fatalf("after a torn temporary file the journal read as %+v, %v", s, err)
	}
	if err := Write(path, second); err != nil {
		t.Fatal(err)
	}
	s, err := Read(path, DefaultMaxBytes)
	if err != nil || !reflect.DeepEqual(s, sample()) {
		t.Fatalf("read %+v, %v", s, err)
	}
	// A file larger than the bound is refused without being read whole.
	if err := os.WriteFile(path, bytes.Repeat([]byte{'x'}, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path, 999); err == nil || !strings.Contains(err.Error(), "bound") {
		t.Fatalf("a file over the bound: %v", err)
	}
	if _, err := Read(dir, DefaultMaxBytes); err == nil {
		t.Fatal("a directory read as a journal")
	}
}

func FuzzDecode(f *testing.F) {
	good, _ := Encode(sample(), DefaultMaxBytes)
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(magic + " crc32c=00000000 bytes=2\n{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b, 1<<16)
		if err != nil {
			return
		}
		// Whatever decodes encodes again to a file that decodes the same.
		again, omitted := Encode(s, 1<<20)
		if omitted != 0 {
			return
		}
		s2, err := Decode(again, 1<<20)
		if err != nil || !reflect.DeepEqual(normalize(s), normalize(s2)) {
			t.Fatalf("re-encoded journal decoded as %+v, %v; want %+v", s2, err, s)
		}
	})
}

func normalize(s State) State {
	if len(s.Owned) == 0 {
		s.Owned = nil
	}
	if len(s.Removed) == 0 {
		s.Removed = nil
	}
	return s
}

// The temporary file has one fixed name: a write a kill cut short leaves
// one file, which the next write truncates and renames, so kills never
// pile files up in the app dir.
func TestWriteReusesOneTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	if err := os.WriteFile(TempName(path), bytes.Repeat([]byte("left by a kill "), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	s := State{Owned: []Owned{{Origin: "o", ID: "job-1"}}}
	for range 3 {
		file, _ := Encode(s, DefaultMaxBytes)
		if err := Write(path, file); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != FileName {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the app dir holds %q after a kill's leftover and three writes, want only the journal", names)
	}
	if got, err := Read(path, DefaultMaxBytes); err != nil || len(got.Owned) != 1 || got.Owned[0].ID != "job-1" {
		t.Fatalf("read back %+v, %v", got, err)
	}
}
