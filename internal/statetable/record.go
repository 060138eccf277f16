package statetable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// The journal's records (spec 5.3). Each is one change of the table, in the
// order of the table's changes, so a restart that applies them in file
// order, the higher version winning, rebuilds what the table held:
//
//	'P' put:    version, kind, owner, flags, endedAt, lease seconds, lease
//	            deadline, the key's four strings, a removal's runs, the line
//	'F' forget: version, kind, the key's four strings
//	'A' ack:    member id, mark, departed (0: active)
//	'D' drop:   member id (its claim ran out, or it was dropped at the
//	            bound on members that left)
//	'M' marks:  one or more (member id, mark, departed), as 'A' each: the
//	            marks that moved since the last prune tick, written
//	            together (flushMarksLocked)
//
// Integers are varints; strings and the line are length-prefixed. Only
// what a restart cannot get back from its broker is written: a producer's
// runs (its ownership and lease), every end until every member has it, and
// the members' marks. A broker's live run is not: the broker replays its
// active jobs to a restarted daemon.

const (
	recPut        = 'P'
	recForget     = 'F'
	recAck        = 'A'
	recDropMember = 'D'
	recMarks      = 'M'
)

const (
	flagReplayDrop = 1
	flagUnheld     = 2
)

func shouldJournal(e *entry) bool { return e.owner == Producer || e.kind != kindLive }

// journalPut writes e's state when a restart needs it, or forgets an
// earlier record of it that no longer speaks for it. It returns the
// record's sequence, 0 for none, and keeps it as e's recSeq.
func (t *Table) journalPut(e *entry) uint64 {
	if !shouldJournal(e) {
		if e.journaled {
			t.journalForget(e)
		}
		return 0
	}
	// The record is built in the table's scratch, which the journal copies
	// from (Journal.Append), so a put allocates nothing of its own.
	rec := encodePut(t.rec[:0], e)
	if cap(rec) <= recScratchMax {
		t.rec = rec
	}
	t.setJournaled(e, len(rec))
	e.recSeq = t.appendRecord(rec)
	return e.recSeq
}

// recScratchMax is the largest record scratch the table keeps: a rare long
// record's buffer is left to the collector, not held for good.
const recScratchMax = 64 << 10

// setJournaled records that e's state is in the journal in size bytes
// (0: not at all), keeping the total a compaction would write.
func (t *Table) setJournaled(e *entry, size int) {
	t.journaledBytes += int64(size) - int64(e.journalSize)
	e.journalSize, e.journaled = int32(size), size > 0
}

func (t *Table) journalForget(e *entry) {
	t.setJournaled(e, 0)
	b := []byte{recForget}
	b = binary.AppendUvarint(b, e.version)
	b = append(b, byte(e.kind))
	b = appendKey(b, e.key)
	t.appendRecord(b)
}

func (t *Table) journalAck(m *Member) {
	t.appendRecord(appendMark([]byte{recAck}, m))
	if m.dirty {
		m.dirty = false // written: a flush skips it (it stays in t.dirty)
	}
}

// appendMark appends a member's id, mark and departure (0: active).
func appendMark(b []byte, m *Member) []byte {
	b = appendString(b, m.id)
	b = binary.AppendUvarint(b, m.mark)
	return binary.AppendVarint(b, unixMilli(m.departed))
}

// flushMarksLocked writes the marks that moved since the last flush, in
// as few 'M' records as their bytes allow: a member's acknowledgment
// writes nothing of its own, so a change costs the journal no record per
// member (spec 5.4). A mark written late only lags: it is what the member
// took, never more (Ack moves it only on a 200), and a restart sends the
// member again what lies above it.
func (t *Table) flushMarksLocked() {
	var b []byte
	for i, m := range t.dirty {
		t.dirty[i] = nil
		if !m.dirty || t.members[m.id] != m {
			continue // written already, or dropped: a mark would bring it back
		}
		m.dirty = false
		if b == nil {
			b = []byte{recMarks}
		}
		b = appendMark(b, m)
		t.stats.MarksWritten.Add(1)
		if len(b) >= marksRecordBytes {
			t.appendRecord(b)
			b = nil
		}
	}
	if b != nil {
		t.appendRecord(b)
	}
	t.dirty = t.dirty[:0]
}

