package statejournal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Append adds payload to the pending group and returns its sequence number
// (1 for the first record since Open) without waiting: it copies the payload
// under a short lock and never does I/O. Call Wait with the sequence to know
// the record is durable.
func (j *Journal) Append(payload []byte) (uint64, error) {
	if len(payload) > j.max {
		return 0, fmt.Errorf("%w: %d bytes, the bound is %d", ErrTooLarge, len(payload), j.max)
	}
	j.mu.Lock()
	if err := j.usableLocked(); err != nil {
		j.mu.Unlock()
		return 0, err
	}
	j.last++
	seq := j.last
	if j.cur == nil {
		j.cur = &group{first: seq, done: make(chan struct{})}
	}
	j.cur.last = seq
	mark := len(j.pending)
	j.pending = appendFrame(j.pending, payload)
	if j.tailing {
		j.tail = append(j.tail, j.pending[mark:]...)
	}
	j.mu.Unlock()
	j.stats.records.Add(1)
	j.stats.bytes.Add(uint64(frameHeader + len(payload)))
	j.wake()
	return seq, nil
}

// usableLocked says why the journal takes no more records, if it does not:
// only once it is closed. A down journal (broken) still takes them, and
// fails their groups at once: a rebuild (Compact) under way must see every
// record in its tail, and the caller's table already holds the change.
func (j *Journal) usableLocked() error {
	if j.closed {
		return ErrClosed
	}
	return nil
}

// wake tells the writer there is work, without blocking.
func (j *Journal) wake() {
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// Wait blocks until the record with sequence seq is written and fsynced
// (with SyncEvery: written), and returns nil; or returns an error if the
// group holding it failed (wrapping the cause), or if seq was never
// appended. A nil Wait says nothing of an earlier record whose group
// failed; a rebuild that switched after a failed group carries it, and a
// Wait for it then returns nil. Many waiters of one group cost one channel
// between them.
func (j *Journal) Wait(seq uint64) error {
	j.mu.Lock()
	if seq == 0 || seq > j.last {
		j.mu.Unlock()
		return fmt.Errorf("statejournal: Wait(%d): no such record (last appended: %d)", seq, j.last)
	}
	var g *group
	switch {
	case j.cur != nil && seq >= j.cur.first:
		g = j.cur
	case j.flight != nil && seq >= j.flight.first:
		g = j.flight
	}
	if g == nil {
		err := j.failed.outcome(seq)
		j.mu.Unlock()
		return err
	}
	j.mu.Unlock()
	<-g.done
	return g.err
}

// Sync waits until the last record appended so far is durable (Wait): for
// shutdown, or for a caller that appended without keeping the sequences.
func (j *Journal) Sync() error {
	j.mu.Lock()
	seq := j.last
	j.mu.Unlock()
	if seq == 0 {
		return nil
	}
	return j.Wait(seq)
}

// Close writes and syncs what is pending, waits for a compaction under way,
// stops the writer and closes the file. It returns the error of the records
// pending at the call, if their group failed, or of closing the file; a
// group that failed before the call was reported to its waiters already.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return ErrClosed
	}
	j.closed = true
	last := j.last
	pending := j.cur != nil || j.flight != nil
	j.mu.Unlock()
	j.wake()
	<-j.stopped
	var err error
	if pending {
		err = j.Wait(last)
	}
	if err == nil {
		err = j.closeErr // set by the writer, which has returned
	}
	if j.file == nil {
		return err // a journal that never had a file (OpenDown)
	}
	if cerr := j.file.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("statejournal: closing %s: %w", j.path, cerr)
	}
	return err
}

// writer is the one goroutine that writes the file: each pending group in
// one write and one fsync, and each compaction's switch between groups. It
// returns once the journal is closed, nothing is pending and no compaction
// runs.
func (j *Journal) writer() {
	defer close(j.stopped)
	for {
		select {
		case <-j.kick:
		case req := <-j.finish:
			j.finishCompaction(req)
		case <-j.lag.due():
			j.syncBehind()
		}
		j.drain()
		j.mu.Lock()
		done := j.closed && j.cur == nil && !j.compacting
		j.mu.Unlock()
		if done {
			if err := j.syncBehind(); err != nil {
				j.closeErr = fmt.Errorf("statejournal: the last fsync of %s at close: %w", j.path, err)
			}
			return
		}
	}
}

