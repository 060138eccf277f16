package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/statejournal"
	"nvpair-workload-manager/internal/statetable"
)

// The journal (spec 5.3) is the state table's memory across a restart:
// every change the table must not lose is a record, appended in the same
// hold as the change; an ingress frame's 200 waits until its record is
// durable, one write and one fsync for every frame waiting (group
// commit). It is read once at start, before any listener serves and
// before the broker's replay, compacted in the background from the table
// when it outgrows twice what it must hold, and rebuilt from the table the
// same way when a fault left it down or without records the table holds.

// journalFile is what the Manager uses of its journal
// (*statejournal.Journal): a test stands in for it to hold a write.
type journalFile interface {
	statetable.Journal
	Wait(seq uint64) error
	Compact(snapshot func(emit func([]byte) error) error) bool
	Health() statejournal.Health
	Size() int64
	Close() error
	Stats() statejournal.Stats
}

// tableJournal keeps the state table's journal: it opens it and rebuilds
// the table from it at start, rebuilds the file from the table when it is
// down or missed records, compacts it, waits on its records for the
// ingress, and closes it within the shutdown's budget. Its file is set
// once, before the first change (use), and never again, so it is read
// without a lock; with a path it is never nil (a journal that cannot be
// opened is a down one, statejournal.OpenDown).
type tableJournal struct {
	path  string        // "" keeps no journal
	fsync time.Duration // --journal-fsync: 0 before each answer, else at most this long after
	log   *slog.Logger
	table *statetable.Table
	file  journalFile // nil only without a path

	// The rebuild's schedule and what was last logged of the journal's
	// state, touched only by the prune loop (maybeCompact) but for
	// nextRebuild, which the ingress reads for its Retry-After.
	nextRebuild atomic.Int64 // unix nanoseconds of the next attempt; 0: at once
	backoff     time.Duration
	logged      journalState
}

// journalState is what an operator is told of the journal, once per change.
type journalState int

const (
	journalUp    journalState = iota // every record written
	journalDirty                     // a group failed: records the table holds are missing from the file
	journalDown                      // every group fails at once: the ingress refuses frames
)

// The rebuild's backoff: the first attempt at the next prune, then doubling
// to a cap that keeps a lasting fault to one attempt (and, for a new
// reason, one line) every 30 s.
const (
	rebuildFirstBackoff = time.Second
	rebuildMaxBackoff   = 30 * time.Second
)

// use makes f the journal and the table's, before the first change.
func (j *tableJournal) use(f journalFile) {
	j.file = f
	j.table.SetJournal(f)
}

// errNotJournaled is the wait of a frame whose record the journal refused.
var errNotJournaled = errors.New("the journal did not take the frame's record")

// wait returns once the record of sequence seq is durable; at once for
// seq 0 (no record) or without a journal. A record the journal refused
// (statetable.NotJournaled) is an error: its frame's answer is not a 200.
func (j *tableJournal) wait(seq uint64) error {
	switch {
	case seq == statetable.NotJournaled:
		return errNotJournaled
	case seq == 0 || j.file == nil:
		return nil
	}
	return j.file.Wait(seq)
}

// refuseWhileDown is the ingress's check before a frame is written: while
// the journal is down no frame could be made durable, so none is written,
// and the producer is told when to try again (503, Retry-After). A journal
// that is merely dirty still makes each new record durable and refuses
// nothing.
func (j *tableJournal) refuseWhileDown() error {
	if j.file == nil {
		return nil
	}
	h := j.file.Health()
	if h.Down == nil {
		return nil
	}
	after := time.Until(time.Unix(0, j.nextRebuild.Load()))
	return &ingress.JournalDownError{After: max(after, time.Second)}
}

// journalFileName is the journal's name in the app dir, beside
// node-id.json. The journal of earlier versions (a JSON file rewritten
// whole, workload-manager-journal.json) is neither read nor removed.
const journalFileName = "workload-manager.journal"

// parseJournalFsync reads --journal-fsync: "always" (0: fsync before each
// answer) or a duration from minJournalFsync to statejournal.MaxSyncEvery.
func parseJournalFsync(v string) (time.Duration, error) {
	if v == "always" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < minJournalFsync || d > statejournal.MaxSyncEvery {
		return 0, fmt.Errorf("must be always, or a duration from %v to %v (write it with a unit: 100ms)", minJournalFsync, statejournal.MaxSyncEvery)
	}
	return d, nil
}

