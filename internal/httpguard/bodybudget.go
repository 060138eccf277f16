package httpguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/promtext"
)

// Request bodies (spec 3.7). Each channel that takes bodies, the peer port
// and the ingress, has a budget of its own, so a flood on one cannot get
// the other refused (the reason the broker waiters are per channel too). A
// request reserves its declared length only once the checks that need no
// body have passed (the pin on the peer port; Origin, Host, method, path
// and Content-Type on the ingress), so a client the channel would refuse
// anyway holds nothing of it.

// requestBodyBudget bounds the bytes of request bodies one channel holds at
// once: 32 bodies at the largest a peer may send (a 1 MiB batch), or tens
// of thousands of ordinary frames. Without it each connection may hold a
// body of its own, and 1,500 connections sending 1 MiB bodies took 2.4 GB.
// The two channels together hold at most twice this.
const requestBodyBudget = 32 << 20

// bodyBudgetWait is how long a request waits for room in the budget before
// it is answered 503: long enough to ride out a burst, short enough that a
// client is never left hanging.
const bodyBudgetWait = 500 * time.Millisecond

// bodyReadTimeout is how long a request has to send its body once its
// headers are in and its room reserved: a 1 MiB body, the largest any
// channel takes, needs 4 Mbit/s, and a frame of a few KiB arrives in the
// packet after its headers. A client that declares a body and does not
// send it gives its reservation back then, not at the 10 s read timeout.
// A variable only so a test need not wait for it.
var bodyReadTimeout = 2 * time.Second

// ingressUnfinishedPerSource bounds the ingress bodies one source address
// may have in progress at once. At the bound the source's oldest
// unfinished body is cut off (its read deadline set to now, answered 408)
// to make room rather than the new request being refused: on loopback a
// producer and a process that opens bodies and never finishes them may
// share 127.0.0.1, and the producer's bodies, which arrive within
// microseconds, are never the oldest for long. 64 is well above what a
// producer that posts each frame on its own goroutine keeps in flight.
const ingressUnfinishedPerSource = 64

// errNoBodyRoom is ReadBody's error when the channel's budget had no room
// within bodyBudgetWait.
var errNoBodyRoom = errors.New("too many request bodies in progress on this node; retry after 1 s")

// errBodyDeadline is ReadBody's error when the body did not arrive within
// bodyReadTimeout, or was cut off to make room for another of its source.
var errBodyDeadline = errors.New("request body not received in time")

// RequestBodies are the daemon's body budgets, one per channel.
type RequestBodies struct {
	Peer, Ingress *BodyBudget
}

// NewRequestBodies returns the budgets of the peer port and the ingress,
// the ingress with its bound on unfinished bodies per source.
func NewRequestBodies() RequestBodies {
	return RequestBodies{
		Peer:    newBodyBudget("peer", requestBodyBudget, 0),
		Ingress: newBodyBudget("ingress", requestBodyBudget, ingressUnfinishedPerSource),
	}
}

// ReadBody reserves room in b for r's body, reads it under the body
// deadline and returns it with its hold on the room, which the caller
// releases once it no longer holds the body (after its broker write). The
// reservation is the declared length, or limit when the length is not
// declared (a chunked body is cut off at limit); a body declared over
// limit is refused before anything is reserved or read. On error nothing
// is held; BodyRefusal gives the answer.
func (b *BodyBudget) ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, BodyHold, error) {
	if r.ContentLength > limit {
		return nil, BodyHold{}, &bodyTooLargeError{limit}
	}
	n := r.ContentLength
	if n < 0 {
		n = limit
	}
	if !b.acquire(n, bodyBudgetWait, r.Context()) {
		b.refused.Add(1)
		return nil, BodyHold{}, errNoBodyRoom
	}
	hold := BodyHold{b: b, n: n}
	rc := connOf(w)
	// The deadline is set before the body is registered as unfinished, so
	// a cut for room (which sets it to now) is never overwritten by it.
	setReadDeadline(rc, time.Now().Add(bodyReadTimeout))
	u := b.unfinished.enter(r.RemoteAddr, rc)
	body, err := readBodyUpTo(w, r, limit)
	cut := b.unfinished.leave(u)
	// net/http reads ahead of the handler to notice a client that goes
	// away, and treats a read deadline there as the client gone: cleared,
	// so a slow broker write is not taken for that.
	setReadDeadline(rc, time.Time{})
	if err != nil {
		hold.Release()
		var ne net.Error
		if cut || (errors.As(err, &ne) && ne.Timeout()) {
			if cut {
				// Counted here, where the cut is known to have ended a
				// read: a body whose last byte came in just before its cut
				// is read in full and not counted. net/http may then take
				// that late deadline, on its read-ahead, for the client
				// gone and cancel r.Context(); the ingress uses no context
				// after the body, and a peer-port caller that does sees a
				// client gone, which it already answers.
				b.unfinished.cut.Add(1)
			}
			b.timedOut.Add(1)
			return nil, BodyHold{}, fmt.Errorf("%w: %d bytes declared, not all sent within %s", errBodyDeadline, r.ContentLength, bodyReadTimeout)
		}
		return nil, BodyHold{}, err
	}
	return body, hold, nil
}

