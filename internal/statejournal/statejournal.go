// Package statejournal owns a journal file of checksummed records: the
// on-disk half of the node's state table. It frames opaque payloads that the
// caller encodes, appends them with group commit, recovers from a torn tail
// and crosses damage at start, and compacts the file in the background from a snapshot the
// caller emits. What a record means is the caller's business, not this
// package's.
//
// It imports nothing of this module and never net/http: it is a file format
// and a write discipline, fuzzed alone (FuzzOpen).
//
// # File format
//
// A file starts with the line "nvpair-statejournal v1\n". Each record
// follows as a 4-byte little-endian payload length, a 4-byte little-endian
// CRC32-C (Castagnoli) of the length field and the payload together, and the
// payload. The length is under the checksum so that a tail of zero bytes is
// not read as valid empty records, and so that the search for the next
// record after damage (below) takes a false one at an offset only with a
// chance of 2^-32.
//
// # Reading and damage
//
// Open hands the records to its caller one at a time, in file order, each
// payload valid only during the call, so a restore holds one record beside
// what it builds, never the file. A record that is not whole and valid (a
// length past the end of the file or over MaxRecordBytes, a checksum that
// does not match, a header cut short) starts a damaged region, and the
// reader searches forward for the next offset where a whole record's
// length and checksum check out; an impossible length is rejected before
// any checksum, and the checksummed bytes of the search are bounded
// (resyncBudget). Every valid record on both sides of the damage is
// delivered. Damage that nothing valid follows is a torn tail: the file is
// cut at the last whole record with one warning (offset, bytes dropped).
// Damage that valid records follow is not a crash's: the damaged file is
// kept as evidence under <path>.damaged-<unixnano> (a hard link, else a
// copy; never truncated or rewritten), a fresh file holding every valid
// record (created with O_EXCL as <path>.tmp, fsynced) is renamed over the
// journal and the directory fsynced, and one ERROR line gives the damaged
// regions, the bytes and the records lost (at least one per region; the
// exact count when a region's own length fields lead across it), and the
// records kept; Stats counts them. A header line that is neither this
// version's nor another's is damage too when valid records follow it.
//
// Open's errors are a contract with its caller. nil: every record was
// delivered and the journal takes appends. An error wrapping
// ErrUnwritable: every record was delivered, but the file could not be
// made writable (the cut or the fresh file failed to be written or
// synced: ENOSPC, EIO); the file still holds every record delivered (a
// damaged one is left as it was) and the caller, which has restored the
// records, rebuilds the journal from them later. Any
// other error: the read did not finish (the file could not be opened or
// read, or the caller's function failed), and whatever was delivered must
// be dropped.
//
// # Group commit
//
// Append copies a framed record into the pending group and returns at once;
// one writer goroutine takes the whole pending group, writes it with one
// write and makes it durable with one fsync, then wakes every waiter of that
// group by closing the group's channel. Records appended meanwhile form the
// next group, so under load a group holds every record that arrived during
// the previous fsync, and the cost of a record is its own bytes plus a share
// of one fsync.
//
// # Failures
//
// A failed write or fsync fails the waiters of that group with an error
// wrapping the cause, and the journal keeps going: the writer truncates the
// file back to where the group started and the next group is written from
// that same offset, so a transient ENOSPC or EIO neither corrupts the file
// nor stops the node for good. Only the bytes of groups whose fsync
// succeeded are ever counted on; after a failed fsync Linux may have dropped
// the dirty pages, and those bytes are cut away rather than synced again. If
// the truncation itself fails the journal cannot know what the file holds:
// it is down (Health), and every later group fails at once without I/O.
// After each group's fsync the path is checked to name the file still
// (device and inode): a journal unlinked, renamed or replaced under the
// daemon is down too, since a restart would not read what it holds. A
// journal that could not be opened at all (OpenDown) starts down. Appends
// are still taken while it is down, so that a rebuild sees them.
//
// Any failed group leaves the file without changes its caller holds
// (Health.Dirty). The cure for both is a rebuild: Compact writes a new file
// from the caller's state and the records appended meanwhile, failed ones
// included, and once it is renamed over the path the journal is healthy
// again. A record whose Wait returned an error may or may not be in the
// file after a crash (its bytes may have reached the device before the
// failure was seen, or a rebuild may carry it); the caller treats it as not
// acknowledged.
//
// # What fsync promises
//
// A record whose Wait returned nil survives a crash of the process, of the
// kernel or a loss of power: there is no crash window for it. On Linux,
// File.Sync is fsync(2), which writes the file's data and metadata from the
// page cache to the device and asks the device to flush its volatile cache.
// On macOS, fsync(2) alone only hands the data to the drive, whose cache may
// still lose it; Go's File.Sync therefore issues fcntl(F_FULLFSYNC), which
// asks the drive to flush its cache too, falling back to fsync only where
// F_FULLFSYNC is not supported, such as SMB mounts
// (src/internal/poll/fd_fsync_darwin.go in the Go tree, issue golang/go#64215
// for the fallback). On Windows File.Sync is FlushFileBuffers
// (src/syscall/syscall_windows.go, Fsync), which writes the file's buffers
// and asks the device to flush. A new file and a compaction's rename are made
// durable by an fsync of the directory on Unix; Windows cannot open a
// directory to sync it, and relies on NTFS journaling the rename
// (MoveFileEx). A record not yet waited for may be lost by a crash; a
// record appended but whose group failed may or may not survive.
//
// # Compaction
//
// Compact writes a new file beside the journal (path+".tmp", created with
// O_EXCL and without following a link), fills it from the caller's snapshot,
// appends every record appended since the compaction started, fsyncs it,
// renames it over the journal, fsyncs the directory and switches appends to
// it. The snapshot is emitted in slices under the caller's own locks, so no
// lock is held across work proportional to the file. The records appended
// during the snapshot may already be reflected in it and are replayed after
// it: a caller's records must be last-wins when replayed in order.
package statejournal

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a Journal. The zero value is usable.
type Options struct {
	// MaxRecordBytes bounds a payload: Append refuses a longer one with
	// ErrTooLarge, and Open treats a record declaring a longer one as
	// corruption. 0 means DefaultMaxRecordBytes; at most 1 GiB.
	MaxRecordBytes int
	// Logger receives one WARN per torn tail dropped, per file set aside and
	// per failed compaction, and one ERROR per damaged file replaced. nil
	// means slog.Default().
	Logger *slog.Logger
	// NoSync skips every fsync. For tests only: a journal with NoSync
	// promises nothing across a crash of the machine.
	NoSync bool
	// SyncEvery, when not 0, answers a group's waiters once it is written
	// and fsyncs in the background at most SyncEvery after the first group
	// written since the last fsync: a record whose Wait returned survives
	// kill -9 (it is in the page cache) and may be lost to a power loss or
	// a kernel crash within SyncEvery. 0 fsyncs each group before its
	// waiters are answered. At most MaxSyncEvery.
	SyncEvery time.Duration

	// hooks lets tests inject failures into the writer's I/O; nil in
	// production.
	hooks *hooks
}

