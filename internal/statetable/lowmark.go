package statetable

import "container/heap"

// The members' lowest mark (spec 5.1, 5.2): an end at or below it is held
// by every member and may be forgotten. It is asked for at every reap, on
// every ack, so it is kept as a min-heap of the members by mark, each
// member knowing its place: an ack moves one member down the heap in
// O(log members), a join or a drop costs the same, and reading it is
// O(1). A low mark found again by a walk of the members whenever the last
// member at it moved on cost a walk per ack of a member lagging alone, and
// with the members spread over many marks (catching up after a partition,
// each at its own pace) nearly a walk per ack: O(members) each, O(members²)
// per change.
//
// markHeap orders the members by mark, keeping each member's place
// (Member.lowAt) for Fix and Remove. looks counts the comparisons of
// marks, for a test that holds an ack to O(log members). Guarded by
// Table.mu.
type markHeap struct {
	ms    []*Member
	looks uint64
}

func (h *markHeap) Len() int { return len(h.ms) }
func (h *markHeap) Less(i, j int) bool {
	h.looks++
	return h.ms[i].mark < h.ms[j].mark
}
func (h *markHeap) Swap(i, j int) {
	h.ms[i], h.ms[j] = h.ms[j], h.ms[i]
	h.ms[i].lowAt, h.ms[j].lowAt = i, j
}
func (h *markHeap) Push(x any) {
	m := x.(*Member)
	m.lowAt = len(h.ms)
	h.ms = append(h.ms, m)
}
func (h *markHeap) Pop() any {
	n := len(h.ms) - 1
	m := h.ms[n]
	h.ms[n] = nil
	h.ms = h.ms[:n]
	m.lowAt = -1
	return m
}

// addLow places a member new to the table.
func (t *Table) addLow(m *Member) {
	heap.Push(&t.low, m)
}

// removeLow takes a dropped member out.
func (t *Table) removeLow(m *Member) {
	if m.lowAt >= 0 {
		heap.Remove(&t.low, m.lowAt)
	}
}

// lowMarkLocked is the lowest mark of the members holding a claim: an end
// at or below it is held by every member. Without members it is the
// highest version: nobody is owed anything.
func (t *Table) lowMarkLocked() uint64 {
	if len(t.low.ms) == 0 {
		return ^uint64(0)
	}
	return t.low.ms[0].mark
}

// setMark moves m's mark to v, keeping its place in the heap.
func (t *Table) setMark(m *Member, v uint64) {
	old := m.mark
	m.mark = v
	if old != v && m.lowAt >= 0 {
		heap.Fix(&t.low, m.lowAt)
	}
}
