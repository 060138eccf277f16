package main

import (
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// Bounds of the log of recent ends (spec 5.2). They are constants, not
// flags: the window follows from PAIR's staleness budget, not from a
// node's load, and the entry and byte bounds only cap what a burst of ends
// can hold, which an operator has no better number for.
const (
	// endedLogWindow is how long an end is kept: past PAIR's 5-minute
	// staleness budget, so that a peer away for longer has failed the
	// workloads it did not hear from by inference anyway, and an end it
	// missed can no longer be the only word it gets.
	endedLogWindow = 10 * time.Minute
	// endedLogMaxEntries and endedLogMaxBytes bound the log whatever the
	// rate of ends: the oldest goes first.
	endedLogMaxEntries = 4096
	endedLogMaxBytes   = 4 << 20
	// endedRecordOverhead is what a record costs beside its line and its
	// key's strings, counted in its bytes: the record in the slice (about
	// 120 bytes) and the strings' headers.
	endedRecordOverhead = 128
	// endedPruneBudget is the most records one expire drops, as the re-sync
	// set's pruneBudget: no lock hold is O(size).
	endedPruneBudget = 256
	// endedScanBudget is the most records one take looks at, sent or
	// skipped, so a log whose records are nearly all skipped still costs a
	// bounded slice of work per lock hold.
	endedScanBudget = 256
)

// endedRecord is one end of a local-origin workload: a terminal run the
// re-sync set dropped, or a removal this node relayed.
type endedRecord struct {
	at      time.Time
	key     wireframe.WorkloadKey // a removal's has its origin and id only
	removal bool
	// line is what a peer is sent: a terminal run's re-assertion line, or
	// the removal's notification as it was relayed. Never modified, so a
	// sender may hold it without a lock.
	line  []byte
	bytes int64
}

// endedLog is the bounded log of recent ends (spec 5.2): a peer that was
// away when a workload ended, for longer than the re-sync set keeps the
// end, is sent it after its backfill. It is guarded by Manager.activeMu;
// next is also read without it. Records are numbered in the order they
// were added: the one at recs[head+i] is number first+i. Every operation
// is O(1) amortized, and none looks at more than a budget of records.
type endedLog struct {
	window     time.Duration
	maxEntries int
	maxBytes   int64

	recs  []endedRecord
	head  int
	first uint64 // the number of recs[head]
	bytes int64
	// next is the number the next record gets: written under activeMu,
	// read without it when a sender snapshots the log's end.
	next atomic.Uint64
	// evicted counts the records dropped before their window for the
	// entry or the byte bound.
	evicted uint64
	// lastRemoval is the number of the latest removal the log holds of
	// each workload: a terminal run of a workload removed after it must
	// not reach a peer, even when that removal is not sent from the log
	// (it went to the peer as a fresh frame), or the peer would write the
	// run again after its removal (spec 5, "never re-asserted after its
	// removal").
	lastRemoval map[wireframe.WorkloadRef]uint64
}

func newEndedLog(window time.Duration, maxEntries int, maxBytes int64) *endedLog {
	return &endedLog{window: window, maxEntries: maxEntries, maxBytes: maxBytes, lastRemoval: map[wireframe.WorkloadRef]uint64{}}
}

// add appends an end at now, dropping the oldest records while the log is
// over a bound. A nil log keeps nothing.
func (l *endedLog) add(key wireframe.WorkloadKey, removal bool, line []byte, now time.Time) {
	if l == nil {
		return
	}
	l.expire(now)
	size := int64(len(line)+len(key.Engine)+len(key.RunID)+len(key.ID)) + endedRecordOverhead
	l.recs = append(l.recs, endedRecord{at: now, key: key, removal: removal, line: line, bytes: size})
	l.bytes += size
	n := l.first + uint64(len(l.recs)-l.head)
	l.next.Store(n)
	if removal {
		l.lastRemoval[key.Ref()] = n - 1
	}
	// The newest record always stays, even one larger than the byte bound
	// on its own (a line is at most --workload-max-bytes plus its envelope).
	for l.len() > 1 && (l.len() > l.maxEntries || l.bytes > l.maxBytes) {
		l.popFront()
		l.evicted++
	}
}

// expire drops up to endedPruneBudget records older than the window.
func (l *endedLog) expire(now time.Time) {
	for n := 0; n < endedPruneBudget && l.len() > 0 && now.Sub(l.recs[l.head].at) >= l.window; n++ {
		l.popFront()
	}
}

func (l *endedLog) popFront() {
	if rec := &l.recs[l.head]; rec.removal && l.lastRemoval[rec.key.Ref()] == l.first {
		delete(l.lastRemoval, rec.key.Ref())
	}
	l.bytes -= l.recs[l.head].bytes
	l.recs[l.head] = endedRecord{}
	l.head++
	l.first++
	// Reclaim the popped front once it is most of the slice: amortized O(1).
	if l.head > 64 && l.head*2 > len(l.recs) {
		l.recs = append(l.recs[:0], l.recs[l.head:]...)
		l.head = 0
	}
}

func (l *endedLog) len() int { return len(l.recs) - l.head }

// removedAfter reports whether the log holds a removal of rec's workload
// numbered after n.
func (l *endedLog) removedAfter(n uint64, rec *endedRecord) bool {
	last, ok := l.lastRemoval[rec.key.Ref()]
	return ok && last > n
}

// end is the number the next record will get: records numbered below it
// are the log as it is now. It needs no lock.
func (l *endedLog) end() uint64 { return l.next.Load() }

// take returns the lines of the records numbered from from (or the oldest
// still held, when it is gone) up to end, at most maxFrames lines and
// maxBytes in all (but at least one line), leaving out the records skip
// names; it returns the number to go on from and whether it reached end.
// It looks at no more than endedScanBudget records.
func (l *endedLog) take(from, end uint64, maxFrames, maxBytes int, skip func(n uint64, rec *endedRecord) bool) (r reassertions, next uint64, done bool) {
	next = max(from, l.first)
	bytes := 0
	for n := 0; next < end && len(r.lines) < maxFrames && n < endedScanBudget; n++ {
		rec := &l.recs[l.head+int(next-l.first)]
		if skip(next, rec) {
			next++
			continue
		}
		if len(r.lines) > 0 && bytes+len(rec.line) > maxBytes {
			break
		}
		r.lines = append(r.lines, rec.line)
		r.refs = append(r.refs, rec.key.Ref())
		bytes += len(rec.line)
		next++
	}
	return r, next, next >= end
}

// logEnded is the re-sync set's hook for a terminal run it drops at the end
// of its retention: the run's end goes on into the log. Called with
// activeMu held.
func (m *Manager) logEnded(e *resyncEntry, now time.Time) {
	m.ended.add(e.key, false, e.line, now)
}

// endedSeq is the end of the log of recent ends as it is now; it needs no
// lock (heartbeatSource).
func (m *Manager) endedSeq() uint64 { return m.ended.end() }

// takeEnded returns the next slice of the log of recent ends for a new
// target (heartbeatSource), in one bounded hold of activeMu. A removal of a
// workload the re-sync set holds a run of again is left out (its id was
// reused: the removal would retire the new run at the peer), and so is a
// removal numbered from added on, relayed after the target was added and
// so queued to it as a fresh frame, a terminal run the set holds (the
// pass re-asserted it already), and a terminal run of a workload the log
// holds a later removal of.
func (m *Manager) takeEnded(from, end, added uint64, maxFrames, maxBytes int) (reassertions, uint64, bool) {
	m.activeMu.Lock()
	defer m.activeMu.Unlock()
	m.ended.expire(m.now())
	return m.ended.take(from, end, maxFrames, maxBytes, func(n uint64, rec *endedRecord) bool {
		if rec.removal {
			return n >= added || m.resync.byRef[rec.key.Ref()] != nil
		}
		return m.resync.entries[rec.key] != nil || m.ended.removedAfter(n, rec)
	})
}