// hooks replaces the writer's file operations in tests.
type hooks struct {
	writeAt  func(f *os.File, b []byte, off int64) (int, error)
	sync     func(f *os.File) error
	truncate func(f *os.File, size int64) error
}

// MaxSyncEvery is the longest Options.SyncEvery: the most answered records
// a power loss may take is this long of them.
const MaxSyncEvery = 10 * time.Second

// ErrClosed is returned by Append, Wait and Compact on a closed journal.
var ErrClosed = errors.New("statejournal: journal closed")

// Journal is an open journal file. Its methods are safe for concurrent use.
type Journal struct {
	path      string
	max       int
	log       *slog.Logger
	noSync    bool
	syncEvery time.Duration
	hooks     hooks
	lag       syncLag // the writer goroutine's alone

	mu      sync.Mutex
	last    uint64 // sequence of the last record appended
	cur     *group // the group collecting appends, nil if none
	pending []byte // framed records of cur
	spare   []byte // the buffer of the last group written, for reuse
	flight  *group // the group the writer is writing, nil if none
	size    int64  // bytes of the file, through the last durable group
	// alloc is the file's length on disk: size and, past it, zeros
	// written and synced ahead of the groups (preallocBytes), so that a
	// group written within them changes none of the file's metadata.
	alloc  int64
	file   *os.File
	closed bool
	broken error // set when the file's content is no longer known
	failed failedRanges
	// compacting is set from Compact to the end of its switch; tailing while
	// appends must also be copied to tail.
	compacting bool
	tailing    bool
	tail       []byte
	dirDirty   bool // a rename's directory fsync failed and must be redone
	// ident is the file's identity (device and inode) when it was opened
	// or switched to: a group is acknowledged only while the path still
	// names it (checkIdentity).
	ident fs.FileInfo
	// dirty says a group failed since the file last held every record
	// (Health).
	dirty bool
	// keepAside, when not "", says why what sits at the path must be
	// moved aside before a rebuild's rename: it was never read.
	keepAside string
	// lastCompactErr is the last compaction's failure, so a rebuild
	// retried with a backoff logs each reason once.
	lastCompactErr string
	// closeErr is the writer's last fsync's failure at close (SyncEvery),
	// for Close to return; written by the writer before it stops.
	closeErr error

	kick    chan struct{} // wakes the writer; capacity 1
	finish  chan *finishReq
	stopped chan struct{} // closed when the writer has returned

	stats counters
}

