package main

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// requestBodyBudget bounds the bytes of request bodies the daemon holds at
// once, across the peer port and the ingress: 32 bodies at the largest a
// peer may send (a 1 MiB batch), or tens of thousands of ordinary frames.
// Without it each connection may hold a body of its own, and 1,500
// connections sending 1 MiB bodies took 2.4 GB.
const requestBodyBudget = 32 << 20

// bodyBudgetWait is how long a request waits for room in the budget before
// it is answered 503: long enough to ride out a burst, short enough that a
// client is never left hanging.
const bodyBudgetWait = 500 * time.Millisecond

// bodyBudget is a counting semaphore over request-body bytes.
type bodyBudget struct {
	capacity int64

	// mu guards used, freed and waiting. A leaf lock.
	mu      sync.Mutex
	used    int64
	freed   chan struct{} // closed and replaced when bytes are given back while a request waits
	waiting int           // requests waiting on freed

	refused atomic.Uint64
}

func newBodyBudget(capacity int64) *bodyBudget {
	return &bodyBudget{capacity: capacity, freed: make(chan struct{})}
}

// acquire reserves n bytes, waiting up to wait for room; it reports false
// when there was none by then. n is at most the capacity (the callers'
// caps are far below it).
func (b *bodyBudget) acquire(n int64, wait time.Duration, done <-chan struct{}) bool {
	b.mu.Lock()
	if b.used+n <= b.capacity {
		// The common case: room at once, with no timer and no wait.
		b.used += n
		b.mu.Unlock()
		return true
	}
	b.mu.Unlock()
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
func (b *bodyBudget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	if b.waiting > 0 {
		close(b.freed)
		b.freed = make(chan struct{})
	}
	b.mu.Unlock()
}

// inUse is the bytes reserved now, for the metrics.
func (b *bodyBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// guard reserves room for a request's body before next reads it, and
// gives it back when next returns. The reservation is the declared length,
// or maxBody when the length is not declared (a chunked body is cut off at
// the handler's cap, which is maxBody); a body declared over maxBody is
// refused by the handler before it is read, so it reserves nothing. A
// request that finds no room within bodyBudgetWait is answered 503 with
// Retry-After, unread, and its connection closed.
func (b *bodyBudget) guard(next http.Handler, maxBody int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.ContentLength
		switch {
		case n < 0:
			n = maxBody
		case n > maxBody:
			n = 0
		}
		if n == 0 {
			next.ServeHTTP(w, r)
			return
		}
		if !b.acquire(n, bodyBudgetWait, r.Context().Done()) {
			b.refused.Add(1)
			w.Header().Set("Retry-After", strconv.Itoa(1))
			w.Header().Set("Connection", "close")
			answer(w, http.StatusServiceUnavailable, "too many request bodies in progress on this node; retry after 1 s")
			return
		}
		defer b.release(n)
		next.ServeHTTP(w, r)
	})
}

// writeMetrics renders the budget.
func (b *bodyBudget) writeMetrics(t *metricsText) {
	t.single("nvpair_wlm_request_body_bytes", "gauge", "Bytes of request bodies reserved now, on the peer port and the ingress together.", float64(b.inUse()))
	t.single("nvpair_wlm_request_body_budget_bytes", "gauge", "The most bytes of request bodies held at once.", float64(b.capacity))
	t.single("nvpair_wlm_request_body_refused_total", "counter", "Requests answered 503 because the request-body budget had no room for them.", float64(b.refused.Load()))
}
