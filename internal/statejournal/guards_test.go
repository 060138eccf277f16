package statejournal

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file whose header was cut short (an empty one too) is a creation that a
// crash interrupted: nothing in it was ever acknowledged, so it is started
// afresh in place, without a warning or a file set aside.
func TestTornHeaderStartsFreshQuietly(t *testing.T) {
	for _, cut := range []int{0, 1, len(header) - 1} {
		opt, warn := options()
		path := journalPath(t)
		if err := os.WriteFile(path, []byte(header[:cut]), 0o600); err != nil {
			t.Fatal(err)
		}
		j, recs := mustOpen(t, path, opt)
		sameRecords(t, recs, nil)
		mustAppendWait(t, j, []byte("first"))
		mustClose(t, j)
		if warn.count() != 0 || len(asides(t, path)) != 0 {
			t.Fatalf("header cut at %d: warned or set aside:\n%s", cut, warn)
		}
		j, recs = mustOpen(t, path, opt)
		sameRecords(t, recs, [][]byte{[]byte("first")})
		mustClose(t, j)
	}
}

// Open refuses a record bound outside what the format can hold.
func TestOpenRefusesABadBound(t *testing.T) {
	for _, max := range []int{-1, maxRecordLimit + 1} {
		opt, _ := options()
		opt.MaxRecordBytes = max
		if j, err := Open(journalPath(t), opt, nil); err == nil {
			j.Close()
			t.Fatalf("Open with MaxRecordBytes %d succeeded", max)
		}
	}
}

// A second Close says the journal is closed already.
func TestCloseTwice(t *testing.T) {
	opt, _ := options()
	j, _ := mustOpen(t, journalPath(t), opt)
	mustClose(t, j)
	if err := j.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v, want ErrClosed", err)
	}
}

// A file planted at the compaction's temporary name after Open (a link to
// another file, or a regular file with content) makes the compaction fail;
// it never writes through the link nor reuses the planted file.
func TestCompactionRefusesAPlantedTemporaryFile(t *testing.T) {
	cases := []struct {
		name  string
		plant func(t *testing.T, tmp, target string)
	}{
		{"a symbolic link", func(t *testing.T, tmp, target string) {
			if err := os.Symlink(target, tmp); err != nil {
				t.Skipf("no symbolic links here: %v", err)
			}
		}},
		{"a regular file", func(t *testing.T, tmp, target string) {
			if err := os.WriteFile(tmp, []byte(strings.Repeat("planted ", 100)), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opt, warn := options()
			path := journalPath(t)
			target := filepath.Join(filepath.Dir(path), "precious")
			if err := os.WriteFile(target, []byte("precious"), 0o600); err != nil {
				t.Fatal(err)
			}
			j, _ := mustOpen(t, path, opt)
			recs := payloads(3)
			mustAppendWait(t, j, recs...)
			c.plant(t, path+".tmp", target)
			j.Compact(emitAll(recs[1:]))
			eventually(t, "the compaction ended", func() bool { s := j.Stats(); return s.Compactions+s.CompactionFailures == 1 })
			mustClose(t, j)
			if s := j.Stats(); s.CompactionFailures != 1 || warn.count() != 1 {
				t.Fatalf("stats %+v, want one failed compaction, logged once:\n%s", s, warn)
			}
			if got := fileBytes(t, target); string(got) != "precious" {
				t.Fatalf("the link's target was written: %q", got)
			}
			j, got := mustOpen(t, path, opt)
			defer mustClose(t, j)
			sameRecords(t, got, recs)
		})
	}
}

// A snapshot record over the bound fails the compaction: Open would
// refuse it, and everything after it, as corruption.
func TestCompactionRefusesAnOversizeSnapshotRecord(t *testing.T) {
	opt, _ := options()
	opt.MaxRecordBytes = 16
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	mustAppendWait(t, j, []byte("small"))
	j.Compact(emitAll([][]byte{make([]byte, 17)}))
	eventually(t, "the compaction failed", func() bool { return j.Stats().CompactionFailures == 1 })
	mustClose(t, j)
	j, got := mustOpen(t, path, opt)
	defer mustClose(t, j)
	sameRecords(t, got, [][]byte{[]byte("small")})
}

// When the switch to the compacted file fails, the group the writer took
// for it is written to the old file instead: its waiters succeed and its
// records are there after reopening.
func TestFailedSwitchKeepsThePendingGroup(t *testing.T) {
	opt, _ := options()
	opt.hooks = &hooks{
		writeAt: func(f *os.File, b []byte, off int64) (int, error) {
			if strings.HasSuffix(f.Name(), ".tmp") {
				return 0, errors.New("injected: the compaction file is full")
			}
			return f.WriteAt(b, off)
		},
		sync: (*os.File).Sync,
	}
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	mustAppendWait(t, j, []byte("before"))
	var seq uint64
	j.Compact(func(emit func([]byte) error) error {
		// Appended inside the snapshot, so that the writer may still hold
		// it pending when the switch comes.
		var err error
		seq, err = j.Append([]byte("during"))
		if err != nil {
			return err
		}
		return emit([]byte("before"))
	})
	eventually(t, "the compaction failed", func() bool { return j.Stats().CompactionFailures == 1 })
	if err := j.Wait(seq); err != nil {
		t.Fatalf("Wait for the record appended during the failed compaction: %v", err)
	}
	mustClose(t, j)
	opt.hooks = nil
	j, got := mustOpen(t, path, opt)
	defer mustClose(t, j)
	sameRecords(t, got, [][]byte{[]byte("before"), []byte("during")})
}

// Wait remembers failed groups: consecutive ones merge, and past the bound
// the forgotten ones fail rather than pass.
func TestFailedRangesRemembered(t *testing.T) {
	var f failedRanges
	cause := errors.New("disk full")
	f.add(3, 4, cause)
	f.add(5, 9, cause)
	if len(f.r) != 1 || f.outcome(2) != nil || !errors.Is(f.outcome(3), cause) || f.outcome(9) == nil || f.outcome(10) != nil {
		t.Fatalf("after failing 3..9: %v", f.r)
	}
	for i := uint64(0); i < maxFailedRanges; i++ {
		f.add(20+2*i, 20+2*i, cause)
	}
	if len(f.r) != maxFailedRanges || f.outcome(3) == nil || f.outcome(21) != nil {
		t.Fatalf("past the bound: %d ranges, forgotten up to %d", len(f.r), f.forgotten)
	}
}