// group is one write and one fsync's worth of records: sequences first
// through last. done is closed when err is final.
type group struct {
	first, last uint64
	done        chan struct{}
	err         error
}

// counters back Stats.
type counters struct {
	records, bytes, groups, groupFailures atomic.Uint64
	compactions, compactionFailures       atomic.Uint64
	lagSyncs, syncFailures                atomic.Uint64
	tornTails, droppedBytes               atomic.Uint64
	damagedRegions, damagedBytes          atomic.Uint64
	damagedRecords                        atomic.Uint64
}

// Stats are the journal's counters since Open, for metrics.
type Stats struct {
	Records            uint64 // records appended
	Bytes              uint64 // framed bytes appended
	Groups             uint64 // groups written: one write and one fsync each
	GroupFailures      uint64 // groups whose write or fsync failed
	Compactions        uint64 // compactions done
	CompactionFailures uint64 // compactions that failed and kept the old file
	LagSyncs           uint64 // background fsyncs (SyncEvery mode)
	LagSyncFailures    uint64 // background fsyncs that failed: the journal is dirty until rebuilt
	TornTails          uint64 // damaged tails Open dropped (0 or 1)
	DroppedBytes       uint64 // bytes Open dropped with them
	// Damage that valid records followed, which Open crossed (the file
	// kept as evidence): its regions, their bytes, and the records they
	// held (at least one per region).
	DamagedRegions uint64
	DamagedBytes   uint64
	DamagedRecords uint64
}

// Open opens the journal at path, creating it if there is none, and hands
// each of its records to each, in order (each may be nil). A payload is
// valid only during its call: each copies what it keeps. Damage is
// crossed: a torn tail is cut off with one warning; damage that valid
// records follow is kept as evidence (<path>.damaged-<unixnano>) and a
// fresh journal holding every valid record replaces it, with one error
// line (see the package comment). A path that is not a regular file (a
// directory, a named pipe, a symbolic link) or a file with another header
// is moved aside to path+".aside-<unixnano>" with one warning and a fresh
// journal is started. A temporary file left by an interrupted compaction
// or recovery is removed, or moved aside if it is not a regular file.
//
// An error wrapping ErrUnwritable (an *UnwritableError) means every
// record was handed to each but the file could not be made writable; any
// other error means the read did not finish, and the caller must drop
// whatever each was given.
func Open(path string, opt Options, each func(payload []byte) error) (*Journal, error) {
	j, err := newJournal(path, opt)
	if err != nil {
		return nil, err
	}
	if err := j.clearTemp(); err != nil {
		return nil, err
	}
	if err := j.openFile(each); err != nil {
		return nil, err
	}
	go j.writer()
	return j, nil
}

