package statejournal

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// ErrUnwritable is wrapped by Open's error when it handed every record of
// the file to the caller but could not make the file writable: the cut of
// a torn tail, or the fresh file that replaces a damaged one, failed to
// be written or synced (ENOSPC, EIO). The caller has the records; the
// file is as it was, and the caller rebuilds it later from what it holds.
var ErrUnwritable = errors.New("statejournal: the journal was read but cannot be made writable")

// UnwritableError is Open's error for ErrUnwritable: the cause, and what
// the read found (torn and damaged bytes), which a caller without a
// Journal still reports.
type UnwritableError struct {
	Found Stats
	Err   error
}

func (e *UnwritableError) Error() string { return ErrUnwritable.Error() + ": " + e.Err.Error() }

func (e *UnwritableError) Unwrap() []error { return []error{ErrUnwritable, e.Err} }

// recovery is one Open's reading of a journal file. It hands each valid
// record to the caller and, from the first damaged region that valid
// records follow, copies every valid record into a fresh file beside the
// journal (its temporary name, which a crash leaves to clearTemp: until
// the rename the journal itself is whole evidence). Memory is one record
// at a time: the scanner's window and the fresh file's buffer.
type recovery struct {
	j       *Journal
	src     *os.File
	size    int64
	each    func([]byte) error
	records int64 // valid records read
	good    int64 // the end of the last valid record (the header's, if none)

	regions, lostBytes, lostRecords int64
	exact                           bool   // every region's records were counted by its lengths
	first                           Damage // the first damaged region, for the log line
	tail                            *Damage

	fresh     *os.File
	w         *bufio.Writer
	freshSize int64
	freshErr  error // why the fresh file could not be written; the read goes on
}

// record takes a valid record: to the caller, and to the fresh file once
// there is one.
func (rc *recovery) record(off int64, frame []byte) error {
	if rc.each != nil {
		if err := rc.each(frame[frameHeader:]); err != nil {
			return fmt.Errorf("the caller refused the record at %d: %w", off, err)
		}
	}
	rc.records++
	rc.good = off + int64(len(frame))
	if rc.fresh != nil && rc.freshErr == nil {
		if _, err := rc.w.Write(frame); err != nil {
			rc.freshErr = fmt.Errorf("writing %s: %w", rc.fresh.Name(), err)
		}
		rc.freshSize += int64(len(frame))
	}
	return nil
}

// damage takes a damaged region. A tail with no damage before it is a torn
// tail, cut as always; any other region is counted, and the first one
// that valid records follow starts the fresh file.
func (rc *recovery) damage(d Damage) error {
	if d.Tail && rc.regions == 0 {
		rc.tail = &d
		return nil
	}
	if rc.regions == 0 {
		rc.first, rc.exact = d, true
	}
	rc.regions++
	rc.lostBytes += d.Bytes()
	rc.lostRecords += int64(d.Records)
	rc.exact = rc.exact && d.RecordsExact
	if rc.fresh == nil && rc.freshErr == nil {
		rc.freshErr = rc.startFresh(d.Offset)
	}
	return nil
}

// startFresh creates the fresh file and copies into it the header and the
// valid records before the first damaged region, which starts at upto.
func (rc *recovery) startFresh(upto int64) error {
	name := rc.j.tempName()
	f, err := openJournalFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	rc.fresh, rc.w = f, bufio.NewWriterSize(f, int(min(256<<10, rc.size)))
	rc.w.WriteString(header)
	n := max(upto-int64(len(header)), 0)
	if _, err := io.Copy(rc.w, io.NewSectionReader(rc.src, int64(len(header)), n)); err != nil {
		return fmt.Errorf("copying the records before the damage into %s: %w", name, err)
	}
	rc.freshSize = int64(len(header)) + n
	return nil
}

// abandon removes the fresh file, if any.
func (rc *recovery) abandon() {
	if rc.fresh != nil {
		rc.fresh.Close()
		os.Remove(rc.fresh.Name())
		rc.fresh = nil
	}
}

// replace makes the fresh file the journal: it is synced, the damaged
// file kept as evidence under another name (a hard link, else a copy:
// never truncated or rewritten), and the fresh file renamed over the
// journal, with a sync of the directory. At every point a crash leaves
// the damaged journal or the fresh one at the path. It logs the one
// ERROR line, whether the replacement worked or not.
func (rc *recovery) replace() error {
	j := rc.j
	j.stats.damagedRegions.Add(uint64(rc.regions))
	j.stats.damagedBytes.Add(uint64(rc.lostBytes))
	j.stats.damagedRecords.Add(uint64(rc.lostRecords))
	evidence, err := rc.install()
	line := []any{"file", j.path, "regions", rc.regions, "bytesLost", rc.lostBytes,
		"recordsLost", rc.lostRecords, "recordsLostIs", exactness(rc.exact),
		"recordsKept", rc.records, "firstOffset", rc.first.Offset, "reason", rc.first.Reason}
	if err != nil {
		rc.abandon()
		j.log.Error("journal damaged: records lost; the journal could not be rewritten and is left as it is",
			append(line, "error", err.Error())...)
		return &UnwritableError{Found: j.Stats(), Err: err}
	}
	j.log.Error("journal damaged: records lost; the damaged file is kept and a fresh journal holds every valid record",
		append(line, "keptAs", evidence)...)
	return nil
}

// install does replace's file work and returns the evidence's name.
func (rc *recovery) install() (string, error) {
	j := rc.j
	if rc.freshErr != nil {
		return "", rc.freshErr
	}
	if err := rc.w.Flush(); err != nil {
		return "", fmt.Errorf("writing %s: %w", rc.fresh.Name(), err)
	}
	if err := j.sync(rc.fresh); err != nil {
		return "", fmt.Errorf("syncing %s: %w", rc.fresh.Name(), err)
	}
	evidence := j.path + ".damaged-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := rc.keep(evidence); err != nil {
		return "", err
	}
	if err := os.Rename(rc.fresh.Name(), j.path); err != nil {
		return "", fmt.Errorf("renaming %s over %s: %w", rc.fresh.Name(), j.path, err)
	}
	if err := j.syncDir(filepath.Dir(j.path)); err != nil {
		// The rename is done; the first group redoes the sync before it
		// is acknowledged, as after a compaction.
		j.dirDirty = true
	}
	ident, err := rc.fresh.Stat()
	if err != nil {
		return "", fmt.Errorf("stat of %s: %w", rc.fresh.Name(), err)
	}
	rc.src.Close()
	j.file, j.size, j.alloc, j.ident = rc.fresh, rc.freshSize, rc.freshSize, ident
	rc.fresh = nil
	return evidence, nil
}

// exactness says whether a count of records lost is exact or a lower
// bound, as the log lines say it.
func exactness(exact bool) string {
	if exact {
		return "exact"
	}
	return "atLeast"
}

// link is os.Link; a test replaces it to stand for a file system without
// hard links (FAT, some network mounts), where os.Link fails.
var link = os.Link

// keep gives the damaged file the name evidence as well: a hard link, or,
// where the file system has none, a copy of its bytes, synced.
func (rc *recovery) keep(evidence string) error {
	if err := link(rc.j.path, evidence); err == nil {
		return nil
	}
	f, err := openJournalFile(evidence, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("keeping the damaged journal as %s: %w", evidence, err)
	}
	_, err = io.Copy(f, io.NewSectionReader(rc.src, 0, rc.size))
	if err == nil {
		err = rc.j.sync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(evidence)
		return fmt.Errorf("copying the damaged journal to %s: %w", evidence, err)
	}
	return nil
}
