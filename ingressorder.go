package main

import (
	"fmt"
	"sync"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/wireframe"
)

// The ingress order (spec 3.5, 6). An ingress frame, a producer's post or a
// lease's expiry, is written up to the broker first and only then committed
// to the state table (which the peers' senders read), and concurrent
// ingress frames reach the broker and the state table in one order. ingestMu decides
// that order, but it is held only while a frame takes its place in the
// broker order (brokerio.Writer.enter), not across the write: posts that wait
// together are written together (internal/brokerio/writer.go). The frame's commit is its
// after-write step, which the group's leader runs in the broker order
// before any later group is written; a frame whose write fails is not
// committed.
//
// Between taking its place and being committed, a frame is in flight. Two
// checks that used to see every earlier post committed, because ingestMu
// was held through the commit, account for the frames in flight instead:
// the live-workload limit counts the runs they would start and the bytes
// they would add, and a lease's expiry waits until they are settled before
// it reads the lease.

// ingressInFlight counts the ingress frames that have their place in the
// broker order and are not yet settled: committed after their write, or
// failed.
type ingressInFlight struct {
	// mu guards n, newRuns, bytes and drained. A leaf lock: taken under
	// ingestMu by a frame taking its place and by the expiry, and alone by
	// the commit that settles a frame (run by the group's leader) and by a
	// failed frame's caller.
	mu sync.Mutex
	n  int
	// newRuns counts, per run, the frames in flight that would start it:
	// runs the re-sync set did not hold when their frame was checked. The
	// live-workload check counts each such run once.
	newRuns map[wireframe.WorkloadKey]int
	// bytes is what the lifecycle frames in flight may add to the re-sync
	// set: each one's re-assertion line at most. The byte bound's check
	// counts it as the entry bound's counts newRuns.
	bytes int64
	// drained, when not nil, is closed when n falls to 0: the expiry waits
	// on it.
	drained chan struct{}
}

// pendingRuns returns how many runs the frames in flight would start,
// whether key is one of them, and the bytes they may add to the re-sync set.
func (q *ingressInFlight) pendingRuns(key wireframe.WorkloadKey) (n int, pending bool, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.newRuns), q.newRuns[key] > 0, q.bytes
}

// accept counts a frame in; startsRun says it would start run key, bytes
// what it may add to the re-sync set.
func (q *ingressInFlight) accept(key wireframe.WorkloadKey, startsRun bool, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n++
	q.bytes += bytes
	if startsRun {
		if q.newRuns == nil {
			q.newRuns = map[wireframe.WorkloadKey]int{}
		}
		q.newRuns[key]++
	}
}

// settle counts a frame out, once it is committed or has failed.
func (q *ingressInFlight) settle(key wireframe.WorkloadKey, startsRun bool, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n--
	q.bytes -= bytes
	if startsRun {
		if q.newRuns[key]--; q.newRuns[key] == 0 {
			delete(q.newRuns, key)
		}
	}
	if q.n == 0 && q.drained != nil {
		close(q.drained)
		q.drained = nil
	}
}

// waitSettled returns once every frame in flight is settled. Called with
// ingestMu held, so no frame joins them meanwhile and the wait ends: the
// frames' writes and commits take no lock the caller holds.
func (q *ingressInFlight) waitSettled() {
	q.mu.Lock()
	if q.n == 0 {
		q.mu.Unlock()
		return
	}
	if q.drained == nil {
		q.drained = make(chan struct{})
	}
	ch := q.drained
	q.mu.Unlock()
	<-ch
}

// ingressTurn is an ingress frame's place in the broker order.
type ingressTurn struct {
	turn brokerio.Turn
	c    *ingressCommit
}

// ingressCommit is an ingress frame's commit, which its group's leader
// runs after the write (run), and what it leaves for the frame's own
// caller: the journal record its 200 waits for. One allocation per frame
// holds all of it: the frame, its line in the table and its count in
// flight.
type ingressCommit struct {
	m         *Manager
	f         localFrame
	line      []byte // the frame's line in the table, built before ingestMu
	key       wireframe.WorkloadKey
	startsRun bool
	bytes     int64
	seq       uint64 // set by run
}

// run commits the frame after its write, in the broker order, and counts
// it out of flight.
func (c *ingressCommit) run() {
	_, c.seq = c.m.commitLocalLine(&c.f, fromIngress, c.line)
	c.settle()
}

// settle counts the frame out of flight: once committed, or failed.
func (c *ingressCommit) settle() { c.m.ingressFlight.settle(c.key, c.startsRun, c.bytes) }

// wait returns once the frame is written, committed and its journal
// record durable (spec 5.3: a 200 is a promise), or as ingress.ErrBrokerWrite once
// its group's write failed, which committed nothing, or as ingress.ErrNotDurable
// once its record's write failed: the frame is applied, and a retry of it
// is harmless.
func (t ingressTurn) wait() error {
	if err := t.written(); err != nil {
		return err
	}
	return t.durable()
}

// written returns once the frame is written to the broker and committed,
// or as ingress.ErrBrokerWrite once its group's write failed.
func (t ingressTurn) written() error {
	if err := t.turn.Wait(); err != nil {
		t.c.settle()
		return fmt.Errorf("%w: %v", ingress.ErrBrokerWrite, err)
	}
	return nil
}

// durable returns once the committed frame's journal record is durable,
// or as ingress.ErrNotDurable once its write failed.
func (t ingressTurn) durable() error {
	if err := t.c.m.journal.wait(t.c.seq); err != nil {
		return fmt.Errorf("%w: %v", ingress.ErrNotDurable, err)
	}
	return nil
}