func newJournal(path string, opt Options) (*Journal, error) {
	max := opt.MaxRecordBytes
	if max == 0 {
		max = DefaultMaxRecordBytes
	}
	if max < 0 || max > maxRecordLimit {
		return nil, fmt.Errorf("statejournal: MaxRecordBytes %d outside 0..%d", opt.MaxRecordBytes, maxRecordLimit)
	}
	if opt.SyncEvery < 0 || opt.SyncEvery > MaxSyncEvery {
		return nil, fmt.Errorf("statejournal: SyncEvery %v outside 0..%v", opt.SyncEvery, MaxSyncEvery)
	}
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	j := &Journal{
		path: path, max: max, log: log, noSync: opt.NoSync, syncEvery: opt.SyncEvery,
		hooks: hooks{
			writeAt:  func(f *os.File, b []byte, off int64) (int, error) { return f.WriteAt(b, off) },
			sync:     dataSync,
			truncate: (*os.File).Truncate,
		},
		kick:    make(chan struct{}, 1),
		finish:  make(chan *finishReq),
		stopped: make(chan struct{}),
	}
	if opt.hooks != nil {
		h := opt.hooks
		if h.writeAt != nil {
			j.hooks.writeAt = h.writeAt
		}
		if h.sync != nil {
			j.hooks.sync = h.sync
		}
		if h.truncate != nil {
			j.hooks.truncate = h.truncate
		}
	}
	return j, nil
}

// OpenDown returns a journal that has no file: Open failed with cause.
// A cause wrapping ErrUnwritable says Open read the file whole and the
// caller restored its records: the rebuild may replace it.
// It takes records and fails their groups at once (Health().Down says
// why) until a Compact, the rebuild, writes a file from the caller's
// state. Whatever sits at the path was not read, so a rebuild moves it
// aside to path+".aside-<unixnano>" rather than replace it, unless it is
// an empty file (a creation cut short). It never fails: a journal that
// cannot be written now may be writable later (space freed, a directory's
// mode fixed), and the caller keeps running meanwhile.
func OpenDown(path string, opt Options, cause error) *Journal {
	j, err := newJournal(path, opt)
	if err != nil { // a bad bound: Open said so already; the default serves
		opt.MaxRecordBytes = 0
		j, _ = newJournal(path, opt)
	}
	j.broken = fmt.Errorf("not opened: %w", cause)
	j.dirty = true
	// A file Open read whole (ErrUnwritable: its records were delivered)
	// is the caller's state already; only an unread one is kept aside.
	if st, err := os.Lstat(path); err == nil && !errors.Is(cause, ErrUnwritable) && !(st.Mode().IsRegular() && st.Size() == 0) {
		j.keepAside = "the journal could not be read when the daemon started (" + cause.Error() + ")"
	}
	// A compaction file left behind would refuse the rebuild's O_EXCL
	// create for good.
	if err := j.clearTemp(); err != nil {
		j.log.Warn("journal: a stale compaction file could not be cleared", "file", j.tempName(), "reason", err)
	}
	go j.writer()
	return j
}

// tempName is the file a compaction fills before its rename.
func (j *Journal) tempName() string { return j.path + ".tmp" }