// BodyHold is a body's room in its budget, from ReadBody until Release.
// A value rather than a function, so that handing it back costs no
// allocation; the zero BodyHold holds nothing.
type BodyHold struct {
	b *BodyBudget
	n int64
}

// Release gives the room back. Called once per hold.
func (h BodyHold) Release() {
	if h.b != nil {
		h.b.release(h.n)
	}
}

// BodyRefusal is the answer to ReadBody's error, with the headers it
// needs: 413 for a body over the cap, 503 with Retry-After when the budget
// had no room, 408 for a body not sent in time, 400 for a body that could
// not be read. Every refusal but the 400 closes the connection: the body
// was not read to its end, so the connection cannot carry another request.
func BodyRefusal(w http.ResponseWriter, err error) (int, string) {
	switch {
	case errors.Is(err, errBodyTooLarge):
		w.Header().Set("Connection", "close")
		return http.StatusRequestEntityTooLarge, err.Error()
	case errors.Is(err, errNoBodyRoom):
		w.Header().Set("Retry-After", strconv.Itoa(1))
		w.Header().Set("Connection", "close")
		return http.StatusServiceUnavailable, err.Error()
	case errors.Is(err, errBodyDeadline):
		w.Header().Set("Connection", "close")
		return http.StatusRequestTimeout, err.Error()
	}
	return http.StatusBadRequest, err.Error()
}

// WriteMetrics renders both budgets.
func (bs RequestBodies) WriteMetrics(t *promtext.Text) {
	all := []*BodyBudget{bs.Peer, bs.Ingress}
	series := []struct {
		name, kind, help string
		get              func(*BodyBudget) float64
	}{
		{"nvpair_wlm_request_body_bytes", "gauge", "Bytes of request bodies reserved now, per channel (peer, ingress).", func(b *BodyBudget) float64 { return float64(b.inUse()) }},
		{"nvpair_wlm_request_body_budget_bytes", "gauge", "The most bytes of request bodies a channel holds at once.", func(b *BodyBudget) float64 { return float64(b.capacity) }},
		{"nvpair_wlm_request_body_refused_total", "counter", "Requests answered 503 because their channel's request-body budget had no room for them.", func(b *BodyBudget) float64 { return float64(b.refused.Load()) }},
		{"nvpair_wlm_request_body_timeouts_total", "counter", "Requests answered 408 because their body was not sent within 2 s of their headers, or was cut off for room (ingress).", func(b *BodyBudget) float64 { return float64(b.timedOut.Load()) }},
	}
	for _, s := range series {
		t.Family(s.name, s.kind, s.help)
		for _, b := range all {
			t.Sample(s.name, []string{"channel"}, []string{b.channel}, s.get(b))
		}
	}
	u := bs.Ingress.unfinished
	t.Single("nvpair_wlm_ingress_unfinished_bodies", "gauge", "Ingress request bodies being read now.", float64(u.count()))
	t.Single("nvpair_wlm_ingress_unfinished_bodies_per_source_limit", "gauge", "The most ingress bodies one source address may have in progress; at the bound its oldest is cut off.", float64(u.perSource))
	t.Single("nvpair_wlm_ingress_unfinished_bodies_cut_total", "counter", "Ingress bodies cut off to make room for a newer one from the same source address.", float64(u.cut.Load()))
}

// setReadDeadline sets c's read deadline, if it has one to set.
func setReadDeadline(c connDeadlines, t time.Time) {
	if c != nil {
		_ = c.SetReadDeadline(t)
	}
}

// unfinishedBodies tracks the bodies being read on one channel, per source
// address, and cuts a source's oldest off when it has perSource of them.
// A nil *unfinishedBodies tracks nothing (the peer port, whose sources are
// capped by connection and must hold a pin first).
type unfinishedBodies struct {
	perSource int

	// mu guards bySource, spare, n and every registered body's links, and
	// orders a cut with its body's leave: a body is cut (its read deadline
	// set to now) only while it is still registered, and its reader leaves
	// before it clears its deadline, so a cut never lands on a request
	// that has moved on to its broker write. A leaf lock.
	mu       sync.Mutex
	bySource map[string]*sourceBodies // only sources with a body being read
	// spare is the queue of the last source to empty, kept for the next
	// source to have one: a loopback ingress sees one or two sources, and
	// without it each post whose source had no other body in flight would
	// allocate one. One at most, so what the sources left behind stays
	// bounded.
	spare *sourceBodies
	n     int

	cut atomic.Uint64
}

// sourceBodies is one source's bodies being read, oldest first.
type sourceBodies = ilist[unfinishedBody, *unfinishedBody]

