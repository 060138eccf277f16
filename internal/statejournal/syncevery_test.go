package statejournal

import (
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// syncCounter counts fsyncs and fails them while failing is set.
func syncCounter(opt *Options) (syncs *atomic.Int64, failing *atomic.Bool) {
	syncs, failing = &atomic.Int64{}, &atomic.Bool{}
	opt.NoSync = false
	opt.hooks = &hooks{sync: func(f *os.File) error {
		syncs.Add(1)
		if failing.Load() {
			return syscall.EIO
		}
		return nil
	}}
	return syncs, failing
}

// With SyncEvery a record is answered once written, before any fsync; the
// fsync follows in the background, and Close makes what is behind durable.
func TestSyncEveryAnswersOnceWrittenAndFsyncsBehind(t *testing.T) {
	opt, _ := options()
	syncs, _ := syncCounter(&opt)
	opt.SyncEvery = MaxSyncEvery // no background fsync within the test
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	base := syncs.Load() // the new file's header and directory
	mustAppendWait(t, j, []byte("answered once written"))
	if n := syncs.Load() - base; n != 0 {
		t.Fatalf("%d fsyncs before the answer, want none with SyncEvery", n)
	}
	mustClose(t, j)
	if n := syncs.Load() - base; n != 1 {
		t.Fatalf("%d fsyncs at Close, want the one that makes what is behind durable", n)
	}
	j, got := mustOpen(t, path, Options{NoSync: true})
	defer mustClose(t, j)
	sameRecords(t, got, [][]byte{[]byte("answered once written")})
}

// The background fsync comes within SyncEvery of the first group written
// after the last one, without Close or another group to prompt it.
func TestSyncEveryFsyncsWithinTheInterval(t *testing.T) {
	opt, _ := options()
	syncCounter(&opt)
	opt.SyncEvery = 20 * time.Millisecond
	j, _ := mustOpen(t, journalPath(t), opt)
	defer mustClose(t, j)
	mustAppendWait(t, j, []byte("a"), []byte("b"))
	eventually(t, "a background fsync", func() bool { return j.Stats().LagSyncs >= 1 })
}

// A background fsync that fails leaves records answered but not durable
// against a power loss: the journal is dirty, and a rebuild writes them
// again with an fsync.
func TestAFailedBackgroundFsyncLeavesTheJournalDirty(t *testing.T) {
	opt, _ := options()
	_, failing := syncCounter(&opt)
	opt.SyncEvery = 20 * time.Millisecond
	j, _ := mustOpen(t, journalPath(t), opt)
	defer mustClose(t, j)
	failing.Store(true)
	mustAppendWait(t, j, []byte("answered"))
	eventually(t, "the failed background fsync", func() bool { return j.Stats().LagSyncFailures >= 1 })
	if h := j.Health(); !h.Dirty || h.Down != nil {
		t.Fatalf("Health after a failed background fsync: %+v, want dirty and up", h)
	}
	failing.Store(false)
	rebuildFrom(t, j, []byte("answered"))
	if h := j.Health(); h.NeedsRebuild() {
		t.Fatalf("Health after the rebuild: %+v, want clean", h)
	}
}

func TestOpenRefusesASyncEveryOutOfRange(t *testing.T) {
	for _, d := range []time.Duration{-time.Millisecond, MaxSyncEvery + 1} {
		if _, err := Open(journalPath(t), Options{SyncEvery: d}, nil); err == nil {
			t.Fatalf("Open with SyncEvery %v: no error", d)
		}
	}
}
