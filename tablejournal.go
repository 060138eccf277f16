package main

import (
	"errors"
	"log/slog"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/statejournal"
	"nvpair-workload-manager/internal/statetable"
)

// The journal (spec 5.3) is the state table's memory across a restart:
// every change the table must not lose is a record, appended in the same
// hold as the change; an ingress frame's 200 waits until its record is
// durable, one write and one fsync for every frame waiting (group
// commit). It is read once at start, before any listener serves and
// before the broker's replay, and compacted in the background from the
// table when it outgrows twice what it must hold.

// journalFile is what the Manager uses of its journal
// (*statejournal.Journal): a test stands in for it to hold a write.
type journalFile interface {
	statetable.Journal
	Wait(seq uint64) error
	Compact(snapshot func(emit func([]byte) error) error) bool
	Size() int64
	Close() error
	Stats() statejournal.Stats
}

// tableJournal keeps the state table's journal: it opens it and rebuilds
// the table from it at start, compacts it from the table, waits on its
// records for the ingress, and closes it within the shutdown's budget.
// Its file is set once, before the first change (use), and never again,
// so it is read without a lock.
type tableJournal struct {
	path  string // "" keeps no journal
	log   *slog.Logger
	table *statetable.Table
	file  journalFile // nil without a path or when it could not be opened
}

// use makes f the journal and the table's, before the first change.
func (j *tableJournal) use(f journalFile) {
	j.file = f
	j.table.SetJournal(f)
}

// wait returns once the record of sequence seq is durable; at once for
// seq 0 (no record) or without a journal.
func (j *tableJournal) wait(seq uint64) error {
	if seq == 0 || j.file == nil {
		return nil
	}
	return j.file.Wait(seq)
}

// journalFileName is the journal's name in the app dir, beside
// node-id.json. The journal of earlier versions (a JSON file rewritten
// whole, workload-manager-journal.json) is neither read nor removed.
const journalFileName = "workload-manager.journal"

// minMaxEndedBytes is the least --max-ended-bytes: room for the ends of a
// few hundred typical workloads, so a burst is not all evicted at once.
const minMaxEndedBytes = 64 << 10

// journalCompactFloor is the least size a journal is compacted at: below
// it a rewrite costs more than the bytes it saves.
const journalCompactFloor = 4 << 20

// open opens the journal and rebuilds the table from it. A journal
// that cannot be opened is one WARN line and a start without one: it
// never keeps the daemon from starting (a node that cannot write its app
// dir still relays; its ingress answers are then not durable, which the
// metrics and the line say).
//
// leaseGrace is the least time a restored lease is given
// (restartLeaseGrace lease units).
func (j *tableJournal) open(leaseGrace time.Duration) {
	if j.path == "" {
		return
	}
	// The records stream from the file into the restore, one at a time;
	// the table is rebuilt from them only once the read is whole (spec 5.3).
	restore := j.table.BeginRestore(leaseGrace)
	f, err := statejournal.Open(j.path, statejournal.Options{Logger: j.log}, restore.Add)
	if err != nil && !errors.Is(err, statejournal.ErrUnwritable) {
		j.log.Warn("journal unusable: starting without it; ingress answers are not durable", "file", j.path, "reason", httpguard.ClipReason(err.Error()))
		return
	}
	st := restore.Finish()
	if err != nil {
		j.log.Warn("journal unusable after its records were restored: starting without it; ingress answers are not durable", "file", j.path, "reason", httpguard.ClipReason(err.Error()))
		return
	}
	j.use(f)
	if st.Records > 0 {
		j.log.Info("journal read", "file", j.path, "records", st.Records, "runs", st.Runs, "ends", st.Ends, "members", st.Members, "refused", st.Refused, "overLimit", st.OverLimit)
	}
}

// maybeCompact starts a compaction when the journal holds more than twice
// what the table needs it to, and at least journalCompactFloor.
func (j *tableJournal) maybeCompact() {
	if j.file == nil {
		return
	}
	live := j.table.JournaledBytes()
	if size := j.file.Size(); size > journalCompactFloor && size > 2*live {
		j.file.Compact(j.table.Snapshot)
	}
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
	if j.file != nil {
		st, size = j.file.Stats(), j.file.Size()
	}
	t.Single("nvpair_wlm_journal_bytes", "gauge", "Bytes of the journal file.", float64(size))
	t.Single("nvpair_wlm_journal_records_total", "counter", "Records appended to the journal.", float64(st.Records))
	t.Single("nvpair_wlm_journal_syncs_total", "counter", "Group commits of the journal: one write and one fsync each.", float64(st.Groups))
	t.Single("nvpair_wlm_journal_write_failures_total", "counter", "Journal writes or fsyncs that failed; the frames waiting were answered 500.", float64(st.GroupFailures))
	t.Single("nvpair_wlm_journal_compactions_total", "counter", "Journal compactions completed.", float64(st.Compactions))
	t.Single("nvpair_wlm_journal_torn_bytes_total", "counter", "Bytes of a torn tail dropped when the journal was read.", float64(st.DroppedBytes))
	t.Single("nvpair_wlm_journal_damaged_regions_total", "counter", "Damaged regions that valid records followed, crossed when the journal was read; the damaged file is kept.", float64(st.DamagedRegions))
	t.Single("nvpair_wlm_journal_damaged_bytes_total", "counter", "Bytes of those damaged regions.", float64(st.DamagedBytes))
	t.Single("nvpair_wlm_journal_damaged_records_total", "counter", "Records lost in those damaged regions (at least one per region).", float64(st.DamagedRecords))
}
