package statejournal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// finishReq asks the writer to switch to a filled compaction file.
type finishReq struct {
	tmp  *os.File
	size int64 // bytes in tmp: header and snapshot
	done chan error
}

// Compact rewrites the journal in the background from snapshot, which must
// emit every live record through emit (in slices, under the caller's own
// locks; emit copies each payload) and return. Records appended from the
// call on are kept in a tail buffer too and written after the snapshot, so
// nothing appended during the compaction is lost; for that to hold, a caller
// must apply a change to its state before, or under the same lock as, the
// Append that records it. Between two groups the writer appends the tail to
// the new file, fsyncs it, renames it over the journal, fsyncs the
// directory and writes the following groups to it. It returns false, and
// does nothing, while another compaction runs or once the journal is
// closed. A failed compaction removes its file, keeps the old journal, is
// counted in Stats and logged once per distinct reason.
//
// Compact is also the rebuild of a down or dirty journal (Health): the new
// file holds the caller's whole state, so once it is switched to, the file
// holds every record again and groups are written to it.
func (j *Journal) Compact(snapshot func(emit func(payload []byte) error) error) (started bool) {
	j.mu.Lock()
	if j.compacting || j.usableLocked() != nil {
		j.mu.Unlock()
		return false
	}
	j.compacting, j.tailing, j.tail = true, true, nil
	j.mu.Unlock()
	go j.compact(snapshot)
	return true
}

// compact runs one compaction and records its outcome.
func (j *Journal) compact(snapshot func(emit func(payload []byte) error) error) {
	err := j.runCompaction(snapshot)
	j.mu.Lock()
	j.compacting, j.tailing, j.tail = false, false, nil
	repeat := err != nil && err.Error() == j.lastCompactErr
	if err != nil {
		j.lastCompactErr = err.Error()
	} else {
		j.lastCompactErr = ""
	}
	j.mu.Unlock()
	if err != nil {
		// A down journal is rebuilt with a backoff for as long as it is
		// down: one line per distinct reason, the rest counted.
		if !repeat {
			j.log.Warn("journal compaction failed; the journal is kept as it is", "file", j.path, "reason", err)
		}
		j.stats.compactionFailures.Add(1)
	} else {
		j.stats.compactions.Add(1)
	}
	// A writer waiting to stop at Close waits for the compaction's end.
	j.wake()
}

// runCompaction fills the temporary file from snapshot and has the writer
// switch to it.
func (j *Journal) runCompaction(snapshot func(emit func(payload []byte) error) error) error {
	name := j.tempName()
	f, err := openJournalFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	switched := false
	defer func() {
		if !switched {
			f.Close()
			os.Remove(name)
		}
	}()
	size, err := j.fill(f, snapshot)
	if err != nil {
		return err
	}
	req := &finishReq{tmp: f, size: size, done: make(chan error, 1)}
	j.finish <- req
	if err := <-req.done; err != nil {
		return err
	}
	switched = true
	return nil
}

// fill writes the header and the snapshot's records to f and returns its
// size.
func (j *Journal) fill(f *os.File, snapshot func(emit func(payload []byte) error) error) (int64, error) {
	w := bufio.NewWriterSize(f, 256<<10)
	size := int64(len(header))
	w.WriteString(header)
	emit := func(p []byte) error {
		if len(p) > j.max {
			return fmt.Errorf("%w: a snapshot record of %d bytes, the bound is %d", ErrTooLarge, len(p), j.max)
		}
		var h [frameHeader]byte
		binary.LittleEndian.PutUint32(h[:4], uint32(len(p)))
		binary.LittleEndian.PutUint32(h[4:], checksum(h[:4], p))
		w.Write(h[:])
		_, err := w.Write(p)
		size += int64(frameHeader + len(p))
		return err
	}
	if err := snapshot(emit); err != nil {
		return 0, fmt.Errorf("the snapshot: %w", err)
	}
	if err := w.Flush(); err != nil {
		return 0, fmt.Errorf("writing %s: %w", f.Name(), err)
	}
	return size, nil
}

// finishCompaction runs in the writer, between two groups: nothing else
// writes the file meanwhile. The pending group is taken into the switch (its
// records are in the tail), so it is durable once the new file is.
func (j *Journal) finishCompaction(req *finishReq) {
	j.mu.Lock()
	g, buf := j.takeLocked()
	tail, old, off, broken := j.tail, j.file, j.size, j.broken
	j.tail, j.tailing = nil, false
	j.mu.Unlock()
	if err := j.switchTo(req, tail); err != nil {
		if g != nil {
			gerr := broken
			if gerr == nil {
				gerr = j.writeGroup(old, buf, off)
			} else {
				gerr = fmt.Errorf("statejournal: journal down: %w", gerr)
			}
			j.complete(g, buf, int64(len(buf)), gerr)
		}
		req.done <- err
		return
	}
	ident, serr := req.tmp.Stat()
	j.mu.Lock()
	// The new file holds the snapshot and every record appended since it
	// began, failed groups' included: it holds every record again, and a
	// Wait for a record whose group failed before the switch may pass.
	j.file, j.size, j.ident = req.tmp, req.size+int64(len(tail)), ident
	j.alloc = j.size
	j.broken, j.dirty, j.keepAside = nil, false, ""
	j.failed = failedRanges{}
	if serr != nil {
		// Without the file's identity no group could be checked against
		// the path: rebuild again rather than check nothing.
		j.ident, j.dirty = nil, true
	}
	j.mu.Unlock()
	if old != nil {
		old.Close()
	}
	// The new file was fsynced whole: nothing written is behind.
	j.lag.behind = false
	if g != nil {
		// The group is in the new file; it is durable once the rename is,
		// which a failed directory fsync leaves in doubt until it is redone.
		j.complete(g, buf, 0, j.redoDirSync())
	}
	req.done <- nil
}

// switchTo appends tail to the compaction file, syncs it and renames it over
// the journal. A failed directory fsync after the rename is not a failed
// compaction (the name already points at the new file) but leaves dirDirty
// set, so the next group retries it before it is acknowledged.
func (j *Journal) switchTo(req *finishReq, tail []byte) error {
	if _, err := j.hooks.writeAt(req.tmp, tail, req.size); err != nil {
		return fmt.Errorf("writing the tail to %s: %w", req.tmp.Name(), err)
	}
	if err := j.sync(req.tmp); err != nil {
		return fmt.Errorf("syncing %s: %w", req.tmp.Name(), err)
	}
	if err := j.keepUnreadAside(); err != nil {
		return err
	}
	if err := os.Rename(req.tmp.Name(), j.path); err != nil {
		return fmt.Errorf("renaming %s over %s: %w", req.tmp.Name(), j.path, err)
	}
	if err := j.syncDir(filepath.Dir(j.path)); err != nil {
		j.mu.Lock()
		j.dirDirty = true
		j.mu.Unlock()
	}
	return nil
}

// keepUnreadAside moves aside what sits at the journal's path when it was
// never read (a journal that could not be opened at start): the rebuild's
// rename would otherwise destroy records that a person may still recover.
func (j *Journal) keepUnreadAside() error {
	j.mu.Lock()
	why := j.keepAside
	j.mu.Unlock()
	if why == "" {
		return nil
	}
	if _, err := os.Lstat(j.path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	to := j.asideName(j.path)
	if err := os.Rename(j.path, to); err != nil {
		return fmt.Errorf("statejournal: moving %s aside (%s): %w", j.path, why, err)
	}
	j.log.Error("journal: a file the daemon did not read was moved aside for the rebuilt journal; its records are not in the state table", "file", j.path, "keptAs", to, "reason", why)
	return nil
}
