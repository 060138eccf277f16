package httpguard

import (
	"slices"
	"testing"
)

// node is an ilist element for the tests.
type node struct {
	v int
	l links[node]
}

func (n *node) listLinks() *links[node] { return &n.l }

// values walks q front to back and back to front, and fails unless both
// walks and Len agree.
func values(t *testing.T, q *ilist[node, *node]) []int {
	t.Helper()
	var fwd, back []int
	for e := q.front; e != nil; e = nextIn(e) {
		fwd = append(fwd, e.v)
	}
	for e := q.back; e != nil; e = e.l.prev {
		back = append(back, e.v)
	}
	slices.Reverse(back)
	if !slices.Equal(fwd, back) || len(fwd) != q.Len() {
		t.Fatalf("front to back %v, back to front %v, Len %d: the links disagree", fwd, back, q.Len())
	}
	return fwd
}

// An element taken out of the middle, the front or the back leaves the
// others linked both ways in their order; taking out one that is not in
// the list changes nothing; an element taken out can be put back.
func TestTheIntrusiveListKeepsItsOrderThroughRemovals(t *testing.T) {
	var q ilist[node, *node]
	ns := make([]*node, 5)
	for i := range ns {
		ns[i] = &node{v: i}
		q.pushBack(ns[i])
	}
	for _, step := range []struct {
		remove int
		want   []int
	}{
		{2, []int{0, 1, 3, 4}},
		{0, []int{1, 3, 4}},
		{4, []int{1, 3}},
		{4, []int{1, 3}}, // not in the list: nothing happens
	} {
		q.remove(ns[step.remove])
		if got := values(t, &q); !slices.Equal(got, step.want) {
			t.Fatalf("after removing %d: %v, want %v", step.remove, got, step.want)
		}
		if ns[step.remove].l.in {
			t.Fatalf("%d still says it is in the list", step.remove)
		}
	}
	q.pushBack(ns[0])
	if got := values(t, &q); !slices.Equal(got, []int{1, 3, 0}) {
		t.Fatalf("after putting 0 back: %v, want [1 3 0]", got)
	}
	q.remove(ns[1])
	q.remove(ns[3])
	q.remove(ns[0])
	if got := values(t, &q); len(got) != 0 || q.front != nil || q.back != nil {
		t.Fatalf("emptied list holds %v (front %v, back %v)", got, q.front, q.back)
	}
}
