package httpguard

// ilist is a doubly linked list threaded through its elements, oldest
// first: adding an element allocates nothing, and taking one out is O(1)
// given the element. The connection caps keep their waiting connections in
// one (ConnLimiter.waiting), the body budget each source's bodies being
// read. An element is in at most one list at a time; the list's guard
// (its owner's mutex) guards the element's links too.
type ilist[T any, P linked[T]] struct {
	front, back *T
	n           int
}

// links are an element's place in an ilist.
type links[T any] struct {
	in         bool // in a list
	prev, next *T
}

// linked is a pointer to an element type that holds its links.
type linked[T any] interface {
	*T
	listLinks() *links[T]
}

// Len is how many elements the list holds.
func (q *ilist[T, P]) Len() int { return q.n }

// pushBack puts e, in no list, at the back.
func (q *ilist[T, P]) pushBack(e *T) {
	l := P(e).listLinks()
	l.in, l.prev, l.next = true, q.back, nil
	if q.back != nil {
		P(q.back).listLinks().next = e
	} else {
		q.front = e
	}
	q.back = e
	q.n++
}

// remove takes e out of the list, if it is in it.
func (q *ilist[T, P]) remove(e *T) {
	l := P(e).listLinks()
	if !l.in {
		return
	}
	if l.prev != nil {
		P(l.prev).listLinks().next = l.next
	} else {
		q.front = l.next
	}
	if l.next != nil {
		P(l.next).listLinks().prev = l.prev
	} else {
		q.back = l.prev
	}
	*l = links[T]{}
	q.n--
}

// nextIn is the element after e, nil at the back.
func nextIn[T any, P linked[T]](e *T) *T { return P(e).listLinks().next }
