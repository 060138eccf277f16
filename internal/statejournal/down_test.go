package statejournal

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The failure paths around the common one (spec 5.3, "Failures"): a journal
// that is down answers no Wait with nil until a rebuild from its caller's
// state has made the file whole again.

// rebuildFrom compacts j from state and waits until the compaction ended,
// failing the test unless it succeeded.
func rebuildFrom(t testing.TB, j *Journal, state ...[]byte) {
	t.Helper()
	before := j.Stats()
	if !j.Compact(func(emit func([]byte) error) error {
		for _, p := range state {
			if err := emit(p); err != nil {
				return err
			}
		}
		return nil
	}) {
		t.Fatal("Compact did not start")
	}
	eventually(t, "the rebuild ended", func() bool {
		s := j.Stats()
		return s.Compactions+s.CompactionFailures > before.Compactions+before.CompactionFailures
	})
	if s := j.Stats(); s.Compactions == before.Compactions {
		t.Fatalf("the rebuild failed: %+v", s)
	}
}

// waitFails appends p and requires its Wait to fail.
func waitFails(t testing.TB, j *Journal, p []byte) {
	t.Helper()
	seq, err := j.Append(p)
	if err != nil {
		t.Fatalf("Append on a down journal: %v; it must take the record for a rebuild", err)
	}
	if err := j.Wait(seq); err == nil {
		t.Fatalf("Wait(%d) on a down journal returned nil", seq)
	}
}

// When the failed group's bytes cannot be cut away, the journal is down:
// no later Wait returns nil, whatever the file does meanwhile, until a
// rebuild; then the records are durable again and the file holds the
// caller's state and what came after.
func TestAJournalThatCannotBeCutBackIsDownUntilRebuilt(t *testing.T) {
	opt, _ := options()
	opt.NoSync = false // the hook below stands in for fsync
	var failing atomic.Bool
	opt.hooks = &hooks{
		sync: func(f *os.File) error {
			if failing.Load() {
				return syscall.EIO
			}
			return nil
		},
		truncate: func(f *os.File, size int64) error {
			if failing.Load() {
				return syscall.EIO
			}
			return f.Truncate(size)
		},
	}
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	mustAppendWait(t, j, []byte("before"))
	failing.Store(true)
	waitFails(t, j, []byte("failed group"))
	if h := j.Health(); h.Down == nil || !h.NeedsRebuild() {
		t.Fatalf("Health after a failed cut-back: %+v, want down", h)
	}
	// The fault is over, but the file's content is unknown: still down.
	failing.Store(false)
	waitFails(t, j, []byte("while down"))
	rebuildFrom(t, j, []byte("state"))
	if h := j.Health(); h.NeedsRebuild() {
		t.Fatalf("Health after the rebuild: %+v, want healthy", h)
	}
	mustAppendWait(t, j, []byte("after"))
	mustClose(t, j)
	opt.hooks = nil
	j, got := mustOpen(t, path, opt)
	defer mustClose(t, j)
	// The rebuild carries what was appended while it ran; the record
	// appended while down, before it began, is the caller's state's to
	// carry (here: not).
	sameRecords(t, got, [][]byte{[]byte("state"), []byte("after")})
}

// A group that fails (and is cut back) leaves the file without a change its
// caller holds: the journal says it is dirty until a compaction rewrites it.
func TestAFailedGroupLeavesTheJournalDirtyUntilACompaction(t *testing.T) {
	opt, _ := options()
	opt.NoSync = false // the hook below stands in for fsync
	var failing atomic.Bool
	opt.hooks = &hooks{sync: func(f *os.File) error {
		if failing.CompareAndSwap(true, false) {
			return syscall.EIO
		}
		return nil
	}}
	j, _ := mustOpen(t, journalPath(t), opt)
	defer mustClose(t, j)
	failing.Store(true)
	waitFails(t, j, []byte("lost"))
	if h := j.Health(); h.Down != nil || !h.Dirty {
		t.Fatalf("Health after one failed group: %+v, want dirty and up", h)
	}
	mustAppendWait(t, j, []byte("next group is written"))
	rebuildFrom(t, j, []byte("state"))
	if h := j.Health(); h.NeedsRebuild() {
		t.Fatalf("Health after the compaction: %+v, want clean", h)
	}
}