// marksRecordBytes is where an 'M' record is cut: far below the journal's
// record bound, whatever the count of members.
const marksRecordBytes = 32 << 10

// NotJournaled is the sequence Commit returns for a change whose record the
// journal refused (closed, or over its record bound): a wait on it fails,
// so no answer counts on a record that is not there. It is never a real
// sequence: those count from 1, one per record.
const NotJournaled = ^uint64(0)

// appendRecord appends b to the journal and returns its sequence, 0 when
// there is no journal, or NotJournaled when the journal refused it.
func (t *Table) appendRecord(b []byte) uint64 {
	if t.cfg.Journal == nil {
		return 0
	}
	seq, err := t.cfg.Journal.Append(b)
	if err != nil {
		t.stats.JournalFailed.Add(1)
		return NotJournaled
	}
	return seq
}

func encodePut(b []byte, e *entry) []byte {
	b = append(b, recPut)
	b = binary.AppendUvarint(b, e.version)
	flags := byte(0)
	if e.replayDrop {
		flags |= flagReplayDrop
	}
	if e.unheld {
		flags |= flagUnheld
	}
	b = append(b, byte(e.kind), byte(e.owner), flags)
	b = binary.AppendVarint(b, unixMilli(e.endedAt))
	var seconds uint64
	var deadline int64
	if e.lease != nil {
		seconds, deadline = uint64(e.lease.seconds), unixMilli(e.lease.deadline)
	}
	b = binary.AppendUvarint(b, seconds)
	b = binary.AppendVarint(b, deadline)
	b = appendKey(b, e.key)
	b = binary.AppendUvarint(b, uint64(len(e.runs)))
	for _, r := range e.runs {
		b = appendString(b, r.engine)
		b = appendString(b, r.runID)
	}
	b = binary.AppendUvarint(b, uint64(len(e.line)))
	return append(b, e.line...) // as appendString, without a string of the line
}

func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func appendKey(b []byte, k wireframe.WorkloadKey) []byte {
	for _, s := range []string{k.Origin, k.Engine, k.RunID, k.ID} {
		b = appendString(b, s)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// reader decodes a record, each length checked against what is left and
// against maxLen before anything is allocated.
type reader struct {
	b     []byte
	whole []byte // the record, for its size
	err   error
}

var errRecord = errors.New("malformed record")

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errRecord
		return 0
	}
	r.b = r.b[n:]
	return v
}

