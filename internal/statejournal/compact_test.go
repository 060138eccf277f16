package statejournal

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
)

// table is a caller's state: keys with versions, and a global order. Each
// change is applied and appended under its lock, as Compact asks.
type table struct {
	mu    sync.Mutex
	order uint64
	v     map[int]uint64
}

// record encodes key k at version v, order o: last-wins on replay.
func record(k int, v, o uint64) []byte { return fmt.Appendf(nil, "%d %d %d", k, v, o) }

func parse(t testing.TB, r []byte) (k int, v, o uint64) {
	if _, err := fmt.Sscanf(string(r), "%d %d %d", &k, &v, &o); err != nil {
		t.Fatalf("record %q: %v", r, err)
	}
	return k, v, o
}

// change bumps key k and appends its record; the caller waits.
func (tb *table) change(j *Journal, k int) (uint64, error) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.order++
	tb.v[k]++
	return j.Append(record(k, tb.v[k], tb.order))
}

// snapshot emits the table in slices of 10 keys, one lock per slice. Between
// slices it waits for j to take 20 more records, so that keys already
// emitted change before the switch: those changes exist only in the tail.
func (tb *table) snapshot(t testing.TB, j *Journal, keys int) func(emit func([]byte) error) error {
	return func(emit func([]byte) error) error {
		for lo := 0; lo < keys; lo += 10 {
			seen := j.Stats().Records
			eventually(t, "appends during the snapshot", func() bool { return j.Stats().Records >= seen+20 })
			tb.mu.Lock()
			for k := lo; k < min(lo+10, keys); k++ {
				if err := emit(record(k, tb.v[k], 0)); err != nil {
					tb.mu.Unlock()
					return err
				}
			}
			tb.mu.Unlock()
		}
		return nil
	}
}

// A compaction while appenders keep going loses nothing: after reopening,
// replaying the file last-wins gives the table, the snapshot comes first
// and every record after it is in the order it was appended.
func TestCompactionWhileAppendingLosesNothing(t *testing.T) {
	const keys, appenders = 100, 4
	opt, warn := options()
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	tb := &table{v: map[int]uint64{}}
	for k := range keys {
		for range 5 {
			if seq, err := tb.change(j, k); err != nil || j.Wait(seq) != nil {
				t.Fatal(err)
			}
		}
	}
	before := j.Size()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, appenders)
	for a := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := a; ; i += appenders {
				select {
				case <-stop:
					return
				default:
				}
				seq, err := tb.change(j, i%keys)
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
	if !j.Compact(tb.snapshot(t, j, keys)) {
		t.Fatal("Compact did not start")
	}
	eventually(t, "compacted", func() bool { return j.Stats().Compactions == 1 })
	// Appends after the switch must land in the new file too.
	eventually(t, "more records after the switch", func() bool { return j.Stats().Records > uint64(keys*5+200) })
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mustClose(t, j)
	if s := j.Stats(); s.CompactionFailures != 0 || warn.count() != 0 {
		t.Fatalf("stats %+v, log:\n%s", s, warn)
	}
	j, recs := mustOpen(t, path, opt)
	defer mustClose(t, j)
	if len(recs) < keys {
		t.Fatalf("%d records after reopening, fewer than the snapshot's %d", len(recs), keys)
	}
	got := map[int]uint64{}
	for i, r := range recs[:keys] {
		if k, _, _ := parse(t, r); k != i {
			t.Fatalf("record %d is key %d: the snapshot is not first", i, k)
		}
	}
	var last uint64
	for i, r := range recs {
		k, v, o := parse(t, r)
		got[k] = v
		if i >= keys {
			if o <= last {
				t.Fatalf("record %d has order %d after %d: the tail is out of order", i, o, last)
			}
			last = o
		}
	}
	if !maps.Equal(got, tb.v) {
		t.Fatalf("replayed state differs from the table:\n got %v\nwant %v", got, tb.v)
	}
	t.Logf("%d bytes before compaction; %d records after reopening", before, len(recs))
}

// Only one compaction runs at a time; a failed one removes its file, keeps
// the journal whole, is counted and logged once.
func TestFailedCompactionKeepsTheJournal(t *testing.T) {
	opt, warn := options()
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	recs := payloads(10)
	mustAppendWait(t, j, recs...)
	release := make(chan struct{})
	started := j.Compact(func(emit func([]byte) error) error {
		if err := emit([]byte("partial")); err != nil {
			return err
		}
		<-release
		return errors.New("the table went away")
	})
	if !started {
		t.Fatal("Compact did not start")
	}
	if j.Compact(emitAll(nil)) {
		t.Fatal("a second Compact started while one runs")
	}
	mustAppendWait(t, j, []byte("during"))
	close(release)
	eventually(t, "the compaction failed", func() bool { return j.Stats().CompactionFailures == 1 })
	if _, err := os.Lstat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the failed compaction left its file: %v", err)
	}
	if n := warn.count(); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, warn)
	}
	mustAppendWait(t, j, []byte("after"))
	mustClose(t, j)
	j, got := mustOpen(t, path, opt)
	defer mustClose(t, j)
	sameRecords(t, got, append(slices.Clone(recs), []byte("during"), []byte("after")))
}

// Close while a compaction's snapshot runs waits for it and loses nothing.
func TestCloseDuringCompaction(t *testing.T) {
	opt, _ := options()
	path := journalPath(t)
	j, _ := mustOpen(t, path, opt)
	recs := payloads(3)
	mustAppendWait(t, j, recs...)
	inSnapshot, release := make(chan struct{}), make(chan struct{})
	j.Compact(func(emit func([]byte) error) error {
		close(inSnapshot)
		<-release
		return emitAll(recs[:2])(emit)
	})
	<-inSnapshot
	mustAppendWait(t, j, []byte("last"))
	closed := make(chan error)
	go func() { closed <- j.Close() }()
	// The snapshot ends only once Close has begun: the writer must not stop
	// while the compaction still has its switch to make.
	eventually(t, "Close begun", func() bool { j.mu.Lock(); defer j.mu.Unlock(); return j.closed })
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	j, got := mustOpen(t, path, opt)
	defer mustClose(t, j)
	sameRecords(t, got, append(recs[:2:2], []byte("last")))
}
