package statejournal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// damageCase is a journal of six records with damage done to it, and what
// Open must make of it.
type damageCase struct {
	name    string
	damage  func(b []byte) []byte
	lost    []int // the records the damage hit
	regions int
	// bytes of the damaged regions, from the offsets of the records (the
	// header is record -1)
	bytesLost   func(at func(i int) int) int
	recordsLost int
	exact       bool
}

// sixRecords is the journal every damage case starts from, and the
// offset of each record in it (-1: the header's, 0).
func sixRecords() (recs [][]byte, file []byte, at func(i int) int) {
	recs = payloads(6)
	file = encode(recs...)
	at = func(i int) int {
		if i < 0 {
			return 0
		}
		return len(encode(recs[:i]...))
	}
	return recs, file, at
}

func damageCases() []damageCase {
	_, _, at := sixRecords()
	span := func(from, to int) func(func(int) int) int {
		return func(at func(int) int) int { return at(to) - at(from) }
	}
	return []damageCase{
		{"a payload byte flipped in the middle", func(b []byte) []byte { b[at(2)+frameHeader+3] ^= 0x40; return b },
			[]int{2}, 1, span(2, 3), 1, true},
		{"a checksum byte flipped", func(b []byte) []byte { b[at(2)+5] ^= 0x01; return b },
			[]int{2}, 1, span(2, 3), 1, true},
		{"a length one longer", func(b []byte) []byte { b[at(2)]++; return b },
			[]int{2}, 1, span(2, 3), 1, false},
		{"a length past the end", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[at(2):], 1<<20); return b },
			[]int{2}, 1, span(2, 3), 1, false},
		{"a length over the bound", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[at(2):], 1<<30); return b },
			[]int{2}, 1, span(2, 3), 1, false},
		{"the first record", func(b []byte) []byte { b[at(0)+frameHeader] ^= 0xff; return b },
			[]int{0}, 1, span(0, 1), 1, true},
		{"two records apart", func(b []byte) []byte { b[at(1)+frameHeader] ^= 1; b[at(4)+frameHeader] ^= 1; return b },
			[]int{1, 4}, 2, func(at func(int) int) int { return at(2) - at(1) + at(5) - at(4) }, 2, true},
		{"two records side by side", func(b []byte) []byte { b[at(2)+frameHeader] ^= 1; b[at(3)+frameHeader] ^= 1; return b },
			[]int{2, 3}, 1, span(2, 4), 2, true},
		{"zeros over two records' headers", func(b []byte) []byte { clear(b[at(2) : at(3)+frameHeader]); return b },
			[]int{2, 3}, 1, span(2, 4), 1, false},
		{"the header line", func(b []byte) []byte { b[3] ^= 0xff; return b },
			nil, 1, span(-1, 0), 0, true},
		{"a record, then a torn tail", func(b []byte) []byte { b[at(1)+frameHeader] ^= 1; return b[:len(b)-3] },
			[]int{1, 5}, 2, func(at func(int) int) int { return at(2) - at(1) + at(6) - 3 - at(5) }, 2, false},
	}
}