// unfinishedBody is one body being read. Its fields but source and rc are
// guarded by unfinishedBodies.mu.
type unfinishedBody struct {
	source string
	rc     connDeadlines // nil for a writer without (a test's recorder)
	q      *sourceBodies // nil once it left or was cut
	links  links[unfinishedBody]
	wasCut bool
}

func (b *unfinishedBody) listLinks() *links[unfinishedBody] { return &b.links }

func newUnfinishedBodies(perSource int) *unfinishedBodies {
	if perSource <= 0 {
		return nil
	}
	return &unfinishedBodies{perSource: perSource, bySource: map[string]*sourceBodies{}}
}

// unfinishedBodyPool recycles the bodies' records: one is needed for each
// ingress post, and none is referenced once it left (leave).
var unfinishedBodyPool = sync.Pool{New: func() any { return new(unfinishedBody) }}

// enter registers a body from remoteAddr, cutting off the source's oldest
// one first when the source is at its bound.
func (u *unfinishedBodies) enter(remoteAddr string, rc connDeadlines) *unfinishedBody {
	if u == nil {
		return nil
	}
	source, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		source = remoteAddr
	}
	b := unfinishedBodyPool.Get().(*unfinishedBody)
	*b = unfinishedBody{source: source, rc: rc}
	u.mu.Lock()
	defer u.mu.Unlock()
	q := u.bySource[source]
	if q == nil {
		q, u.spare = u.spare, nil
		if q == nil {
			q = new(sourceBodies)
		}
		u.bySource[source] = q
	}
	if q.Len() >= u.perSource {
		oldest := q.front
		q.remove(oldest)
		oldest.q, oldest.wasCut = nil, true
		u.n--
		// Setting a deadline takes no system call: it is cheap under the
		// lock, and under it the cut cannot race the body's leave.
		setReadDeadline(oldest.rc, time.Now())
	}
	q.pushBack(b)
	b.q = q
	u.n++
	return b
}

// leave unregisters b and reports whether it had been cut off for room.
// b is not used after: it goes back to the pool.
func (u *unfinishedBodies) leave(b *unfinishedBody) (wasCut bool) {
	if u == nil {
		return false
	}
	u.mu.Lock()
	if q := b.q; q != nil {
		q.remove(b)
		b.q = nil
		u.n--
		if q.Len() == 0 {
			delete(u.bySource, b.source)
			u.spare = q
		}
	}
	wasCut = b.wasCut
	u.mu.Unlock()
	*b = unfinishedBody{}
	unfinishedBodyPool.Put(b)
	return wasCut
}

// count is the bodies being read now, for the metrics.
func (u *unfinishedBodies) count() int {
	if u == nil {
		return 0
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n
}

// BodyBudget is a counting semaphore over request-body bytes.
type BodyBudget struct {
	channel    string // peer or ingress, as the metrics label it
	capacity   int64
	unfinished *unfinishedBodies // nil on the peer port

	// mu guards used, freed and waiting. A leaf lock.
	mu      sync.Mutex
	used    int64
	freed   chan struct{} // closed and replaced when bytes are given back while a request waits
	waiting int           // requests waiting on freed

	refused, timedOut atomic.Uint64
}

// newBodyBudget returns a budget of capacity bytes for channel; a
// positive perSource bounds the bodies in progress per source address.
func newBodyBudget(channel string, capacity int64, perSource int) *BodyBudget {
	return &BodyBudget{channel: channel, capacity: capacity, unfinished: newUnfinishedBodies(perSource), freed: make(chan struct{})}
}

// acquire reserves n bytes, waiting up to wait for room; it reports false
// when there was none by then. n is at most the capacity (the callers'
// caps are far below it).
func (b *BodyBudget) acquire(n int64, wait time.Duration, ctx context.Context) bool {
	b.mu.Lock()
	if b.used+n <= b.capacity {
		// The common case: room at once, with no timer and no wait.
		b.used += n
		b.mu.Unlock()
		return true
	}
	b.mu.Unlock()
	// The context's channel is asked for only here, where a request
	// waits: a request's context makes it on the first Done, one
	// allocation that the common case above does not pay.
	done := ctx.Done()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		b.mu.Lock()
		if b.used+n <= b.capacity {
			b.used += n
			b.mu.Unlock()
			return true
		}
		// Counted in the same hold that reads freed, so a release after
		// it closes the channel this request waits on.
		freed := b.freed
		b.waiting++
		b.mu.Unlock()
		var ok bool
		select {
		case <-freed:
			ok = true
		case <-deadline.C:
		case <-done:
		}
		b.mu.Lock()
		b.waiting--
		b.mu.Unlock()
		if !ok {
			return false
		}
	}
}

// release gives n bytes back and wakes the requests waiting for room, if
// any: with none waiting, the channel is left as it is.
func (b *BodyBudget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	if b.waiting > 0 {
		close(b.freed)
		b.freed = make(chan struct{})
	}
	b.mu.Unlock()
}

// inUse is the bytes reserved now, for the metrics.
func (b *BodyBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