// minJournalFsync is the shortest --journal-fsync interval: below it the
// background fsyncs cost what "always" costs, without its promise.
const minJournalFsync = 10 * time.Millisecond

// journalCompactFloor is the least size a journal is compacted at: below
// it a rewrite costs more than the bytes it saves.
const journalCompactFloor = 4 << 20

// open opens the journal and rebuilds the table from it. A journal that
// cannot be opened never keeps the daemon from starting (a node that
// cannot write its app dir still relays): it is a down journal, one ERROR
// line, rebuilt from the table by the prune loop once it can be written
// (space freed, a mode fixed); meanwhile the ingress refuses frames, 503.
//
// leaseGrace is the least time a restored lease is given
// (restartLeaseGrace lease units).
func (j *tableJournal) open(leaseGrace time.Duration) {
	if j.path == "" {
		return
	}
	opt := statejournal.Options{Logger: j.log, SyncEvery: j.fsync}
	f, restore, err := j.read(opt, leaseGrace)
	if err != nil && !errors.Is(err, statejournal.ErrUnwritable) {
		// Nothing was read: the rebuild will move what sits at the path
		// aside, never restore it (one ERROR line says so then).
		j.use(statejournal.OpenDown(j.path, opt, err))
		j.noteState()
		return
	}
	st := restore.Finish()
	if err != nil {
		// Every record was read and restored; the file cannot be written
		// (a read-only or full file system, a cut that failed): the
		// journal is down until the rebuild writes it from the table.
		j.use(statejournal.OpenDown(j.path, opt, err))
		j.noteState()
	} else {
		j.use(f)
	}
	if st.Records > 0 {
		j.log.Info("journal read", "file", j.path, "records", st.Records, "runs", st.Runs, "ends", st.Ends, "members", st.Members, "refused", st.Refused, "overLimit", st.OverLimit)
	}
}

// openTries and openRetry bound the start's retries of a journal that
// cannot be read: a transient fault (EIO, EMFILE) should not cost the
// records of the last run, and a lasting one must not hold the start for
// long. About a second in all, before any listener serves.
const (
	openTries = 4
	openRetry = 100 * time.Millisecond
)

// read opens the journal, streaming its records into a restore; the table
// is rebuilt from them only once the read is whole (spec 5.3). A journal
// that cannot be read is tried again, openTries times in all, waiting
// openRetry, then three times it, then nine, with a fresh restore each
// time: records of a failed read are dropped.
func (j *tableJournal) read(opt statejournal.Options, leaseGrace time.Duration) (*statejournal.Journal, *statetable.Restorer, error) {
	wait := openRetry
	for try := 1; ; try++ {
		restore := j.table.BeginRestore(leaseGrace)
		f, err := statejournal.Open(j.path, opt, restore.Add)
		if err == nil || errors.Is(err, statejournal.ErrUnwritable) || try == openTries {
			return f, restore, err
		}
		if _, serr := os.Lstat(j.path); serr != nil {
			return f, restore, err // nothing there to read: creating it failed
		}
		time.Sleep(wait)
		wait *= 3
	}
}

// maybeCompact rebuilds the journal when it is down or missed records,
// on the rebuild's backoff; else compacts it when it holds more than twice
// what the table needs it to, and at least journalCompactFloor. Called
// from the prune loop alone.
func (j *tableJournal) maybeCompact() {
	if j.file == nil {
		return
	}
	if j.noteState() != journalUp {
		j.rebuild()
		return
	}
	j.backoff = 0
	j.nextRebuild.Store(0)
	live := j.table.JournaledBytes()
	if size := j.file.Size(); size > journalCompactFloor && size > 2*live {
		j.file.Compact(j.table.Snapshot)
	}
}

// rebuild starts a compaction from the table when the backoff allows: the
// one cure for a down or dirty journal, as the new file holds all the table
// must not lose. An attempt that does not heal the journal doubles the wait
// before the next.
func (j *tableJournal) rebuild() {
	now := time.Now()
	if now.UnixNano() < j.nextRebuild.Load() {
		return
	}
	if !j.file.Compact(j.table.Snapshot) {
		return // one runs already
	}
	j.backoff = min(max(2*j.backoff, rebuildFirstBackoff), rebuildMaxBackoff)
	j.nextRebuild.Store(now.Add(j.backoff).UnixNano())
}

