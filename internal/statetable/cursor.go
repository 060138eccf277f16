package statetable

// A cursor is a place in version order: the last entry a member (or a
// walk) has. An entry that leaves version order (it changed, so it moves
// to the tail, or it is deleted) must leave the cursors on it on the entry
// before it, and a commit must not pay for every cursor to do that: 2,000
// members away pin 2,000 cursors. So cursors do not point at entries but
// at an anchor, one per entry that has cursors on it, and an entry that
// leaves hands its anchor to the entry before it, or merges it into the
// anchor that entry has: O(1) per unlink, whatever the count of cursors
// (a union-find; a cursor finds its root with path compression).

// anchor is where one or more cursors are. Only a root (parent nil) says
// where: after is its entry (nil: before the first), pins the cursors
// that lead to it.
type anchor struct {
	after  *entry
	parent *anchor
	pins   int
}

// vcursor is a cursor; a nil anchor is before the first entry.
type vcursor struct{ a *anchor }

// root is c's anchor's root, with c pointed at it.
func (c *vcursor) root() *anchor {
	a := c.a
	if a == nil {
		return nil
	}
	r := a
	for r.parent != nil {
		r = r.parent
	}
	for a != r { // path compression: the next find is one step
		next := a.parent
		a.parent = r
		a = next
	}
	c.a = r
	return r
}

// after is the last entry c has, nil for none.
func (c *vcursor) after() *entry {
	if r := c.root(); r != nil {
		return r.after
	}
	return nil
}

// next is the first entry c lacks, nil for none.
func (t *Table) cursorNext(c *vcursor) *entry {
	if a := c.after(); a != nil {
		return a.v.next
	}
	return t.versions.head
}

// set moves c to after e (nil: before the first).
func (c *vcursor) set(e *entry) {
	c.release()
	if e == nil {
		return
	}
	if e.anchor == nil {
		e.anchor = &anchor{after: e}
	}
	e.anchor.pins++
	c.a = e.anchor
}

// release takes c off its anchor: an anchor no cursor leads to leaves its
// entry.
func (c *vcursor) release() {
	r := c.root()
	c.a = nil
	if r == nil {
		return
	}
	r.pins--
	if r.pins == 0 && r.after != nil && r.after.anchor == r {
		r.after.anchor = nil
	}
}

// handOver leaves the cursors on e, which leaves version order, on the
// entry before it: O(1).
func (e *entry) handOver() {
	a := e.anchor
	if a == nil {
		return
	}
	e.anchor = nil
	p := e.v.prev
	switch {
	case p == nil:
		a.after = nil // before the first: nothing moves it again
	case p.anchor == nil:
		a.after, p.anchor = p, a
	default:
		a.after, a.parent = nil, p.anchor
		p.anchor.pins += a.pins
	}
}