// A group that fails while a compaction runs is carried by the compaction:
// its records are in the tail, which is the caller's state too.
func TestAGroupThatFailsDuringACompactionIsCarriedByIt(t *testing.T) {
	opt, _ := options()
	var failing atomic.Bool
	opt.hooks = &hooks{writeAt: func(f *os.File, b []byte, off int64) (int, error) {
		if failing.CompareAndSwap(true, false) {
			return 0, errors.New("injected")
		}
		return f.WriteAt(b, off)
	}}
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	mustAppendWait(t, j, []byte("kept"))
	release := make(chan struct{})
	j.Compact(func(emit func([]byte) error) error {
		<-release
		return emit([]byte("kept"))
	})
	failing.Store(true)
	waitFails(t, j, []byte("failed during"))
	close(release)
	eventually(t, "the compaction ended", func() bool { s := j.Stats(); return s.Compactions+s.CompactionFailures == 1 })
	if s := j.Stats(); s.Compactions != 1 {
		t.Fatalf("stats %+v: a failed group must not fail the compaction that carries it", s)
	}
	if h := j.Health(); h.NeedsRebuild() {
		t.Fatalf("Health after the compaction: %+v, want clean", h)
	}
	mustClose(t, j)
	j, got := mustOpen(t, path, Options{NoSync: true})
	defer mustClose(t, j)
	sameRecords(t, got, [][]byte{[]byte("kept"), []byte("failed during")})
}