// noteState reads the journal's state and logs it when it changed: one
// line per change, whatever the fault repeats.
func (j *tableJournal) noteState() journalState {
	h := j.file.Health()
	s := journalUp
	switch {
	case h.Down != nil:
		s = journalDown
	case h.Dirty:
		s = journalDirty
	}
	if s == j.logged {
		return s
	}
	switch s {
	case journalDown:
		j.log.Error("journal down: ingress frames are refused (503) until it is rebuilt from the state table",
			"file", j.path, "reason", httpguard.ClipReason(h.Down.Error()))
	case journalDirty:
		j.log.Warn("journal missed records (a write failed): rebuilding it from the state table", "file", j.path)
	default:
		j.log.Warn("journal rebuilt from the state table: records are durable again", "file", j.path)
	}
	j.logged = s
	return s
}

// close writes what is pending and closes the journal, within the
// shutdown's deadline: a record not written by then is one no answer
// waited for (a broker frame's, which its broker replays).
func (j *tableJournal) close(deadline time.Time) {
	if j.file == nil {
		return
	}
	done := make(chan error, 1)
	go func() { done <- j.file.Close() }()
	select {
	case err := <-done:
		if err != nil {
			j.log.Warn("journal close failed", "reason", httpguard.ClipReason(err.Error()))
		}
	case <-time.After(time.Until(deadline)):
		j.log.Warn("shutdown: the journal's last write did not finish within the shutdown budget")
	}
}

// writeMetrics renders the journal's counters; at zero without one.
func (j *tableJournal) writeMetrics(t *promtext.Text) {
	var st statejournal.Stats
	var size int64
	up, pending := 1.0, 0.0
	if j.file != nil {
		st, size = j.file.Stats(), j.file.Size()
		h := j.file.Health()
		if h.Down != nil {
			up = 0
		}
		if h.NeedsRebuild() {
			pending = 1
		}
	}
	t.Single("nvpair_wlm_journal_bytes", "gauge", "Bytes of the journal file.", float64(size))
	t.Single("nvpair_wlm_journal_fsync_interval_seconds", "gauge", "--journal-fsync: 0 when every answer waits for its fsync, else the most time between an answer and its fsync.", j.fsync.Seconds())
	t.Single("nvpair_wlm_journal_records_total", "counter", "Records appended to the journal.", float64(st.Records))
	t.Single("nvpair_wlm_journal_syncs_total", "counter", "Group commits of the journal: one write and one fsync each.", float64(st.Groups))
	t.Single("nvpair_wlm_journal_write_failures_total", "counter", "Journal writes or fsyncs that failed; the frames waiting were answered 500.", float64(st.GroupFailures))
	t.Single("nvpair_wlm_journal_compactions_total", "counter", "Journal compactions and rebuilds completed.", float64(st.Compactions))
	t.Single("nvpair_wlm_journal_compaction_failures_total", "counter", "Journal compactions and rebuilds that failed; the old file was kept.", float64(st.CompactionFailures))
	t.Single("nvpair_wlm_journal_up", "gauge", "1 while the journal makes records durable; 0 while it is down and the ingress refuses frames (503) until it is rebuilt.", up)
	t.Single("nvpair_wlm_journal_rebuild_pending", "gauge", "1 while records the state table holds are missing from the journal (a write failed, or it is down) and a rebuild is due.", pending)
	t.Single("nvpair_wlm_journal_torn_bytes_total", "counter", "Bytes of a torn tail dropped when the journal was read.", float64(st.DroppedBytes))
	t.Single("nvpair_wlm_journal_damaged_regions_total", "counter", "Damaged regions that valid records followed, crossed when the journal was read; the damaged file is kept.", float64(st.DamagedRegions))
	t.Single("nvpair_wlm_journal_damaged_bytes_total", "counter", "Bytes of those damaged regions.", float64(st.DamagedBytes))
	t.Single("nvpair_wlm_journal_damaged_records_total", "counter", "Records lost in those damaged regions (at least one per region).", float64(st.DamagedRecords))
}
