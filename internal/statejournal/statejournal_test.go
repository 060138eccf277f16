package statejournal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// Records come back as they were appended, across Close and Open, and new
// ones land after them.
func TestRecordsRoundTripAcrossReopen(t *testing.T) {
	cases := []struct {
		name string
		recs [][]byte
	}{
		{"none", nil},
		{"one empty payload", [][]byte{{}}},
		{"a few", payloads(5)},
		{"many", payloads(3000)},
		{"one at the bound", [][]byte{bytes.Repeat([]byte{0xa5}, 4096)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opt, warn := options()
			opt.MaxRecordBytes = 4096
			path := journalPath(t)
			j, recs := mustOpen(t, path, opt)
			sameRecords(t, recs, nil)
			mustAppendWait(t, j, c.recs...)
			if got, want := j.Size(), int64(len(encode(c.recs...))); got != want {
				t.Errorf("Size() = %d, want %d", got, want)
			}
			mustClose(t, j)
			j, recs = mustOpen(t, path, opt)
			sameRecords(t, recs, c.recs)
			more := [][]byte{[]byte("after reopening"), []byte("never waited for: Close writes it")}
			mustAppendWait(t, j, more[0])
			if _, err := j.Append(more[1]); err != nil {
				t.Fatal(err)
			}
			mustClose(t, j)
			j, recs = mustOpen(t, path, opt)
			defer mustClose(t, j)
			sameRecords(t, recs, append(c.recs, more...))
			if n := warn.count(); n != 0 {
				t.Errorf("%d warnings for a clean journal:\n%s", n, warn)
			}
		})
	}
}

// A file cut anywhere inside its last record loses that record only, with
// one warning naming the offset, and takes new records after the ones kept.
func TestTornTailAtEveryOffsetOfTheLastRecord(t *testing.T) {
	recs := payloads(3)
	file := encode(recs...)
	start := len(encode(recs[:2]...))
	for cut := start + 1; cut < len(file); cut++ {
		opt, warn := options()
		path := journalPath(t)
		if err := os.WriteFile(path, file[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		j, got := mustOpen(t, path, opt)
		sameRecords(t, got, recs[:2])
		if n := warn.count(); n != 1 || !strings.Contains(warn.String(), "offset="+itoa(start)) {
			t.Fatalf("cut at %d: %d warnings, want one naming offset %d:\n%s", cut, n, start, warn)
		}
		if s := j.Stats(); s.TornTails != 1 || s.DroppedBytes != uint64(cut-start) {
			t.Fatalf("cut at %d: stats %+v, want 1 torn tail of %d bytes", cut, s, cut-start)
		}
		mustAppendWait(t, j, []byte("new"))
		mustClose(t, j)
		j, got = mustOpen(t, path, opt)
		sameRecords(t, got, append(recs[:2:2], []byte("new")))
		mustClose(t, j)
		if n := warn.count(); n != 1 {
			t.Fatalf("cut at %d: the reopened journal warned again:\n%s", cut, warn)
		}
	}
}

// A declared length the file cannot hold, or over the bound, is refused
// before its payload is allocated.
func TestHugeLengthIsRefusedWithoutAllocating(t *testing.T) {
	cases := []struct {
		name     string
		declared uint32
		max      int
		after    int // bytes actually in the file after the frame header
	}{
		{"a GiB declared, a few bytes there", 1<<30 - 1, 1 << 30, 16},
		{"over the bound, all of it there", 3 << 20, 2 << 20, 3 << 20},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			file := []byte(header)
			file = binary.LittleEndian.AppendUint32(file, c.declared)
			file = append(file, make([]byte, 4+c.after)...)
			var recs int
			var damage []Damage
			v := visitor{
				record: func(int64, []byte) error { recs++; return nil },
				damage: func(d Damage) error { damage = append(damage, d); return nil },
			}
			allocated := allocatedBy(func() { scan(bytes.NewReader(file), int64(len(file)), c.max, v) })
			if recs != 0 || len(damage) != 1 || damage[0].Offset != int64(len(header)) || !damage[0].Tail {
				t.Fatalf("scan: %d records, damage %+v; want none and one torn tail at %d", recs, damage, len(header))
			}
			if allocated > scanChunk+64<<10 {
				t.Fatalf("scan allocated %d bytes for a record it refused, over its %d-byte window", allocated, scanChunk)
			}
		})
	}
}