// drain writes the pending groups until none is left. Between two groups
// it takes a compaction's switch and a background fsync that are due: under
// a steady load a group is always pending, and neither may wait for a lull
// (a rebuild's tail would grow without end, and SyncEvery's window with it).
func (j *Journal) drain() {
	for {
		select {
		case req := <-j.finish:
			j.finishCompaction(req)
		case <-j.lag.due():
			j.syncBehind()
		default:
		}
		if !j.writeOne() {
			return
		}
	}
}

// syncLag is the writer's state in SyncEvery mode: whether the file holds
// groups written but not yet fsynced, and the timer that fsyncs them. Only
// the writer goroutine touches it.
type syncLag struct {
	behind bool
	timer  *time.Timer
}

// due is the channel of the pending fsync's timer, nil (never ready) when
// nothing is behind.
func (l *syncLag) due() <-chan time.Time {
	if !l.behind || l.timer == nil {
		return nil
	}
	return l.timer.C
}

// wrote notes a group written without its fsync: the next fsync is due
// within every.
func (l *syncLag) wrote(every time.Duration) {
	if l.behind {
		return
	}
	l.behind = true
	if l.timer == nil {
		l.timer = time.NewTimer(every)
	} else {
		l.timer.Reset(every)
	}
}

// syncBehind fsyncs the groups written since the last fsync, in SyncEvery
// mode. A failure leaves the file without a durable copy of records whose
// waiters were answered; kill -9 cannot lose them (they are in the page
// cache), a power loss could, so the journal is dirty and a rebuild (which
// fsyncs) writes them again.
func (j *Journal) syncBehind() error {
	if !j.lag.behind {
		return nil
	}
	j.lag.behind = false
	j.mu.Lock()
	f := j.file
	j.mu.Unlock()
	if f == nil {
		return nil
	}
	if err := j.sync(f); err != nil {
		j.stats.syncFailures.Add(1)
		j.markDirty()
		return err
	}
	j.stats.lagSyncs.Add(1)
	return nil
}

// markDirty says the file lacks a durable copy of records its caller holds.
func (j *Journal) markDirty() {
	j.mu.Lock()
	j.dirty = true
	j.mu.Unlock()
}

// takeLocked moves the pending group to flight and returns it and its bytes,
// or nil if nothing is pending.
func (j *Journal) takeLocked() (*group, []byte) {
	g, buf := j.cur, j.pending
	if g == nil {
		return nil, nil
	}
	j.cur, j.flight = nil, g
	j.pending, j.spare = j.spare[:0], nil
	return g, buf
}

// writeOne writes the pending group, if any, and reports whether it did.
func (j *Journal) writeOne() bool {
	j.mu.Lock()
	g, buf := j.takeLocked()
	broken, off, f := j.broken, j.size, j.file
	j.mu.Unlock()
	if g == nil {
		return false
	}
	var err error
	if broken != nil {
		err = fmt.Errorf("statejournal: journal unusable: %w", broken)
	} else {
		err = j.writeGroup(f, buf, off)
	}
	j.complete(g, buf, int64(len(buf)), err)
	return true
}