// A journal file unlinked, renamed or replaced under the writer is noticed
// at the next group, before its waiters are answered; a rebuild writes a new
// file at the path, which a restart reads.
func TestAJournalMovedUnderTheWriterIsNoticedAndRewritten(t *testing.T) {
	cases := map[string]func(t *testing.T, path string){
		"unlinked": func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		},
		"renamed": func(t *testing.T, path string) {
			if err := os.Rename(path, path+".moved"); err != nil {
				t.Fatal(err)
			}
		},
		"replaced": func(t *testing.T, path string) {
			if err := os.WriteFile(path+".new", encode([]byte("planted")), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(path+".new", path); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, move := range cases {
		t.Run(name, func(t *testing.T) {
			opt, _ := options()
			path := journalPath(t)
			j, _ := mustOpen(t, path, opt)
			mustAppendWait(t, j, []byte("before"))
			move(t, path)
			waitFails(t, j, []byte("written to a file no restart reads"))
			if h := j.Health(); h.Down == nil {
				t.Fatalf("Health: %+v, want down", h)
			}
			rebuildFrom(t, j, []byte("state"))
			mustAppendWait(t, j, []byte("after"))
			mustClose(t, j)
			j, got := mustOpen(t, path, opt)
			defer mustClose(t, j)
			sameRecords(t, got, [][]byte{[]byte("state"), []byte("after")})
		})
	}
}

// A journal that could not be opened starts down, takes records and fails
// them; a rebuild creates the file. What sat at the path unread is moved
// aside, never replaced; an empty file left by a creation cut short is not.
func TestAJournalThatCouldNotBeOpenedIsDownUntilRebuilt(t *testing.T) {
	for _, left := range []string{"", "unread records"} {
		t.Run("left "+map[bool]string{true: "nothing", false: "a file"}[left == ""], func(t *testing.T) {
			opt, _ := options()
			path := journalPath(t)
			if left != "" {
				if err := os.WriteFile(path, []byte(left), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(path+".tmp", []byte("stale"), 0o600); err != nil {
				t.Fatal(err)
			}
			j := OpenDown(path, opt, syscall.ENOSPC)
			if h := j.Health(); !errors.Is(h.Down, syscall.ENOSPC) {
				t.Fatalf("Health: %+v, want down wrapping ENOSPC", h)
			}
			waitFails(t, j, []byte("while down"))
			rebuildFrom(t, j, []byte("state"))
			mustAppendWait(t, j, []byte("after"))
			mustClose(t, j)
			aside := asides(t, path)
			if left == "" && len(aside) != 0 {
				t.Fatalf("set aside %v with nothing to keep", aside)
			}
			if left != "" && (len(aside) != 1 || string(fileBytes(t, aside[0])) != left) {
				t.Fatalf("the unread file was not kept aside: %v", aside)
			}
			j, got := mustOpen(t, path, opt)
			defer mustClose(t, j)
			sameRecords(t, got, [][]byte{[]byte("state"), []byte("after")})
			if _, err := os.Stat(filepath.Clean(path + ".tmp")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the stale compaction file is still there: %v", err)
			}
		})
	}
}

// A rebuild retried for as long as the journal is down logs each reason
// once, not once an attempt.
func TestARebuildThatKeepsFailingLogsItsReasonOnce(t *testing.T) {
	opt, warns := options()
	dir := t.TempDir()
	path := filepath.Join(dir, "missing", "state.journal")
	j := OpenDown(path, opt, syscall.ENOENT)
	defer j.Close()
	for i := range 3 {
		j.Compact(func(emit func([]byte) error) error { return nil })
		eventually(t, "the rebuild failed", func() bool { return j.Stats().CompactionFailures == uint64(i+1) })
	}
	if n := warns.count(); n != 1 {
		t.Fatalf("%d WARN lines for 3 failed rebuilds with one reason, want 1:\n%s", n, warns)
	}
}

// steadyLoad makes each fsync (the hook) bring one more record, as broker
// frames arriving during every group do: the writer always finds a group
// pending when it finishes one. It returns a switch that ends the load.
func steadyLoad(opt *Options, each time.Duration) (jp *atomic.Pointer[Journal], stop func()) {
	jp = &atomic.Pointer[Journal]{}
	var on atomic.Bool
	on.Store(true)
	opt.NoSync = false
	prev := opt.hooks
	opt.hooks = &hooks{sync: func(f *os.File) error {
		if j := jp.Load(); j != nil && on.Load() {
			time.Sleep(each)
			j.Append([]byte("arrived during the fsync"))
		}
		if prev != nil && prev.sync != nil {
			return prev.sync(f)
		}
		return nil
	}}
	return jp, func() { on.Store(false) }
}

// A rebuild switches while a group is always pending: the writer takes a
// compaction's switch between two groups, not only in a lull (else a dirty
// journal would stay dirty under load, its tail growing).
func TestARebuildSwitchesUnderASteadyLoad(t *testing.T) {
	opt, _ := options()
	jp, stop := steadyLoad(&opt, 200*time.Microsecond)
	j, _ := mustOpen(t, journalPath(t), opt)
	defer mustClose(t, j)
	defer stop()
	jp.Store(j)
	mustAppendWait(t, j, []byte("starts the load"))
	rebuildFrom(t, j, []byte("state"))
}

// With SyncEvery the background fsync comes within its interval under a
// steady load too: the window a power loss may take stays SyncEvery.
func TestSyncEveryFsyncsUnderASteadyLoad(t *testing.T) {
	opt, _ := options()
	opt.SyncEvery = 20 * time.Millisecond
	// In SyncEvery mode a group has no fsync to hook: the load rides the
	// writes instead.
	jp := &atomic.Pointer[Journal]{}
	var on atomic.Bool
	on.Store(true)
	opt.NoSync = false
	opt.hooks = &hooks{
		sync: func(*os.File) error { return nil },
		writeAt: func(f *os.File, b []byte, off int64) (int, error) {
			if j := jp.Load(); j != nil && on.Load() {
				time.Sleep(100 * time.Microsecond)
				j.Append([]byte("arrived during the write"))
			}
			return f.WriteAt(b, off)
		},
	}
	j, _ := mustOpen(t, journalPath(t), opt)
	defer mustClose(t, j)
	defer on.Store(false)
	jp.Store(j)
	mustAppendWait(t, j, []byte("starts the load"))
	eventually(t, "a background fsync under load", func() bool { return j.Stats().LagSyncs >= 1 })
}

// With SyncEvery, Close returns the failure of its last fsync: records
// were answered that no fsync made durable.
func TestSyncEveryCloseReturnsAFailedLastFsync(t *testing.T) {
	opt, _ := options()
	_, failing := syncCounter(&opt)
	opt.SyncEvery = MaxSyncEvery
	j, _ := mustOpen(t, journalPath(t), opt)
	mustAppendWait(t, j, []byte("answered, not yet fsynced"))
	failing.Store(true)
	if err := j.Close(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Close: %v, want the last fsync's EIO", err)
	}
}

// A file that replaced the journal under the daemon is not the daemon's to
// destroy: the rebuild moves it aside before its rename.
func TestARebuildKeepsAFileThatReplacedTheJournal(t *testing.T) {
	opt, _ := options()
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	defer mustClose(t, j)
	planted := encode([]byte("someone else's"))
	if err := os.WriteFile(path+".new", planted, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	waitFails(t, j, []byte("noticed"))
	rebuildFrom(t, j, []byte("state"))
	aside := asides(t, path)
	if len(aside) != 1 || string(fileBytes(t, aside[0])) != string(planted) {
		t.Fatalf("the file that replaced the journal was not kept aside: %v", aside)
	}
}

// After a rebuild, a record whose group failed before it is carried by the
// new file: a Wait for it passes (a caller waits on an entry's latest
// record, which a failed group may hold).
func TestARebuildCarriesARecordWhoseGroupFailed(t *testing.T) {
	opt, _ := options()
	var failing atomic.Bool
	opt.NoSync = false
	opt.hooks = &hooks{sync: func(*os.File) error {
		if failing.CompareAndSwap(true, false) {
			return syscall.EIO
		}
		return nil
	}}
	j, _ := mustOpen(t, journalPath(t), opt)
	defer mustClose(t, j)
	failing.Store(true)
	seq, _ := j.Append([]byte("failed group"))
	if err := j.Wait(seq); err == nil {
		t.Fatal("the injected failure did not fail the group")
	}
	rebuildFrom(t, j, []byte("failed group"))
	if err := j.Wait(seq); err != nil {
		t.Fatalf("Wait after the rebuild carried it: %v", err)
	}
}