// clearTemp removes what an interrupted compaction or recovery left
// behind. Its records are all in the journal still (the rename is what
// would have made the temporary file count), so nothing is lost. Anything
// but a regular file is moved aside rather than removed: a directory
// cannot be removed if it holds files, and one left in place would make
// every later compaction fail.
func (j *Journal) clearTemp() error {
	tmp := j.tempName()
	st, err := os.Lstat(tmp)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("statejournal: inspecting %s: %w", tmp, err)
	case st.Mode().IsRegular():
		if err := os.Remove(tmp); err != nil {
			return fmt.Errorf("statejournal: removing the stale %s: %w", tmp, err)
		}
		return nil
	default:
		return j.setAside(tmp, "a stale compaction file that is not a regular file ("+st.Mode().Type().String()+")")
	}
}

// asideName is where name is moved when it is set aside.
func (j *Journal) asideName(name string) string {
	return name + ".aside-" + strconv.FormatInt(time.Now().UnixNano(), 10)
}

// setAside renames name out of the way with one warning.
func (j *Journal) setAside(name, why string) error {
	to := j.asideName(name)
	if err := os.Rename(name, to); err != nil {
		return fmt.Errorf("statejournal: moving %s aside (%s): %w", name, why, err)
	}
	j.log.Warn("journal unusable: moved aside, starting a fresh one", "file", name, "keptAs", to, "reason", why)
	return nil
}

// openFile opens the journal file, or sets aside what is there and creates
// one, and reads its records.
func (j *Journal) openFile(each func([]byte) error) error {
	st, err := os.Lstat(j.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return j.create()
	case err != nil:
		return fmt.Errorf("statejournal: inspecting %s: %w", j.path, err)
	case !st.Mode().IsRegular():
		if err := j.setAside(j.path, "not a regular file ("+st.Mode().Type().String()+")"); err != nil {
			return err
		}
		return j.create()
	}
	f, err := openJournalFile(j.path, os.O_RDWR, 0)
	if err != nil {
		return j.readOnly(fmt.Errorf("statejournal: opening %s: %w", j.path, err), each)
	}
	if err := j.recover(f, st, each); err != nil {
		f.Close()
		return err
	}
	return nil
}

// readOnly is openFile's way when the journal cannot be opened for
// writing (a read-only file system, a mode that forbids it): its records
// are read and delivered all the same, and the error wraps ErrUnwritable,
// so the caller restores them and rebuilds the file once it can. A file
// that cannot be read either, or is not a journal, delivers nothing and
// is openErr.
func (j *Journal) readOnly(openErr error, each func([]byte) error) error {
	if each == nil {
		each = func([]byte) error { return nil }
	}
	journal, _, err := Inspect(j.path, j.max, func(_ int64, p []byte) error { return each(p) }, func(Damage) error { return nil })
	switch {
	case err != nil:
		return fmt.Errorf("%w (and reading it: %v)", openErr, err)
	case !journal:
		return openErr
	}
	return &UnwritableError{Found: j.Stats(), Err: openErr}
}

// recover reads the opened file f, handing its records to each, and makes
// it (or the fresh file that replaces a damaged one) the journal's file;
// a file with another header, or with no valid record after a header
// that is not one, is set aside instead.
func (j *Journal) recover(f *os.File, lst fs.FileInfo, each func([]byte) error) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("statejournal: stat of %s: %w", j.path, err)
	}
	if !st.Mode().IsRegular() || !os.SameFile(st, lst) {
		return fmt.Errorf("statejournal: %s changed between its inspection and its open", j.path)
	}
	rc := &recovery{j: j, src: f, size: st.Size(), each: each, good: int64(len(header))}
	hs, err := scan(f, st.Size(), j.max, visitor{record: rc.record, damage: rc.damage})
	if err != nil {
		rc.abandon()
		return fmt.Errorf("statejournal: reading %s: %w", j.path, err)
	}
	switch {
	case hs == headerOther || hs == headerBad || (hs == headerDamaged && rc.records == 0):
		rc.abandon()
		f.Close()
		if err := j.setAside(j.path, "its first line is not \""+header[:len(header)-1]+"\""); err != nil {
			return err
		}
		return j.create()
	case hs == headerTorn:
		// A creation cut short before its header was whole: nothing was
		// ever acknowledged from this file.
		return j.startFile(f, "")
	case rc.regions > 0:
		return rc.replace()
	case rc.tail != nil:
		if err := j.cut(f, rc.tail); err != nil {
			return &UnwritableError{Found: j.Stats(), Err: err}
		}
	}
	// A zero tail past the last record (the preallocation) is kept: the
	// next group is written over it.
	j.file, j.size, j.alloc, j.ident = f, rc.good, max(rc.good, rc.size), st
	if rc.tail != nil {
		j.alloc = rc.good
	}
	return nil
}