// writeGroup writes buf at off in f and syncs it; on failure it cuts the
// file back to off so the next group starts from the same place. A group
// that ends past the preallocated end writes the next preallocBytes of
// zeros too, which its own sync makes durable, so the groups after it are
// written within the file's length and blocks (extend).
func (j *Journal) writeGroup(f *os.File, buf []byte, off int64) error {
	err := j.redoDirSync()
	if err == nil {
		_, err = j.hooks.writeAt(f, buf, off)
		if err != nil {
			err = fmt.Errorf("statejournal: writing %d bytes to %s at %d: %w", len(buf), j.path, off, err)
		}
	}
	if err == nil {
		j.extend(f, off+int64(len(buf)))
	}
	if err == nil && j.syncEvery > 0 {
		// Answered once written: in the page cache, the records survive
		// kill -9; the fsync follows within syncEvery (syncBehind).
		j.lag.wrote(j.syncEvery)
	} else if err == nil {
		if err = j.sync(f); err != nil {
			err = fmt.Errorf("statejournal: syncing %s: %w", j.path, err)
		}
	}
	if err == nil {
		if err = j.checkIdentity(); err != nil {
			// The bytes are durable in a file the path no longer names: a
			// restart would not read them. Cutting them back is pointless.
			// Whatever now sits at the path was not written by the daemon:
			// the rebuild keeps it aside rather than rename over it.
			j.markBroken(err)
			j.keepWhatReplacedIt()
			return err
		}
	}
	if err != nil {
		if terr := j.hooks.truncate(f, off); terr != nil {
			j.markBroken(fmt.Errorf("cutting %s back to %d after a failed group: %w (after: %w)", j.path, off, terr, err))
		} else {
			j.setAlloc(off)
		}
	}
	return err
}

// preallocBytes is how far the file is written ahead of its records, in
// zeros. An fsync of a group that grows the file must write the file's
// metadata (its length, its block map) as well as the group; within zeros
// written and synced before, fdatasync writes the group's pages alone
// (spec 5.3), about half the work per group on ext4. The reader takes
// zeros after the last record for the end of the file (scan), so the
// preallocation needs no record of its own. One MiB is some 2,000 typical
// records: the extension's cost (a MiB more for one group's sync) is paid
// once per 2,000 records, and the file is at most a MiB longer than what
// it holds.
const preallocBytes = 1 << 20

// zeroChunk is the preallocation's bytes: zeros in the binary's BSS, read
// by write(2) from the shared zero page, so they cost no memory.
var zeroChunk [preallocBytes]byte

// extend writes the next preallocBytes of zeros after end when end is
// past the preallocated end, in the group's sync. A failed extension
// fails nothing: the group is whole before it, and the next group tries
// again.
func (j *Journal) extend(f *os.File, end int64) {
	j.mu.Lock()
	alloc := j.alloc
	j.mu.Unlock()
	if end <= alloc {
		return
	}
	if _, err := j.hooks.writeAt(f, zeroChunk[:], end); err != nil {
		j.setAlloc(end) // zeros may lie past end: the reader takes them for the end
		return
	}
	j.setAlloc(end + preallocBytes)
}

func (j *Journal) setAlloc(n int64) {
	j.mu.Lock()
	j.alloc = n
	j.mu.Unlock()
}

// redoDirSync retries a compaction's directory fsync that failed: until it
// succeeds the rename may not survive a crash, and neither would any group
// written to the new file, so no group may be acknowledged before it.
func (j *Journal) redoDirSync() error {
	j.mu.Lock()
	dirty := j.dirDirty
	j.mu.Unlock()
	if !dirty {
		return nil
	}
	if err := j.syncDir(filepath.Dir(j.path)); err != nil {
		return fmt.Errorf("statejournal: syncing the directory of %s after a compaction: %w", j.path, err)
	}
	j.mu.Lock()
	j.dirDirty = false
	j.mu.Unlock()
	return nil
}

// complete records the outcome of group g, whose bytes were buf and which
// grew the file by grown bytes if it succeeded, and wakes its waiters.
func (j *Journal) complete(g *group, buf []byte, grown int64, err error) {
	j.mu.Lock()
	if err == nil {
		j.size += grown
		j.stats.groups.Add(1)
	} else {
		j.failed.add(g.first, g.last, err)
		j.stats.groupFailures.Add(1)
		// The file now lacks changes its caller made (the records of this
		// group): it holds every record again only once rebuilt. A
		// compaction under way carries the group in its tail, which is
		// allowed: a record whose Wait failed may or may not survive.
		j.dirty = true
	}
	j.flight = nil
	if cap(buf) <= 4<<20 {
		j.spare = buf[:0]
	}
	j.mu.Unlock()
	g.err = err
	close(g.done)
}