// allocatedBy is the bytes f allocates on the heap.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Anything but a regular file at the journal's path, or a file that is not
// a journal, is moved aside with one warning and a fresh journal started;
// a symbolic link's target is never written.
func TestPathNotARegularJournalIsSetAside(t *testing.T) {
	cases := []struct {
		name  string
		plant func(t *testing.T, path, target string)
	}{
		{"a symbolic link", func(t *testing.T, path, target string) {
			if err := os.Symlink(target, path); err != nil {
				t.Skipf("no symbolic links here: %v", err)
			}
		}},
		{"a symbolic link to a journal", func(t *testing.T, path, target string) {
			if err := os.WriteFile(target, encode(payloads(2)...), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, path); err != nil {
				t.Skipf("no symbolic links here: %v", err)
			}
		}},
		{"a directory", func(t *testing.T, path, target string) {
			if err := os.MkdirAll(filepath.Join(path, "inside"), 0o700); err != nil {
				t.Fatal(err)
			}
		}},
		{"another format", func(t *testing.T, path, target string) {
			if err := os.WriteFile(path, []byte("nvpair-statejournal v2\nsomething newer"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	cases = append(cases, platformPlants...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opt, warn := options()
			path := journalPath(t)
			target := filepath.Join(filepath.Dir(path), "precious")
			if err := os.WriteFile(target, []byte("precious"), 0o600); err != nil {
				t.Fatal(err)
			}
			c.plant(t, path, target)
			before := fileBytes(t, target)
			j, recs := mustOpen(t, path, opt)
			sameRecords(t, recs, nil)
			mustAppendWait(t, j, []byte("fresh"))
			mustClose(t, j)
			if n := warn.count(); n != 1 || len(asides(t, path)) != 1 {
				t.Fatalf("%d warnings and %q set aside, want one of each:\n%s", n, asides(t, path), warn)
			}
			if st, err := os.Lstat(path); err != nil || !st.Mode().IsRegular() {
				t.Fatalf("the journal after Open: %v, %v; want a regular file", st, err)
			}
			if got := fileBytes(t, target); !bytes.Equal(got, before) {
				t.Fatalf("the link's target was written: %q", got)
			}
			j, recs = mustOpen(t, path, opt)
			defer mustClose(t, j)
			sameRecords(t, recs, [][]byte{[]byte("fresh")})
		})
	}
}

// A file of a compaction cut short is removed at Open if it is a regular
// file, moved aside if not, and compaction works afterwards either way.
func TestStaleTemporaryFileIsCleared(t *testing.T) {
	cases := []struct {
		name     string
		plant    func(t *testing.T, tmp, target string)
		warnings int
	}{
		{"a half-written compaction", func(t *testing.T, tmp, target string) {
			if err := os.WriteFile(tmp, encode(payloads(2)...)[:30], 0o600); err != nil {
				t.Fatal(err)
			}
		}, 0},
		{"a directory", func(t *testing.T, tmp, target string) {
			if err := os.MkdirAll(filepath.Join(tmp, "inside"), 0o700); err != nil {
				t.Fatal(err)
			}
		}, 1},
		{"a symbolic link", func(t *testing.T, tmp, target string) {
			if err := os.Symlink(target, tmp); err != nil {
				t.Skipf("no symbolic links here: %v", err)
			}
		}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opt, warn := options()
			path := journalPath(t)
			recs := payloads(4)
			if err := os.WriteFile(path, encode(recs...), 0o600); err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(filepath.Dir(path), "precious")
			if err := os.WriteFile(target, []byte("precious"), 0o600); err != nil {
				t.Fatal(err)
			}
			c.plant(t, path+".tmp", target)
			j, got := mustOpen(t, path, opt)
			sameRecords(t, got, recs)
			if n := warn.count(); n != c.warnings {
				t.Fatalf("%d warnings, want %d:\n%s", n, c.warnings, warn)
			}
			if _, err := os.Lstat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the stale temporary file is still there: %v", err)
			}
			if !j.Compact(emitAll(recs[2:])) {
				t.Fatal("Compact did not start")
			}
			eventually(t, "compacted", func() bool { return j.Stats().Compactions == 1 })
			mustClose(t, j)
			if got := fileBytes(t, target); string(got) != "precious" {
				t.Fatalf("the link's target was written: %q", got)
			}
			j, got = mustOpen(t, path, opt)
			defer mustClose(t, j)
			sameRecords(t, got, recs[2:])
		})
	}
}

// emitAll is a snapshot of fixed records.
func emitAll(recs [][]byte) func(emit func([]byte) error) error {
	return func(emit func([]byte) error) error {
		for _, r := range recs {
			if err := emit(r); err != nil {
				return err
			}
		}
		return nil
	}
}

// Append refuses a payload over the bound, and everything after Close.
func TestAppendRefusals(t *testing.T) {
	opt, _ := options()
	opt.MaxRecordBytes = 10
	j, _ := mustOpen(t, journalPath(t), opt)
	if _, err := j.Append(make([]byte, 11)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Append of 11 bytes with a bound of 10: %v, want ErrTooLarge", err)
	}
	mustAppendWait(t, j, make([]byte, 10))
	if err := j.Wait(2); err == nil {
		t.Fatal("Wait for a record never appended returned nil")
	}
	mustClose(t, j)
	if _, err := j.Append(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close: %v, want ErrClosed", err)
	}
	if j.Compact(emitAll(nil)) {
		t.Fatal("Compact started after Close")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
