package statejournal

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// Many appenders waiting at once share write+fsync pairs: far fewer groups
// than records, each record durable when its Wait returns.
func TestGroupCommitSharesFsyncs(t *testing.T) {
	opt, _ := options()
	opt.NoSync = false // the real fsync is what makes groups form
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	const appenders, each = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, appenders)
	for a := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				seq, err := j.Append(fmt.Appendf(nil, "%d/%d", a, i))
				if err == nil {
					err = j.Wait(seq)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := j.Stats()
	mustClose(t, j)
	if s.Records != appenders*each || s.Groups*4 > s.Records {
		t.Fatalf("%d records in %d groups: want %d records in at most a quarter as many groups", s.Records, s.Groups, appenders*each)
	}
	t.Logf("%d records in %d groups (%.1f records per fsync)", s.Records, s.Groups, float64(s.Records)/float64(s.Groups))
	j, recs := mustOpen(t, path, opt)
	defer mustClose(t, j)
	if len(recs) != appenders*each {
		t.Fatalf("%d records after reopening, want %d", len(recs), appenders*each)
	}
}

// A group whose write or fsync fails fails its waiters with the cause; the
// journal cuts the group's bytes away and the next group succeeds from the
// same offset, so the file holds exactly the acknowledged records.
func TestFailedGroupFailsItsWaitersAndTheNextSucceeds(t *testing.T) {
	cases := []struct {
		name  string
		fault func(h *hooks, armed *atomic.Bool)
		cause error
	}{
		{"the write fails half way", func(h *hooks, armed *atomic.Bool) {
			h.writeAt = func(f *os.File, b []byte, off int64) (int, error) {
				if armed.CompareAndSwap(true, false) {
					n, _ := f.WriteAt(b[:len(b)/2], off)
					return n, syscall.ENOSPC
				}
				return f.WriteAt(b, off)
			}
		}, syscall.ENOSPC},
		{"the fsync fails", func(h *hooks, armed *atomic.Bool) {
			h.sync = func(f *os.File) error {
				if armed.CompareAndSwap(true, false) {
					return syscall.EIO
				}
				return f.Sync()
			}
		}, syscall.EIO},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opt, _ := options()
			opt.NoSync = false
			var armed atomic.Bool
			h := &hooks{
				writeAt: func(f *os.File, b []byte, off int64) (int, error) { return f.WriteAt(b, off) },
				sync:    (*os.File).Sync,
			}
			c.fault(h, &armed)
			opt.hooks = h
			path := journalPath(t)
			j, _ := mustOpen(t, path, opt)
			a, b := []byte("acknowledged before"), []byte("a long record in the failed group, longer than what follows it")
			mustAppendWait(t, j, a)
			armed.Store(true)
			seq, err := j.Append(b)
			if err != nil {
				t.Fatal(err)
			}
			if err := j.Wait(seq); !errors.Is(err, c.cause) {
				t.Fatalf("Wait for the failed group: %v, want it to wrap %v", err, c.cause)
			}
			if err := j.Wait(seq); err == nil {
				t.Fatal("a second Wait for the failed group returned nil")
			}
			after := []byte("after")
			mustAppendWait(t, j, after)
			if !recordsThenZeros(t, path, encode(a, after)) || j.Size() != int64(len(encode(a, after))) {
				t.Fatalf("the file is not its records and zeros after them (Size %d): the failed group's bytes were left", j.Size())
			}
			if s := j.Stats(); s.GroupFailures != 1 {
				t.Fatalf("stats %+v, want one failed group", s)
			}
			mustClose(t, j)
			opt.hooks = nil
			j, recs := mustOpen(t, path, opt)
			defer mustClose(t, j)
			sameRecords(t, recs, [][]byte{a, after})
		})
	}
}

// fileLen is the file's length on disk, preallocation included.
func fileLen(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// Groups are written within zeros written ahead of them, a MiB at a time
// (preallocBytes): a group that fits changes the file's length no more,
// so its sync writes its pages and none of the file's metadata; the group
// that passes the zeros' end writes the next MiB of them in its own sync.
func TestGroupsAreWrittenWithinZerosWrittenAheadOfThem(t *testing.T) {
	opt, log := options()
	opt.NoSync = false
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	mustAppendWait(t, j, []byte("first"))
	ahead := fileLen(t, path)
	if ahead != j.Size()+preallocBytes {
		t.Fatalf("after the first group the file is %d bytes, %d of records: want a MiB of zeros ahead", ahead, j.Size())
	}
	mustAppendWait(t, j, []byte("second"))
	if got := fileLen(t, path); got != ahead {
		t.Fatalf("a group within the zeros changed the file's length: %d, was %d", got, ahead)
	}
	big := bytes.Repeat([]byte("r"), 64<<10)
	var recs [][]byte
	for j.Size() <= ahead {
		mustAppendWait(t, j, big)
		recs = append(recs, big)
	}
	if got := fileLen(t, path); got != j.Size()+preallocBytes {
		t.Fatalf("past the zeros' end the file is %d bytes, %d of records: want the next MiB ahead", got, j.Size())
	}
	if !recordsThenZeros(t, path, encode(append([][]byte{[]byte("first"), []byte("second")}, recs...)...)) {
		t.Fatal("the file is not its records and zeros after them")
	}
	mustClose(t, j)
	j, got := mustOpen(t, path, opt)
	defer mustClose(t, j)
	sameRecords(t, got, append([][]byte{[]byte("first"), []byte("second")}, recs...))
	if log.count() != 0 {
		t.Fatalf("the preallocated end was reported at the next Open:\n%s", log)
	}
}
