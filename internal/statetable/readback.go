package statetable

import (
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// The ingress read-back (spec 3.5.2) walks pass order a slice at a time,
// the lock released in between. An entry that leaves pass order keeps its
// next link, so a walk that holds it between two slices goes on from it
// to the entries that followed it.

// ReadPos is a read-back walk's place: the next entry it looks at.
type ReadPos struct{ e *entry }

// AtEnd reports whether the walk has reached the end of pass order.
func (p ReadPos) AtEnd() bool { return p.e == nil }

// ReadMark names an entry's place, for the read-back's cursor.
type ReadMark struct {
	Order uint64
	Key   wireframe.WorkloadKey
}

// ReadItem is one workload a read-back lists.
type ReadItem struct {
	Line     []byte // the run's re-assertion line; never modified
	Mark     ReadMark
	Deadline time.Time // its lease's; zero for none
}

// ReadVisit is what one slice of a walk found.
type ReadVisit struct {
	Items   []ReadItem // the workloads to list, at most the slice's want
	Beyond  bool       // a further workload to list came after them
	Last    ReadMark   // the last entry looked at
	Visited int        // the entries looked at
	Next    ReadPos    // where the next slice starts
}

// ReadStart returns where a walk starts: the head of pass order without
// a mark; with one, the entry after the mark's when it still holds its
// place (one lookup), else the first entry of a higher order, found a
// slice at a time with the lock released in between. visited counts the
// entries looked at.
func (t *Table) ReadStart(mark *ReadMark, slice int, visited func(int)) ReadPos {
	t.mu.Lock()
	defer t.mu.Unlock()
	if mark == nil {
		return ReadPos{t.pass.head}
	}
	if e := t.byKey[mark.Key]; e != nil && e.inPass && e.order == mark.Order {
		return ReadPos{e.p.next}
	}
	p := t.pass.head
	for {
		n := 0
		for ; n < slice && p != nil && p.order <= mark.Order; n++ {
			p = p.p.next
		}
		visited(n)
		if p == nil || p.order > mark.Order {
			return ReadPos{p}
		}
		t.mu.Unlock()
		t.mu.Lock()
	}
}

// ReadSlice looks at up to slice entries from pos in one hold, and copies
// out the first want of those a read-back lists (producers' runs in pass
// order, ended ones within their retention, whose requesterId is requester
// when it is not nil), noting whether
// there were more. Each entry costs the same few comparisons whether it
// is listed or not: the filter reads the requesterId the entry holds.
func (t *Table) ReadSlice(pos ReadPos, requester *string, want, slice int) (v ReadVisit) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	p := pos.e
	var e *entry
	for ; v.Visited < slice && p != nil; v.Visited++ {
		e, p = p, p.p.next
		// An end past its retention is not listed even before a reap
		// has taken it out of pass order.
		ended := e.kind != kindLive && now.Sub(e.endedAt) >= t.cfg.Retention
		if !e.inPass || ended || e.owner != Producer || (requester != nil && (!e.hasRequester || e.requester != *requester)) {
			continue
		}
		if len(v.Items) == want {
			v.Beyond = true
			continue
		}
		it := ReadItem{Line: e.line, Mark: ReadMark{e.order, e.key}}
		if e.lease != nil {
			it.Deadline = e.lease.deadline
		}
		v.Items = append(v.Items, it)
	}
	if e != nil {
		v.Last = ReadMark{e.order, e.key}
	}
	v.Next = ReadPos{p}
	return v
}
