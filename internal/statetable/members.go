package statetable

import "time"

// Member is one node this node asserts to: a peer it sends to, or one that
// left discovery within its claim. Its mark is the highest version it
// answered 200 for, the entries in version order up to it all taken.
// Guarded by Table.mu, but for wake.
type Member struct {
	id       string
	cur      vcursor
	mark     uint64
	active   bool
	departed time.Time
	wake     chan struct{} // poked on a change while it waits; one pending is enough
	// waiting says the member found nothing above its mark and waits for
	// a change (it is in Table.waiting): a commit pokes only those, so a
	// member that is behind (away, or backing off) costs a commit nothing.
	waiting bool
	// dirty says its mark moved since it was last written (Table.dirty):
	// marks are written together, once per prune tick (flushMarksLocked).
	dirty bool
	// gone links the members that left, oldest departure first.
	gone   struct{ prev, next *Member }
	inGone bool
	// lowAt is its place in the heap of marks (lowmark.go), -1 out of it.
	lowAt int
	// restored says the member came from the journal: its mark there may
	// lag what it took before a kill (marks are written once per tick), so
	// even at 0 its dedup may hold what it is sent (Restate).
	restored bool
}

// Wake is poked when the table changes while the member waits for it, and
// when it is owed more (it joined, or an end it lacked was evicted).
func (m *Member) Wake() <-chan struct{} { return m.wake }

// ID is the member's node id.
func (m *Member) ID() string { return m.id }

// resetLocked sends the member the whole table from the start: an end it
// had not acknowledged was evicted.
func (t *Table) resetLocked(m *Member) {
	m.cur.set(nil)
	t.setMark(m, 0)
	t.markDirty(m)
	poke(m.wake)
}

func (t *Table) memberLocked(id string) *Member {
	m := t.members[id]
	if m == nil {
		m = &Member{id: id, wake: make(chan struct{}, 1), lowAt: -1}
		t.members[id] = m
		t.addLow(m)
	}
	return m
}

// Join makes id an active member and returns it: a node that is new to
// the table is sent the whole of it (its backfill); one that comes back is
// sent what changed since its mark.
func (t *Table) Join(id string) *Member {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, known := t.members[id]
	m := t.memberLocked(id)
	t.unlinkGone(m)
	m.active, m.departed = true, time.Time{}
	if !known {
		// Written at once, so a restart before the member takes anything
		// still knows it is owed every end.
		t.journalAck(m)
	}
	poke(m.wake)
	return m
}

// Leave records that m left discovery: it keeps its claim on the ends it
// has not acknowledged for MemberClaim, within the bound on members that
// left (MaxGoneMembers, MaxGoneBytes).
func (t *Table) Leave(m *Member) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.members[m.id] != m {
		return
	}
	m.active, m.departed = false, t.cfg.Now()
	t.journalAck(m)
	t.linkGone(m)
	t.boundGoneLocked()
}

func (t *Table) dropMemberLocked(m *Member) {
	delete(t.members, m.id)
	t.removeLow(m)
	m.cur.release()
	t.unlinkGone(m)
	b := []byte{recDropMember}
	t.appendRecord(appendString(b, m.id))
}

// ForgetGone drops the members that left whose id same reports true, as
// if their claim had run out, and returns how many: a node that comes back
// under a new id (its hostUuid changed at a discovery flap) is sent the
// whole table as a new member, and the member it left behind would only
// hold ends for days. O(members that left), at a join.
func (t *Table) ForgetGone(same func(id string) bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for m := t.goneHead; m != nil; {
		next := m.gone.next
		if same(m.id) {
			t.dropMemberLocked(m)
			t.stats.GoneReplaced.Add(1)
			n++
		}
		m = next
	}
	return n
}

// Restate returns m's mark and whether m is to be re-asserted the table
// (spec 5.1): it took entries (a mark), or it came from the journal, whose
// mark may lag what it took before this node was killed, so its dedup may
// hold what it is sent even at a mark of 0.
func (t *Table) Restate(m *Member) (mark uint64, restate bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return m.mark, m.mark > 0 || m.restored
}