// checkIdentity reports an error when the journal's path no longer names
// the file the writer writes: it was unlinked, renamed or replaced under the
// daemon. One lstat per group, after its fsync and before any waiter of it
// is answered, so no answer counts on a file a restart would not read.
func (j *Journal) checkIdentity() error {
	j.mu.Lock()
	want := j.ident
	j.mu.Unlock()
	st, err := os.Lstat(j.path)
	if err != nil {
		return fmt.Errorf("statejournal: the journal file %s is gone from under the daemon: %w", j.path, err)
	}
	if want != nil && !os.SameFile(st, want) {
		return fmt.Errorf("statejournal: %s no longer names the journal file the daemon writes (replaced or renamed under it)", j.path)
	}
	return nil
}

// keepWhatReplacedIt marks a file found at the path in place of the
// journal as one the rebuild moves aside.
func (j *Journal) keepWhatReplacedIt() {
	if _, err := os.Lstat(j.path); err != nil {
		return
	}
	j.mu.Lock()
	j.keepAside = "it replaced the journal file under the daemon"
	j.mu.Unlock()
}

// markBroken stops the file: every later group fails at once, until a
// rebuild (Compact) writes a new one from the caller's table.
func (j *Journal) markBroken(cause error) {
	j.mu.Lock()
	if j.broken == nil {
		j.broken = cause
	}
	j.dirty = true
	j.mu.Unlock()
}

// Health is what a caller needs to know of a journal's state.
type Health struct {
	// Down is why every group fails now, at once: the file could not be
	// opened, or cut back after a failed group, or is no longer at its
	// path. nil while groups are written.
	Down error
	// Dirty says a group failed since the file last held every record
	// its caller appended: the file lacks changes the caller holds. A
	// rebuild (Compact) from the caller's state writes them again.
	Dirty bool
}

// NeedsRebuild says a Compact is due whatever the file's size.
func (h Health) NeedsRebuild() bool { return h.Down != nil || h.Dirty }

// Health returns the journal's state.
func (j *Journal) Health() Health {
	j.mu.Lock()
	defer j.mu.Unlock()
	return Health{Down: j.broken, Dirty: j.dirty}
}

// maxFailedRanges bounds the failed ranges Wait remembers.
const maxFailedRanges = 1024

// failedRanges remembers the sequences of failed groups and their causes, so
// a Wait that comes after its group completed still learns the outcome.
// Consecutive failed groups merge into one range, which keeps the latest
// cause; when more than maxFailedRanges are kept the oldest is forgotten, and
// a Wait for a sequence at or below what was forgotten errs on the safe side
// and fails.
type failedRanges struct {
	r         []failedRange
	forgotten uint64
}

type failedRange struct {
	first, last uint64
	cause       error
}

func (f *failedRanges) add(first, last uint64, cause error) {
	if n := len(f.r); n > 0 && f.r[n-1].last+1 == first {
		f.r[n-1].last, f.r[n-1].cause = last, cause
		return
	}
	f.r = append(f.r, failedRange{first, last, cause})
	if len(f.r) > maxFailedRanges {
		f.forgotten = f.r[0].last
		f.r = append(f.r[:0], f.r[1:]...)
	}
}

// errGroupFailed is the error of a Wait that comes after its failed group
// completed, wrapped around the group's cause.
var errGroupFailed = errors.New("statejournal: the record's group failed to be written")

func (f *failedRanges) outcome(seq uint64) error {
	for i := len(f.r) - 1; i >= 0; i-- {
		if seq >= f.r[i].first && seq <= f.r[i].last {
			return fmt.Errorf("%w: %w", errGroupFailed, f.r[i].cause)
		}
	}
	if seq <= f.forgotten {
		return fmt.Errorf("%w (or its outcome is no longer remembered)", errGroupFailed)
	}
	return nil
}