// cut truncates f where its torn tail d begins, with one warning.
func (j *Journal) cut(f *os.File, d *Damage) error {
	if err := f.Truncate(d.Offset); err != nil {
		return fmt.Errorf("statejournal: cutting the damaged tail of %s at %d: %w", j.path, d.Offset, err)
	}
	if err := j.sync(f); err != nil {
		return fmt.Errorf("statejournal: syncing %s after cutting its tail: %w", j.path, err)
	}
	j.stats.tornTails.Add(1)
	j.stats.droppedBytes.Add(uint64(d.Bytes()))
	j.log.Warn("journal: dropped a torn or damaged tail", "file", j.path, "offset", d.Offset, "bytesDropped", d.Bytes(),
		"recordsDropped", d.Records, "recordsDroppedIs", exactness(d.RecordsExact), "reason", d.Reason)
	return nil
}

// create makes a new journal file; O_EXCL refuses anything created at the
// path since it was inspected, a planted link included.
func (j *Journal) create() error {
	f, err := openJournalFile(j.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("statejournal: creating %s: %w", j.path, err)
	}
	if err := j.startFile(f, filepath.Dir(j.path)); err != nil {
		f.Close()
		return err
	}
	return nil
}

// startFile writes the header to the empty (or torn) file f and makes it the
// journal's file; dir, if not empty, is synced so the new name is durable.
func (j *Journal) startFile(f *os.File, dir string) error {
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("statejournal: emptying %s: %w", j.path, err)
	}
	if _, err := f.WriteAt([]byte(header), 0); err != nil {
		return fmt.Errorf("statejournal: writing the header of %s: %w", j.path, err)
	}
	if err := j.sync(f); err != nil {
		return fmt.Errorf("statejournal: syncing %s: %w", j.path, err)
	}
	if dir != "" {
		if err := j.syncDir(dir); err != nil {
			return fmt.Errorf("statejournal: syncing the directory of %s: %w", j.path, err)
		}
	}
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("statejournal: stat of %s: %w", j.path, err)
	}
	j.file, j.size, j.alloc, j.ident = f, int64(len(header)), int64(len(header)), st
	return nil
}

// sync is f.Sync unless NoSync.
func (j *Journal) sync(f *os.File) error {
	if j.noSync {
		return nil
	}
	return j.hooks.sync(f)
}

// syncDir makes a creation or rename in dir durable. Windows cannot open a
// directory for syncing; NTFS journals the rename itself.
func (j *Journal) syncDir(dir string) error {
	if j.noSync || runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Size is the bytes of the journal file now, header included, through the
// last group written.
func (j *Journal) Size() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.size
}

// Stats returns the journal's counters.
func (j *Journal) Stats() Stats {
	s := &j.stats
	return Stats{
		Records: s.records.Load(), Bytes: s.bytes.Load(),
		Groups: s.groups.Load(), GroupFailures: s.groupFailures.Load(),
		Compactions: s.compactions.Load(), CompactionFailures: s.compactionFailures.Load(),
		LagSyncs: s.lagSyncs.Load(), LagSyncFailures: s.syncFailures.Load(),
		TornTails: s.tornTails.Load(), DroppedBytes: s.droppedBytes.Load(),
		DamagedRegions: s.damagedRegions.Load(), DamagedBytes: s.damagedBytes.Load(),
		DamagedRecords: s.damagedRecords.Load(),
	}
}