// MemberMark returns a member's mark and whether the table knows it.
func (t *Table) MemberMark(id string) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.members[id]
	if m == nil {
		return 0, false
	}
	return m.mark, true
}

// Taken is a slice of entries above a member's mark.
type Taken struct {
	Lines    []Line
	Versions []uint64
}

// TakeAbove returns the entries above m's mark in version order, each at
// its latest state, at most maxFrames and maxBytes of fresh lines (but at
// least one). It does not move the mark: Ack does, once the peer took
// them.
func (t *Table) TakeAbove(m *Member, maxFrames, maxBytes int) Taken {
	t.mu.Lock()
	defer t.mu.Unlock()
	var r Taken
	e := t.cursorNext(&m.cur)
	if e == nil {
		t.waitLocked(m)
		return r
	}
	size := 0
	for ; e != nil && len(r.Lines) < maxFrames; e = e.v.next {
		l := e.lineOf()
		n := l.FreshLen() + 1
		if len(r.Lines) > 0 && size+n > maxBytes {
			break
		}
		r.Lines = append(r.Lines, l)
		r.Versions = append(r.Versions, e.version)
		size += n
	}
	return r
}

// Lag is how long m has lacked a change: the age of the first entry above
// its mark, 0 when it has every entry.
func (t *Table) Lag(m *Member) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	next := t.cursorNext(&m.cur)
	if next == nil {
		return 0
	}
	return max(0, time.Duration(t.cfg.Now().UnixNano()-next.changedAt))
}

// Behind reports whether the table holds an entry above m's mark.
func (t *Table) Behind(m *Member) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cursorNext(&m.cur) != nil
}

// Ack records that m took every entry up to version v in version order:
// its cursor moves past them. An entry taken and changed since has a
// higher version now, so it stays ahead of the cursor and is sent again.
func (t *Table) Ack(m *Member, v uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if v <= m.mark && m.cur.after() != nil {
		return
	}
	last := m.cur.after()
	for next := t.cursorNext(&m.cur); next != nil && next.version <= v; next = next.v.next {
		last = next
	}
	m.cur.set(last)
	t.setMark(m, max(m.mark, v))
	t.markDirty(m)
	t.reapLocked(t.cfg.Now())
}

// waitLocked notes that m found nothing above its mark: the next commit
// pokes it.
func (t *Table) waitLocked(m *Member) {
	if !m.waiting {
		m.waiting = true
		t.waiting = append(t.waiting, m)
	}
}

// wakeLocked pokes the members that wait for a change, and only them: a
// member that is behind goes on from its mark on its own (its sender
// loops while it has something to take, or backs off), so a commit costs
// O(members waiting), never O(members).
func (t *Table) wakeLocked() {
	for i, m := range t.waiting {
		m.waiting = false
		if m.active {
			poke(m.wake)
		}
		t.waiting[i] = nil
	}
	t.waiting = t.waiting[:0]
}

// markDirty notes that m's mark is to be written at the next flush.
func (t *Table) markDirty(m *Member) {
	if !m.dirty {
		m.dirty = true
		t.dirty = append(t.dirty, m)
	}
}

// linkGone puts m at the end of the members that left.
func (t *Table) linkGone(m *Member) {
	if m.inGone {
		return
	}
	m.inGone = true
	m.gone.prev, m.gone.next = t.goneTail, nil
	if t.goneTail == nil {
		t.goneHead = m
	} else {
		t.goneTail.gone.next = m
	}
	t.goneTail = m
	t.goneCount++
	t.goneBytes += goneSize(m)
}

func (t *Table) unlinkGone(m *Member) {
	if !m.inGone {
		return
	}
	m.inGone = false
	if m.gone.prev == nil {
		t.goneHead = m.gone.next
	} else {
		m.gone.prev.gone.next = m.gone.next
	}
	if m.gone.next == nil {
		t.goneTail = m.gone.prev
	} else {
		m.gone.next.gone.prev = m.gone.prev
	}
	m.gone.prev, m.gone.next = nil, nil
	t.goneCount--
	t.goneBytes -= goneSize(m)
}

