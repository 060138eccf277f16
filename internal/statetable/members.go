package statetable

import "time"

// vcursor is a place in version order: after is the last entry it has
// (nil: none yet). The table moves it back when that entry leaves.
type vcursor struct{ after *entry }

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
	wake     chan struct{} // poked on every change; one pending is enough
}

// Wake is poked whenever the table changes.
func (m *Member) Wake() <-chan struct{} { return m.wake }

// ID is the member's node id.
func (m *Member) ID() string { return m.id }

// resetLocked sends the member the whole table from the start: an end it
// had not acknowledged was evicted.
func (m *Member) resetLocked() {
	m.cur.after, m.mark = nil, 0
}

func (t *Table) memberLocked(id string) *Member {
	m := t.members[id]
	if m == nil {
		m = &Member{id: id, wake: make(chan struct{}, 1)}
		t.members[id] = m
		t.vcursors[&m.cur] = struct{}{}
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
// has not acknowledged for MemberClaim, within the byte bound.
func (t *Table) Leave(m *Member) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.members[m.id] != m {
		return
	}
	m.active, m.departed = false, t.cfg.Now()
	t.journalAck(m)
}

func (t *Table) dropMemberLocked(id string, m *Member) {
	delete(t.members, id)
	delete(t.vcursors, &m.cur)
	t.stats.ClaimsExpired.Add(1)
	b := []byte{recDropMember}
	t.appendRecord(appendString(b, id))
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
	e := t.versions.head
	if m.cur.after != nil {
		e = m.cur.after.v.next
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
	next := t.versions.head
	if m.cur.after != nil {
		next = m.cur.after.v.next
	}
	if next == nil {
		return 0
	}
	return max(0, time.Duration(t.cfg.Now().UnixNano()-next.changedAt))
}

// Behind reports whether the table holds an entry above m's mark.
func (t *Table) Behind(m *Member) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m.cur.after == nil {
		return t.versions.head != nil
	}
	return m.cur.after.v.next != nil
}

// Ack records that m took every entry up to version v in version order:
// its cursor moves past them. An entry taken and changed since has a
// higher version now, so it stays ahead of the cursor and is sent again.
func (t *Table) Ack(m *Member, v uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if v <= m.mark && m.cur.after != nil {
		return
	}
	for {
		next := t.versions.head
		if m.cur.after != nil {
			next = m.cur.after.v.next
		}
		if next == nil || next.version > v {
			break
		}
		m.cur.after = next
	}
	m.mark = max(m.mark, v)
	t.journalAck(m)
	t.reapLocked(t.cfg.Now())
}

func (t *Table) wakeLocked() {
	for _, m := range t.members {
		if m.active {
			poke(m.wake)
		}
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