// version reads a version or a mark: one above MaxVersion is refused.
func (r *reader) version() uint64 {
	v := r.uvarint()
	if v > MaxVersion {
		r.err = errRecord
		return 0
	}
	return v
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errRecord
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.err = errRecord
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) string(maxLen int) string {
	n := r.uvarint()
	if r.err != nil || n > uint64(maxLen) || n > uint64(len(r.b)) {
		r.err = errRecord
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// bytes is string without the copy: the slice of the record.
func (r *reader) bytes(maxLen int) []byte {
	n := r.uvarint()
	if r.err != nil || n > uint64(maxLen) || n > uint64(len(r.b)) {
		r.err = errRecord
		return nil
	}
	b := r.b[:n:n]
	r.b = r.b[n:]
	return b
}

func (r *reader) key() wireframe.WorkloadKey {
	var k wireframe.WorkloadKey
	for _, f := range []*string{&k.Origin, &k.Engine, &k.RunID, &k.ID} {
		*f = r.string(wireframe.MaxKeyFieldBytes)
	}
	return k
}

// RestoreStats says what a restore found.
type RestoreStats struct {
	Records, Runs, Ends, Members int
	// Refused counts records that broke a bound the live paths enforce
	// (a line, a lease, a key) or did not parse as what they claim.
	Refused int
	// OverLimit counts runs dropped because the table held MaxLive.
	OverLimit int
}

// restored is one entry as the records left it.
type restored struct {
	e      *entry
	forgot bool
}

// Restorer rebuilds a table from its journal's records, one record at a
// time (statejournal.Open's function): it holds the record that wins each
// key, never the file, and parses a put's line only for the record that
// finally wins its key, in Finish. A table is restored once, before
// anything else touches it.
type Restorer struct {
	t     *Table
	grace time.Duration
	runs  map[wireframe.WorkloadKey]*restored
	rems  map[wireframe.WorkloadRef]*restored
	marks map[string]*Member
	top   uint64
	st    RestoreStats
}

// BeginRestore starts a restore of t; restartGrace is the least time a
// restored lease is given.
func (t *Table) BeginRestore(restartGrace time.Duration) *Restorer {
	return &Restorer{t: t, grace: restartGrace,
		runs: map[wireframe.WorkloadKey]*restored{}, rems: map[wireframe.WorkloadRef]*restored{}, marks: map[string]*Member{}}
}

// Restore rebuilds the table from the journal's records, in file order,
// before anything else touches it: BeginRestore, Add each, Finish.
func (t *Table) Restore(records [][]byte, restartGrace time.Duration) RestoreStats {
	r := t.BeginRestore(restartGrace)
	for _, rec := range records {
		r.Add(rec)
	}
	return r.Finish()
}

// Add takes the next record, in file order; rec is read only during the
// call. A record is decoded with the bounds the live paths enforce (a
// lease within the ingress's range, a string within its field's bound); a
// record that fails is counted as refused and skipped. It never fails:
// its error is for statejournal.Open's signature.
func (r *Restorer) Add(rec []byte) error {
	r.st.Records++
	if len(rec) == 0 {
		r.st.Refused++
		return nil
	}
	rd := &reader{b: rec[1:], whole: rec}
	switch rec[0] {
	case recPut:
		r.put(rd)
	case recForget:
		v := rd.version()
		kd := kind(rd.byte())
		k := rd.key()
		if rd.err != nil {
			r.st.Refused++
			return nil
		}
		r.top = max(r.top, v)
		slot := slotOf(r.runs, r.rems, &entry{key: k, kind: kd})
		if slot.e != nil && slot.e.version <= v {
			slot.forgot = true
		}
	case recAck:
		r.mark(rd)
		if rd.err != nil || len(rd.b) != 0 {
			r.st.Refused++
		}
	case recMarks:
		for rd.err == nil && len(rd.b) > 0 {
			r.mark(rd)
		}
		if rd.err != nil {
			r.st.Refused++
		}
	case recDropMember:
		id := rd.string(wireframe.MaxKeyFieldBytes)
		if rd.err != nil || len(rd.b) != 0 {
			r.st.Refused++
			return nil
		}
		delete(r.marks, id)
	default:
		r.st.Refused++
	}
	return nil
}

// mark takes one member's mark; none when it does not decode.
func (r *Restorer) mark(rd *reader) {
	id := rd.string(wireframe.MaxKeyFieldBytes)
	mark := rd.version()
	departed := rd.varint()
	if rd.err != nil {
		return
	}
	r.top = max(r.top, mark)
	m := &Member{id: id, mark: mark, wake: make(chan struct{}, 1), restored: true, lowAt: -1}
	if departed != 0 {
		m.departed = time.UnixMilli(departed)
	}
	r.marks[id] = m
}

// put takes a put record: decoded and checked but for its line, which
// stays unparsed until Finish. A put that wins its key keeps a copy of
// its line (the one copy the table then holds), in the buffer of the
// record it displaces when that fits, so a journal that holds a run many
// times leaves no garbage per record; one that does not win keeps nothing.
func (r *Restorer) put(rd *reader) {
	e, err := r.t.decodePut(rd)
	if err != nil {
		r.st.Refused++
		return
	}
	r.top = max(r.top, e.version)
	slot := slotOf(r.runs, r.rems, e)
	if slot.e == nil || slot.forgot || e.version > slot.e.version {
		var buf []byte
		if old := slot.e; old != nil && cap(old.line) >= len(e.line) && cap(old.line) <= 2*len(e.line) {
			buf = old.line[:0]
		}
		e.line = append(buf, e.line...)
		*slot = restored{e: e}
	}
}

// Finish parses the line of each record that won its key, links the
// entries into the table in version order, within its bounds, and places
// the members' cursors. A winner whose line is not the frame it claims
// is refused, and its key is not restored: an older record of it is not
// kept to fall back on (each record is under a checksum, so such a line
// is a writer's bug or a crafted file, not damage).
func (r *Restorer) Finish() RestoreStats {
	t := r.t
	r.st.Refused += checkWinners(r.runs) + checkWinners(r.rems)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rebuild(r.runs, r.rems, r.marks, r.grace, &r.st)
	t.version.Store(max(t.version.Load(), r.top))
	return r.st
}

// checkWinners parses the line of each entry of m that a restore would
// link, drops those that fail, and returns how many it dropped.
func checkWinners[K comparable](m map[K]*restored) int {
	n := 0
	for k, slot := range m {
		if slot.e != nil && !slot.forgot && checkLine(slot.e) != nil {
			delete(m, k)
			n++
		}
	}
	return n
}

func slotOf(runs map[wireframe.WorkloadKey]*restored, rems map[wireframe.WorkloadRef]*restored, e *entry) *restored {
	if e.kind == kindRemoved {
		ref := e.key.Ref()
		if rems[ref] == nil {
			rems[ref] = &restored{}
		}
		return rems[ref]
	}
	if runs[e.key] == nil {
		runs[e.key] = &restored{}
	}
	return runs[e.key]
}

// decodePut decodes a put and checks it as the live paths would.
func (t *Table) decodePut(r *reader) (*entry, error) {
	e := &entry{}
	e.version = r.version()
	e.kind = kind(r.byte())
	e.owner = Owner(r.byte())
	flags := r.byte()
	ended := r.varint()
	leaseSeconds := r.uvarint()
	leaseDeadline := r.varint()
	e.key = r.key()
	n := r.uvarint()
	if r.err != nil || n > MaxRemovalRuns || e.kind > kindRemoved || e.owner > Producer || e.version == 0 {
		return nil, errRecord
	}
	for range n {
		e.runs = append(e.runs, runKey{r.string(wireframe.MaxKeyFieldBytes), r.string(wireframe.MaxKeyFieldBytes)})
	}
	line := r.bytes(MaxLineBytes)
	if r.err != nil || len(r.b) != 0 {
		return nil, errRecord
	}
	e.line = line // the record's bytes: Restorer.put copies it if it wins
	e.journaled, e.journalSize = true, int32(len(r.whole))
	e.replayDrop = flags&flagReplayDrop != 0
	e.unheld = flags&flagUnheld != 0 && e.kind == kindRemoved
	if ended != 0 {
		e.endedAt = time.UnixMilli(ended)
	}
	if leaseSeconds != 0 {
		if leaseSeconds < MinLeaseSeconds || leaseSeconds > MaxLeaseSeconds || e.kind != kindLive || e.owner != Producer {
			return nil, fmt.Errorf("lease of %d s: %w", leaseSeconds, errRecord)
		}
		e.lease = &leaseState{seconds: int(leaseSeconds), deadline: time.UnixMilli(leaseDeadline), idx: -1}
	}
	return e, nil
}

// The bounds of an entry's record, one set for the writer and the reader
// (issue 36): Commit keeps every entry within them at the door, encodePut
// writes what Commit kept, and decodePut refuses only what passes them, so
// every record the table writes, a restart restores.
const (
	// MaxRemovalRuns bounds the runs a removal's tombstone keeps. A
	// workload has one run nearly always; a removal of more keeps none,
	// and a tombstone without runs drops the broker's replay of any run of
	// the id for its retention (commitLifecycle), so no removed run comes
	// back and the record stays small: a removal of thousands of runs with
	// long fields would otherwise be a record of megabytes.
	MaxRemovalRuns = 64
	// MaxLineBytes bounds an entry's line. A frame's params are at most
	// wireframe.MaxWorkloadMaxBytes (the top of --workload-max-bytes) on
	// every path, and the table's line adds to them the notification's
	// envelope (57 bytes with the longest method), the resync marker (14)
	// and the origin the ingress stamps (276 with its name); lineSlack
	// holds those with room. Only a re-encoding can pass it (WithoutResync
	// escapes HTML characters, up to six bytes for one): such a line is
	// not kept (LineTooLong).
	MaxLineBytes = wireframe.MaxWorkloadMaxBytes + lineSlack
	lineSlack    = 1 << 10
	// MaxRecordBytes is the longest record the table writes: a put with
	// every integer at its widest, four key fields and MaxRemovalRuns runs
	// of two fields each, every field at wireframe.MaxKeyFieldBytes, and a
	// line of MaxLineBytes (1,084,776 bytes). The journal's record bound
	// must be at least this: statejournal.DefaultMaxRecordBytes (2 MiB)
	// is, which TestTheLargestEntryIsOneRecordAndRestoresExactly holds.
	MaxRecordBytes = putFixedBytes + (4+2*MaxRemovalRuns)*(binary.MaxVarintLen64+wireframe.MaxKeyFieldBytes) + binary.MaxVarintLen64 + MaxLineBytes
	// putFixedBytes is a put's type, kind, owner and flags, and its five
	// integers (version, ended, lease seconds and deadline, runs) at their
	// widest.
	putFixedBytes = 4 + 5*binary.MaxVarintLen64
)

// MaxVersion is the highest version, or mark, a restore takes: a record
// above it is refused, so the counter restarts at most here and a crafted
// (CRC-valid) journal cannot bring it near 2^64, where the next version
// would wrap to 0 (which a restore refuses: the next 200 would be lost to
// a crash). Live traffic never reaches it: at a billion changes a second
// 2^62 versions take 146 years. And from it, the counter needs 3 x 2^62
// more changes, 438 years at that rate, to wrap: bump needs no check.
const MaxVersion = 1 << 62

// The lengths a lease may have, in seconds (spec 3.5.1): the ingress's
// range, which a restore enforces too.
const (
	MinLeaseSeconds = 5
	MaxLeaseSeconds = 86400
)

// checkLine parses a restored entry's line as the frame its kind says it
// is, and checks it names the entry's key and fills what Commit reads. It
// reads the line in wireframe's one pass (Scan), which holds a frame to
// encoding/json's grammar and member matching without copying it.
func checkLine(e *entry) error {
	var s wireframe.Scan
	if err := s.ScanFrame(e.line); err != nil {
		return errRecord
	}
	env, err := wireframe.EnvelopeOf(&s)
	if err != nil || env.JSONRPC != "2.0" {
		return errRecord
	}
	if e.kind == kindRemoved {
		rm, err := s.Removal()
		if err != nil || env.Method != wireframe.MethodRemove || rm.Ref != e.key.Ref() || e.key.Engine != "" || e.key.RunID != "" {
			return errRecord
		}
		return nil
	}
	if !wireframe.IsLifecycleMethod(env.Method) {
		return errRecord
	}
	ev, err := s.Lifecycle(env.Method)
	if err != nil || ev.Key() != e.key || ev.Terminal() != (e.kind == kindTerminal) || !ev.Resync {
		return errRecord
	}
	e.rank, e.seq, e.hasSeq = rankOf(ev.Info.State), ev.Info.Seq, ev.Info.HasSeq
	// The requester is copied: the parse's strings are one allocation the
	// held run would otherwise keep whole (ownKey).
	e.requester, e.hasRequester = strings.Clone(ev.Info.Requester), ev.Info.HasRequester
	return nil
}

// rebuild links the restored entries in version order, within the
// table's bounds, and places the members' cursors.
func (t *Table) rebuild(runs map[wireframe.WorkloadKey]*restored, rems map[wireframe.WorkloadRef]*restored, marks map[string]*Member, grace time.Duration, st *RestoreStats) {
	now := t.cfg.Now()
	var all []*entry
	for _, r := range runs {
		if r.e != nil && !r.forgot {
			all = append(all, r.e)
		}
	}
	for _, r := range rems {
		if r.e != nil && !r.forgot {
			all = append(all, r.e)
		}
	}
	slices.SortFunc(all, func(a, b *entry) int { return cmpU64(a.version, b.version) })
	for _, e := range all {
		t.restoreEntry(e, now, grace, st)
	}
	gone := make([]*Member, 0, len(marks))
	for id, m := range marks {
		if old := t.members[id]; old != nil {
			t.removeLow(old)
		}
		t.members[id] = m
		t.addLow(m)
		if m.departed.IsZero() || m.departed.After(now) {
			m.departed = now // a restart does not know who is still there: discovery says
		}
		gone = append(gone, m)
	}
	slices.SortFunc(gone, func(a, b *Member) int { return a.departed.Compare(b.departed) })
	for _, m := range gone {
		t.linkGone(m)
	}
	t.boundGoneLocked()
	t.placeCursors()
	st.Members = len(t.members)
	t.evictLocked()
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// restoreEntry links one restored entry, as Commit would have left it.
func (t *Table) restoreEntry(e *entry, now time.Time, grace time.Duration, st *RestoreStats) {
	if e.kind == kindRemoved {
		t.removals[e.key.Ref()] = e
		st.Ends++
	} else {
		if e.kind == kindLive && t.inPass >= t.cfg.MaxLive {
			st.OverLimit++
			return
		}
		e.key = t.ownKey(e.key) // a record's strings come one allocation each
		t.byKey[e.key] = e
		ref := e.key.Ref()
		e.sibling = t.byRef[ref]
		t.byRef[ref] = e
		if e.kind == kindLive || now.Sub(e.endedAt) < t.cfg.Retention {
			t.linkPass(e)
			t.passSize += int64(len(e.line))
		} else {
			e.retired = true
		}
		if e.kind == kindLive {
			st.Runs++
		} else {
			st.Ends++
		}
	}
	t.journaledBytes += int64(e.journalSize)
	if e.kind != kindLive {
		*t.endBytes(e) += e.size()
		if e.endedAt.After(now) || e.endedAt.IsZero() {
			e.endedAt = now // a clock stepped back since the write, or an edited file
		}
		if now.Sub(e.endedAt) >= t.cfg.Retention {
			e.retired = true
		}
	}
	if e.lease != nil {
		// A lease's deadline is at most its length from now (a clock
		// stepped back, an edited file), and at least the grace: the
		// producer's renewals failed while the daemon was down.
		d := e.lease.deadline
		if latest := now.Add(time.Duration(e.lease.seconds) * t.cfg.LeaseUnit); d.After(latest) {
			d = latest
		}
		if earliest := now.Add(grace); d.Before(earliest) {
			d = earliest
		}
		e.lease.deadline = d
		heapPush(t, e)
	}
	// A restored entry's age is not known: it counts from the start.
	e.changedAt = now.UnixNano()
	t.linkVersion(e)
	if e.kind != kindLive {
		t.ends.push(e)
	}
	if e.unheld {
		t.unheldEnds.push(e)
	}
}

// placeCursors puts each member's cursor after the last entry at or
// below its mark: one walk of version order, at start.
func (t *Table) placeCursors() {
	ms := make([]*Member, 0, len(t.members))
	for _, m := range t.members {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b *Member) int { return cmpU64(a.mark, b.mark) })
	var after *entry
	e := t.versions.head
	for _, m := range ms {
		for e != nil && e.version <= m.mark {
			after, e = e, e.v.next
		}
		m.cur.set(after)
	}
}

// Snapshot emits the records of what the journal must hold, for its
// compaction: a slice of version order at a time under the lock, emitted
// with it released, then the members' marks.
func (t *Table) Snapshot(emit func([]byte) error) error {
	w := &vcursor{}
	defer func() {
		t.mu.Lock()
		w.release()
		t.mu.Unlock()
	}()
	for {
		var recs [][]byte
		t.mu.Lock()
		e := t.cursorNext(w)
		for n := 0; e != nil && n < reapBudget; n, e = n+1, e.v.next {
			if e.journaled {
				recs = append(recs, encodePut(nil, e))
			}
			w.set(e)
		}
		if e == nil {
			for _, m := range t.members {
				recs = append(recs, appendMark([]byte{recAck}, m))
			}
		}
		t.mu.Unlock()
		for _, r := range recs {
			if err := emit(r); err != nil {
				return err
			}
		}
		if e == nil {
			return nil
		}
	}
}

// JournaledBytes is about what a compacted journal would hold: the
// journaled entries' lines and keys. The Manager compacts when the file
// outgrows twice it.
func (t *Table) JournaledBytes() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.journaledBytes + int64(len(t.members))*ackRecordBytes
}

// ackRecordBytes is about what a member's mark costs in the journal.
const ackRecordBytes = 96