// goneSize is what a member that left costs: its id, its struct and its
// map slot, and its mark's record in the journal.
func goneSize(m *Member) int64 { return int64(len(m.id)) + goneOverhead }

// goneOverhead is a member's cost beside its id.
const goneOverhead = 256

// boundGoneLocked drops the members that left longest ago while they are
// over MaxGoneMembers or MaxGoneBytes: a hostUuid that changes at every
// discovery flap leaves one behind each time, and they must not grow
// without end. A member dropped so is sent the whole table if it comes
// back, as a new one.
func (t *Table) boundGoneLocked() {
	for t.goneHead != nil && (t.goneCount > t.cfg.MaxGoneMembers || t.goneBytes > t.cfg.MaxGoneBytes) {
		t.dropMemberLocked(t.goneHead)
		t.stats.GoneDropped.Add(1)
	}
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// endItem is a tombstone in the order it ended, with the version it had
// then: an item whose entry changed or left since is stale and skipped.
type endItem struct {
	e       *entry
	version uint64
}

// endQueue holds the tombstones oldest first. Entries end in version and
// time order, so retiring (by time) and forgetting (by the members' low
// mark) both pop from the front, each from its own head: amortized O(1).
type endQueue struct {
	items                  []endItem
	retireHead, forgetHead int
	// sweepAt is the length at which push drops the stale items: an end
	// corrected again and again while a member is away (so forgetHead
	// stays put) would otherwise leave one stale item per correction.
	sweepAt int
}

// endQueueSweepFloor is the least length a sweep waits for.
const endQueueSweepFloor = 1024

func (q *endQueue) push(e *entry) {
	q.items = append(q.items, endItem{e, e.version})
	if len(q.items) >= max(q.sweepAt, endQueueSweepFloor) {
		q.sweep()
	}
}

// sweep drops the stale items and sets the next sweep at twice what is
// left: each sweep is paid for by as many pushes, amortized O(1).
func (q *endQueue) sweep() {
	kept := q.items[:0]
	retire, forget := 0, 0
	for i := range q.items {
		if i < q.forgetHead {
			continue // popped already
		}
		if q.valid(i) {
			if i < q.retireHead {
				retire++
			}
			kept = append(kept, q.items[i])
		}
	}
	clear(q.items[len(kept):])
	q.items = kept
	q.retireHead, q.forgetHead = retire, forget
	q.sweepAt = 2 * len(kept)
}

func (q *endQueue) valid(i int) bool {
	it := q.items[i]
	return !it.e.gone && it.e.version == it.version
}

// atRetire is the oldest end not yet retired, or nil.
func (q *endQueue) atRetire() *entry {
	for ; q.retireHead < len(q.items); q.retireHead++ {
		if q.valid(q.retireHead) && !q.items[q.retireHead].e.retired {
			return q.items[q.retireHead].e
		}
	}
	return nil
}

// atForget is the oldest end not yet forgotten, or nil.
func (q *endQueue) atForget() *entry {
	for ; q.forgetHead < len(q.items); q.forgetHead++ {
		if q.valid(q.forgetHead) {
			return q.items[q.forgetHead].e
		}
	}
	return nil
}

// firstUnretired is the oldest end within its retention, without moving.
func (q *endQueue) firstUnretired() *entry {
	for i := q.retireHead; i < len(q.items); i++ {
		if q.valid(i) && !q.items[i].e.retired {
			return q.items[i].e
		}
	}
	return nil
}

// compact reclaims the popped front once it is most of the slice, and
// drops stale items when they are most of the rest: amortized O(1).
func (q *endQueue) compact() {
	if q.forgetHead > 64 && q.forgetHead*2 > len(q.items) {
		n := copy(q.items, q.items[q.forgetHead:])
		clear(q.items[n:])
		q.items = q.items[:n]
		q.retireHead -= q.forgetHead
		q.forgetHead = 0
	}
}
