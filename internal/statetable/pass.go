package statetable

// Pass is one heartbeat pass's place in pass order. next and the parked
// links are guarded by the table's lock, which moves the pass when the
// entry it points at leaves; the other fields belong to the pass's owner.
type Pass struct {
	next *entry
	// parkedPrev and parkedNext link the passes whose next is the same
	// entry (entry.parked), so that an entry leaving pass order moves on
	// the passes parked on it in O(their count), whatever the passes in
	// progress elsewhere (one per reachable member).
	parkedPrev, parkedNext *Pass
	start                  uint64 // the table's version when the pass started
	pending                bool   // started, not yet placed
	Size                   int    // runs in pass order when the pass was placed
	Progress               int    // runs the pass has taken so far
}

// BeginPass starts p: it visits every run in pass order except those
// changed after it began, which every member is sent as fresh entries. It
// needs no lock: p takes its place at its first take.
func (t *Table) BeginPass(p *Pass) {
	p.start, p.pending, p.Size, p.Progress = t.version.Load(), true, 0, 0
}

// BeginPassUpTo starts p over the runs whose version is at most upTo: a
// member's re-assertion of the table when it joins, whose catch-up
// carries every entry above its mark (upTo) already.
func (t *Table) BeginPassUpTo(p *Pass, upTo uint64) {
	t.BeginPass(p)
	p.start = min(p.start, upTo)
}

// TakePass returns the re-assertion lines of up to maxFrames runs from p's
// place on, at most maxBytes in all (but at least one), and reports
// whether the pass reached the end of the order.
func (t *Table) TakePass(p *Pass, maxFrames, maxBytes int) (lines [][]byte, done bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reapLocked(t.cfg.Now())
	next := p.next
	if p.pending {
		next, p.pending, p.Size = t.pass.head, false, t.inPass
	}
	size := 0
	for next != nil && len(lines) < maxFrames {
		e := next
		if e.version > p.start {
			next = e.p.next
			continue
		}
		if len(lines) > 0 && size+len(e.line) > maxBytes {
			break
		}
		lines = append(lines, e.line)
		size += len(e.line)
		next = e.p.next
	}
	p.park(next)
	p.Progress += len(lines)
	return lines, next == nil
}

// ClosePass forgets p; the table no longer moves it.
func (t *Table) ClosePass(p *Pass) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p.park(nil)
}

// park moves p's place to e (nil: the end of the order, or closed): off
// the parked list of the entry it was on and onto e's.
func (p *Pass) park(e *entry) {
	if old := p.next; old != nil {
		if p.parkedPrev == nil {
			old.parked = p.parkedNext
		} else {
			p.parkedPrev.parkedNext = p.parkedNext
		}
		if p.parkedNext != nil {
			p.parkedNext.parkedPrev = p.parkedPrev
		}
	}
	p.next, p.parkedPrev, p.parkedNext = e, nil, nil
	if e != nil {
		p.parkedNext = e.parked
		if e.parked != nil {
			e.parked.parkedPrev = p
		}
		e.parked = p
	}
}