// Damage that valid records follow costs only the records it hit: every
// record on both sides is restored and kept in a fresh journal, the
// damaged file is kept byte for byte, and one ERROR line gives the
// regions, the bytes and the records lost.
func TestDamageCostsOnlyTheRecordsItHit(t *testing.T) {
	for _, c := range damageCases() {
		t.Run(c.name, func(t *testing.T) {
			recs, file, at := sixRecords()
			damaged := c.damage(bytes.Clone(file))
			var want [][]byte
			for i, r := range recs {
				if !slices.Contains(c.lost, i) {
					want = append(want, r)
				}
			}
			opt, log := options()
			path := journalPath(t)
			if err := os.WriteFile(path, damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			j, got := mustOpen(t, path, opt)
			sameRecords(t, got, want)
			lost := c.bytesLost(at)
			if n, w := log.count(), errorLines(log); n != 0 || w != 1 {
				t.Fatalf("%d warnings and %d errors, want one error:\n%s", n, w, log)
			}
			for _, f := range []string{
				fmt.Sprintf("regions=%d", c.regions), fmt.Sprintf("bytesLost=%d", lost),
				fmt.Sprintf("recordsLost=%d", c.recordsLost), "recordsLostIs=" + map[bool]string{true: "exact", false: "atLeast"}[c.exact],
				fmt.Sprintf("recordsKept=%d", len(want)),
			} {
				if !strings.Contains(log.String(), f) {
					t.Errorf("the error line lacks %s:\n%s", f, log)
				}
			}
			s := j.Stats()
			if s.DamagedRegions != uint64(c.regions) || s.DamagedBytes != uint64(lost) || s.DamagedRecords != uint64(c.recordsLost) || s.TornTails != 0 {
				t.Errorf("stats %+v, want %d regions, %d bytes, %d records", s, c.regions, lost, c.recordsLost)
			}
			kept := damagedFiles(t, path)
			if len(kept) != 1 || !bytes.Equal(fileBytes(t, kept[0]), damaged) {
				t.Fatalf("damaged files kept: %q; want one, byte for byte the file Open found", kept)
			}
			if !strings.Contains(log.String(), "keptAs="+kept[0]) {
				t.Errorf("the error line does not name %s:\n%s", kept[0], log)
			}
			if got := fileBytes(t, path); !bytes.Equal(got, encode(want...)) || j.Size() != int64(len(got)) {
				t.Fatalf("the journal after Open is not its header and the %d records kept (Size %d, %d bytes)", len(want), j.Size(), len(got))
			}
			mustAppendWait(t, j, []byte("after"))
			mustClose(t, j)
			j, got = mustOpen(t, path, opt)
			defer mustClose(t, j)
			sameRecords(t, got, append(want, []byte("after")))
			if errorLines(log) != 1 || log.count() != 0 || len(damagedFiles(t, path)) != 1 {
				t.Fatalf("the fresh journal was taken for damaged again:\n%s", log)
			}
		})
	}
}

// A record cut short at the end is a torn tail, not damage: cut with one
// warning, nothing kept aside. Cut short where the writer wrote zeros
// ahead of it, the warning counts the torn bytes, not the zeros after.
func TestARecordCutShortAtTheEndIsATornTail(t *testing.T) {
	recs, file, at := sixRecords()
	torn := file[at(5) : len(file)-1]
	for name, damaged := range map[string][]byte{
		"at the end of the file": file[:len(file)-1],
		"before zeros":           append(bytes.Clone(file[:len(file)-1]), make([]byte, 4096)...),
	} {
		t.Run(name, func(t *testing.T) {
			opt, log := options()
			path := journalPath(t)
			if err := os.WriteFile(path, damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			j, got := mustOpen(t, path, opt)
			defer mustClose(t, j)
			sameRecords(t, got, recs[:5])
			if log.count() != 1 || errorLines(log) != 0 || len(damagedFiles(t, path)) != 0 {
				t.Fatalf("want one warning, no error, nothing kept aside:\n%s", log)
			}
			if s := j.Stats(); s.TornTails != 1 || s.DamagedRegions != 0 || s.DroppedBytes != uint64(len(torn)) {
				t.Fatalf("stats %+v: want one torn tail of %d bytes and no damage", s, len(torn))
			}
		})
	}
}

// Zeros from a record's place to the end of the file are its end, not a
// torn tail: the writer's preallocation (preallocBytes), or what a file
// system leaves after a crash cut the last records short, which were
// never acknowledged. No line, nothing dropped; the next group is written
// over them.
func TestZerosToTheEndAreTheEndOfTheRecords(t *testing.T) {
	recs, file, at := sixRecords()
	for name, c := range map[string]struct {
		file []byte
		want [][]byte
	}{
		"zeros after the last record": {append(bytes.Clone(file), make([]byte, 4096)...), recs},
		"zeros over the last record":  {append(bytes.Clone(file[:at(5)]), make([]byte, len(file)-at(5))...), recs[:5]},
		"fewer zeros than a header":   {append(bytes.Clone(file), 0, 0, 0), recs},
	} {
		t.Run(name, func(t *testing.T) {
			opt, log := options()
			path := journalPath(t)
			if err := os.WriteFile(path, c.file, 0o600); err != nil {
				t.Fatal(err)
			}
			j, got := mustOpen(t, path, opt)
			sameRecords(t, got, c.want)
			if log.count() != 0 || len(damagedFiles(t, path)) != 0 {
				t.Fatalf("zeros at the end were reported:\n%s", log)
			}
			if s := j.Stats(); s.TornTails != 0 || s.DroppedBytes != 0 || s.DamagedRegions != 0 {
				t.Fatalf("stats %+v: zeros at the end counted", s)
			}
			after := []byte("after the zeros' start")
			mustAppendWait(t, j, after)
			mustClose(t, j)
			j, got = mustOpen(t, path, opt)
			defer mustClose(t, j)
			sameRecords(t, got, append(slices.Clone(c.want), after))
			if log.count() != 0 {
				t.Fatalf("the journal written over its zeros was reported:\n%s", log)
			}
		})
	}
}

// A file crafted so that nearly every offset declares a possible length
// costs the search for the next record no more checksummed bytes than its
// budget: the rest is one damaged region, searched no further, and the
// file is kept aside rather than cut as a torn tail.
func TestTheSearchForTheNextRecordStopsAtItsBudget(t *testing.T) {
	recs := payloads(2)
	file := encode(recs[0])
	for range 1 << 18 {
		file = append(file, 0xff, 0, 0, 0) // lengths of 255 and 65,280 bytes at 2 offsets in 4
	}
	file = appendFrame(file, recs[1])
	var checked int64
	var damage []Damage
	s := newScanner(bytes.NewReader(file), int64(len(file)), DefaultMaxRecordBytes)
	budget := s.budget
	v := visitor{record: func(int64, []byte) error { return nil }, damage: func(d Damage) error { damage = append(damage, d); return nil }}
	// The scan, as scan runs it, with the scanner's spending measured.
	if _, err := s.run(v); err != nil {
		t.Fatal(err)
	}
	checked = budget - s.budget
	if len(damage) != 1 || !damage[0].Unsearched || damage[0].Tail || damage[0].End != int64(len(file)) {
		t.Fatalf("damage %+v: want one region to the end, unsearched", damage)
	}
	if checked > budget {
		t.Fatalf("the search checksummed %d bytes, over its budget of %d", checked, budget)
	}
	opt, log := options()
	path := journalPath(t)
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	j, got := mustOpen(t, path, opt)
	defer mustClose(t, j)
	sameRecords(t, got, recs[:1])
	if errorLines(log) != 1 || len(damagedFiles(t, path)) != 1 || !strings.Contains(log.String(), "budget spent") {
		t.Fatalf("want one error naming the budget and the file kept:\n%s", log)
	}
}

// When the fresh journal cannot be made durable (its fsync fails), Open
// has delivered every record and says ErrUnwritable, with what it found;
// the damaged journal is left as it was, and no fresh or kept file stays.
func TestDamageThatCannotBeRewrittenIsErrUnwritable(t *testing.T) {
	for _, c := range []struct {
		name    string
		file    func() ([]byte, [][]byte)
		damaged bool
	}{
		{"damage that records follow", func() ([]byte, [][]byte) {
			recs, file, at := sixRecords()
			file[at(2)+frameHeader] ^= 1
			return file, append(slices.Clone(recs[:2]), recs[3:]...)
		}, true},
		{"a torn tail", func() ([]byte, [][]byte) {
			recs, file, _ := sixRecords()
			return file[:len(file)-1], recs[:5]
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			file, want := c.file()
			opt, log := options()
			opt.NoSync = false
			opt.hooks = &hooks{
				writeAt: func(f *os.File, b []byte, off int64) (int, error) { return f.WriteAt(b, off) },
				sync:    func(*os.File) error { return errors.New("injected EIO") },
			}
			path := journalPath(t)
			if err := os.WriteFile(path, file, 0o600); err != nil {
				t.Fatal(err)
			}
			j, got, err := openCollect(path, opt)
			var ue *UnwritableError
			if j != nil || !errors.Is(err, ErrUnwritable) || !errors.As(err, &ue) {
				t.Fatalf("Open: %v, %v; want nil and ErrUnwritable", j, err)
			}
			sameRecords(t, got, want)
			if c.damaged && (ue.Found.DamagedRegions != 1 || errorLines(log) != 1) {
				t.Errorf("found %+v, log:\n%s\nwant one damaged region and its error line", ue.Found, log)
			}
			left, _ := filepath.Glob(path + ".*")
			if len(left) != 0 {
				t.Errorf("files left beside the journal: %q", left)
			}
			if after := fileBytes(t, path); c.damaged && !bytes.Equal(after, file) {
				t.Errorf("the damaged journal was changed")
			}
		})
	}
}

// errorLines counts the ERROR lines logged.
func errorLines(w *warnings) int { return strings.Count(w.String(), "level=ERROR") }

// damagedFiles lists the damaged files kept beside path.
func damagedFiles(t testing.TB, path string) []string {
	t.Helper()
	m, err := filepath.Glob(path + ".damaged-*")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Where the file system has no hard links, the damaged file is kept as a
// copy of its bytes.
func TestWithoutHardLinksTheDamagedFileIsCopied(t *testing.T) {
	defer func(l func(string, string) error) { link = l }(link)
	link = func(string, string) error { return errors.New("hard links not supported here") }
	recs, file, at := sixRecords()
	file[at(3)+frameHeader] ^= 1
	opt, log := options()
	path := journalPath(t)
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	j, got := mustOpen(t, path, opt)
	defer mustClose(t, j)
	sameRecords(t, got, append(slices.Clone(recs[:3]), recs[4:]...))
	kept := damagedFiles(t, path)
	if len(kept) != 1 || !bytes.Equal(fileBytes(t, kept[0]), file) || errorLines(log) != 1 {
		t.Fatalf("kept %q, log:\n%s\nwant one copy, byte for byte, and one error line", kept, log)
	}
}

// Open hands the records over one at a time from a window of the file: a
// journal far larger than the window costs the window, not the file.
func TestOpenHoldsOneRecordAtATime(t *testing.T) {
	path := journalPath(t)
	payload := bytes.Repeat([]byte{0x5a}, 32<<10)
	file := []byte(header)
	for range 1024 { // 32 MiB of records
		file = appendFrame(file, payload)
	}
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	opt, _ := options()
	n := 0
	var j *Journal
	allocated := allocatedBy(func() {
		var err error
		j, err = Open(path, opt, func(p []byte) error {
			if !bytes.Equal(p, payload) {
				return errors.New("a record that is not the one written")
			}
			n++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	defer mustClose(t, j)
	if n != 1024 || allocated > 4<<20 {
		t.Fatalf("%d records handed over, %d bytes allocated for a %d-byte file; want 1024 and a window's worth", n, allocated, len(file))
	}
}

// An error from the caller's function stops Open: it is not ErrUnwritable
// (the caller drops what it was given), and the file is not touched, not
// even its damage.
func TestACallersErrorStopsOpenAndLeavesTheFile(t *testing.T) {
	_, file, at := sixRecords()
	file[at(4)+frameHeader] ^= 1
	path := journalPath(t)
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	opt, _ := options()
	calls := 0
	j, err := Open(path, opt, func([]byte) error {
		calls++
		if calls == 5 {
			return errors.New("the caller's own trouble")
		}
		return nil
	})
	if j != nil || err == nil || errors.Is(err, ErrUnwritable) || !strings.Contains(err.Error(), "the caller's own trouble") {
		t.Fatalf("Open: %v, %v; want no journal and the caller's error, not ErrUnwritable", j, err)
	}
	if left, _ := filepath.Glob(path + ".*"); len(left) != 0 || !bytes.Equal(fileBytes(t, path), file) {
		t.Fatalf("the file was changed or files left beside it: %q", left)
	}
}

// The search for the next record checksums no offset whose length cannot
// be: over the bound, or past the end of the file.
func TestTheSearchChecksumsNoImpossibleLength(t *testing.T) {
	const max = 64
	file := []byte(header)
	for range 1 << 14 {
		// 16,705 bytes (0x4141), over the bound but within the file, at
		// one offset in four; past the end of the file at the others.
		file = append(file, 0x41, 0x41, 0, 0)
	}
	file = appendFrame(file, []byte("found"))
	s := newScanner(bytes.NewReader(file), int64(len(file)), max)
	budget := s.budget
	var recs [][]byte
	v := visitor{record: func(_ int64, f []byte) error { recs = append(recs, bytes.Clone(f[frameHeader:])); return nil },
		damage: func(Damage) error { return nil }}
	if _, err := s.run(v); err != nil {
		t.Fatal(err)
	}
	sameRecords(t, recs, [][]byte{[]byte("found")})
	if spent := budget - s.budget; spent != int64(len("found")) {
		t.Fatalf("the search checksummed %d bytes; only the record it found (%d) has a possible length", spent, len("found"))
	}
}

// A file of another version of the format is set aside unread, even when
// what follows its header reads as records of this one: its records mean
// what that version says.
func TestAnotherVersionIsSetAsideEvenWithRecordsThatReadAsOurs(t *testing.T) {
	file := []byte("nvpair-statejournal v2\n")
	for _, p := range payloads(3) {
		file = appendFrame(file, p)
	}
	opt, log := options()
	path := journalPath(t)
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	j, got := mustOpen(t, path, opt)
	defer mustClose(t, j)
	sameRecords(t, got, nil)
	if kept := asides(t, path); len(kept) != 1 || !bytes.Equal(fileBytes(t, kept[0]), file) || log.count() != 1 || errorLines(log) != 0 {
		t.Fatalf("set aside %q, log:\n%s\nwant the file set aside as it was, one warning", kept, log)
	}
}

// The search for the next record skips a run of zeros without a checksum
// at each offset, and still finds a record whose header starts with zero
// bytes (a length of 256 is 00 01 00 00) right after the run.
func TestTheSearchAcrossZerosFindsTheRecordRightAfterThem(t *testing.T) {
	first, last := []byte("before the hole"), bytes.Repeat([]byte("x"), 256)
	file := encode(first)
	file = append(file, 0xff)                   // damage: no record here
	file = append(file, make([]byte, 3<<20)...) // a hole of zeros
	file = append(file, encode(last)[len(header):]...)
	opt, _ := options()
	opt.MaxRecordBytes = 1 << 10
	path := journalPath(t)
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	j, got := mustOpen(t, path, opt)
	defer mustClose(t, j)
	sameRecords(t, got, [][]byte{first, last})
	if s := j.Stats(); s.DamagedRegions != 1 || s.DamagedBytes != 1+3<<20 {
		t.Fatalf("stats %+v: want the byte and the hole as one damaged region", s)
	}
}
