package main

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// The ingress order (spec 3.5, 6). An ingress frame, a producer's post or a
// lease's expiry, is written up to the broker first and only then committed
// to the state table (which the peers' senders read), and concurrent
// ingress frames reach the broker and the state table in one order.
// ingestMu decides that order, but it is held only while a frame takes its
// place in the broker order (brokerio.Writer.Enter), not across the write:
// posts that wait together are written together
// (internal/brokerio/writer.go). The frame's commit is its after-write
// step, which the group's leader runs in the broker order before any later
// group is written; a frame whose write fails is not committed.
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

// ingressOrder is what a frame's commit needs after its write, and no
// more of the Manager: the count of frames in flight, the commit itself
// (Manager.commitLocalLine, taken once at NewManager) and the journal its
// record's durability is waited on in.
type ingressOrder struct {
	flight  *ingressInFlight
	commit  func(f *localFrame, src frameSource, line []byte) (applied bool, seq uint64)
	journal *tableJournal
}

// ingressCommit is an ingress frame's commit, which its group's leader
// runs after the write (run), and what it leaves for the frame's own
// caller: the journal record its 200 waits for. One allocation per frame
// holds all of it: the frame, its line in the table and its count in
// flight.
type ingressCommit struct {
	order     *ingressOrder
	f         localFrame
	line      []byte // the frame's line in the table, built before ingestMu
	key       wireframe.WorkloadKey
	startsRun bool
	bytes     int64
	seq       uint64 // set by run
	// runFn is run as a func value, bound once when the commit is made:
	// the group's leader calls it, and a method value bound per frame
	// would be an allocation per frame.
	runFn func()
}

// commits recycles ingressCommit values: a producer's frame takes one and gives
// it back once answered (ingressTurn.release), so a frame allocates no
// commit; at 20,000 frames a second that is some 10 MB a second less
// for the collector, which the state table makes costly (a new job per
// frame grows the heap it marks). A commit is given back only when
// nothing holds it any more: its group's leader has run it, or its
// write failed and it never will.
var commits = sync.Pool{New: func() any {
	c := new(ingressCommit)
	c.runFn = c.run
	return c
}}

// newIngressCommit returns a commit from the pool, holding the frame.
func newIngressCommit(order *ingressOrder, f localFrame, line []byte, startsRun bool, bytes int64) *ingressCommit {
	c := commits.Get().(*ingressCommit)
	c.order, c.f, c.line, c.key, c.startsRun, c.bytes, c.seq = order, f, line, f.life.Key(), startsRun, bytes, 0
	return c
}

// recycle gives c back to the pool, holding nothing of its frame.
func (c *ingressCommit) recycle() {
	c.order, c.f, c.line, c.key = nil, localFrame{}, nil, wireframe.WorkloadKey{}
	commits.Put(c)
}

// run commits the frame after its write, in the broker order, and counts
// it out of flight.
func (c *ingressCommit) run() {
	_, c.seq = c.order.commit(&c.f, fromIngress, c.line)
	c.settle()
}

// settle counts the frame out of flight: once committed, or failed.
func (c *ingressCommit) settle() { c.order.flight.settle(c.key, c.startsRun, c.bytes) }

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
	if err := t.c.order.journal.wait(t.c.seq); err != nil {
		return fmt.Errorf("%w: %v", ingress.ErrNotDurable, err)
	}
	return nil
}

// release gives the turn's commit back to the pool once its caller is
// done with it: after written returned (its group's leader has run the
// commit, or never will) and after durable, if called.
func (t ingressTurn) release() { t.c.recycle() }

// enterIngressOrder gives an ingress frame its place in the broker order,
// with line its broker line and peerLine its line to the peers, both built
// before ingestMu was taken; bytes is what it may add to the re-sync set
// (0 for a removal). Called with ingestMu held; the caller waits on the
// turn after releasing it. A line over the broker's line limit is
// returned as it is; a broker already gone as ingress.ErrBrokerWrite. Either
// leaves nothing in flight.
func (m *Manager) enterIngressOrder(f localFrame, line *bytes.Buffer, tableLine []byte, startsRun bool, bytes int64) (ingressTurn, error) {
	c := newIngressCommit(&m.order, f, tableLine, startsRun, bytes)
	m.ingressFlight.accept(c.key, startsRun, bytes)
	turn, err := m.out.Enter(line, c.runFn)
	if err != nil {
		c.settle()
		c.recycle() // in no group: nothing will run it
		if errors.Is(err, wireframe.ErrLineOverLimit) {
			return ingressTurn{}, err
		}
		return ingressTurn{}, fmt.Errorf("%w: %v", ingress.ErrBrokerWrite, err)
	}
	return ingressTurn{turn: turn, c: c}, nil
}

// enterLocalFrame is enterIngressOrder for a frame whose lines are built
// here, under ingestMu: the lease's expiry, rare enough not to matter. It
// is checked against neither of the re-sync set's bounds (it replaces a
// run the set holds, with a few bytes of error text more), so it counts
// no bytes in flight.
func (m *Manager) enterLocalFrame(f localFrame) (ingressTurn, error) {
	return m.enterIngressOrder(f, ingressLine(&f, m.marker, m.cfg.BrokerLineMax), tableLine(&f), false, 0)
}

// enterIngress checks the live-workload limit and gives a producer's frame
// its place in the broker order, under ingestMu. The limit is checked
// before the broker write, so a refused frame leaves nothing anywhere.
func (m *Manager) enterIngress(f localFrame, line *bytes.Buffer, peerLine []byte) (ingressTurn, error) {
	// What the frame may add to the re-sync set: its re-assertion line,
	// the line to the peers with the marker, at most.
	var bytes int64
	if !f.isRemoval() {
		bytes = int64(len(peerLine))
	}
	m.ingestMu.Lock()
	defer m.ingestMu.Unlock()
	if err := m.checkOwner(&f); err != nil {
		brokerio.PutLine(line)
		return ingressTurn{}, err
	}
	startsRun, err := m.checkLiveLimit(&f, bytes)
	if err != nil {
		brokerio.PutLine(line)
		return ingressTurn{}, err
	}
	return m.enterIngressOrder(f, line, peerLine, startsRun, bytes)
}

// checkLiveLimit refuses a lifecycle frame that would start a new run
// while the re-sync set, with the runs that ingress frames in flight would
// start, is full, or whose line of up to lineBytes would take the set's
// bytes, with those the frames in flight may add, past its byte bound; it
// reports whether the frame would start a run. Called with ingestMu held,
// so no other ingress frame is checked meanwhile.
//
// The runs in flight are read before the set: a frame's commit tracks its
// run before it leaves the count, so a run is counted once or, for the
// instant between the two, twice (a refusal one frame early), never not at
// all. The set still exceeds its limit when broker frames take the slots
// of runs in flight (a broker frame is tracked while the set holds fewer
// than the limit, and an ingress frame already written is tracked
// anyway), by at most the runs in flight: at most brokerio.WaitersMax. The
// bytes likewise, by at most the lines of the frames in flight.
func (m *Manager) checkLiveLimit(f *localFrame, lineBytes int64) (startsRun bool, err error) {
	if f.isRemoval() {
		return false, nil
	}
	pending, counted, pendingBytes := m.ingressFlight.pendingRuns(f.life.Key())
	if counted {
		// Its run's slot is taken already; the bytes of the frame in
		// flight that took it count toward the byte bound.
		return true, m.checkLiveBytes(pendingBytes, lineBytes)
	}
	hit, held, after := m.table.AtLimit(&f.life, pending, pendingBytes, int(lineBytes))
	switch hit {
	case statetable.LimitEntries:
		return false, &ingress.AtLimitError{Bound: hit, Limit: int64(m.cfg.MaxLiveWorkloads), After: after}
	case statetable.LimitBytes:
		return false, &ingress.AtLimitError{Bound: hit, Limit: m.cfg.MaxLiveWorkloadBytes, Held: m.table.Sizes().RunBytes, After: after}
	}
	return !held, nil
}

// checkLiveBytes is checkLiveLimit's byte bound alone, for a frame whose
// new run is in flight already: the table does not hold the run yet, so
// the frame's whole line is counted, beside the frame in flight's (which
// it will replace: a refusal comes early rather than late).
func (m *Manager) checkLiveBytes(pendingBytes, lineBytes int64) error {
	size := m.table.Sizes().RunBytes
	if size+pendingBytes+lineBytes > m.cfg.MaxLiveWorkloadBytes {
		return &ingress.AtLimitError{Bound: statetable.LimitBytes, Limit: m.cfg.MaxLiveWorkloadBytes, Held: size, After: m.cfg.ResyncInterval}
	}
	return nil
}

// Ingest is the ingress's way into the relay (ingress.Relay): a
// producer's frame and its Workload-Lease header's values.
func (m *Manager) Ingest(body []byte, lease []string) (ingress.Frame, error) {
	f, err := m.ingestLocalLeased(body, lease)
	return ingress.Frame{Method: f.method, WorkloadID: f.workloadID()}, err
}

// ingestLocalLeased takes a producer's frame and its Workload-Lease
// header's values (lease.go; a bad one is the producer's mistake, refused
// before anything is written): validate; then, under ingestMu,
// take its place in the broker order; then, with ingestMu released, wait
// until it is written up to the broker and committed to the state table
// after the write, in the broker order (ingressorder.go). A failed broker
// write leaves nothing committed, so peers never
// show a workload the origin broker does not hold and the producer can
// retry; so does a frame the broker writer refuses as over the line limit,
// which is returned as it is. ingestMu keeps concurrent posts for one
// workload in one order at the broker and in the state table. A post
// waiting for ingestMu or for its write waits on the broker as surely as
// the one writing, so the slot that bounds the ingress's waiters is taken
// before ingestMu, and a post that finds none is refused with
// *brokerio.BusyError before it waits for anything.
func (m *Manager) ingestLocalLeased(body []byte, lease []string) (localFrame, error) {
	fr, err := wireframe.ParseIngressAs(body, m.cfg.NodeID, m.cfg.NodeIDAliases, m.cfg.WorkloadMaxBytes)
	f := localFrame{method: fr.Method, params: fr.Params, life: fr.Life, removal: fr.Removal}
	m.refusedOverBound(err, "ingress")
	if m.refusedOverWorkloadBound(err, "ingress") {
		return f, err // 413 (refusalOf)
	}
	if err != nil {
		return f, fmt.Errorf("%w: %v", ingress.ErrBadFrame, err)
	}
	if f.leaseSeconds, err = parseLeaseHeader(lease, &f); err != nil {
		m.leases.refused.Add(1)
		return f, fmt.Errorf("%w: %v", ingress.ErrBadFrame, err)
	}
	if err := m.journal.refuseWhileDown(); err != nil {
		return f, err // 503 (refusalOf)
	}
	if !m.ingressWaiters.Acquire(nil) {
		return f, m.ingressWaiters.Busy()
	}
	m.framesReceived.Inc("ingress", f.method)
	// Both lines are built before ingestMu: only the frame's place in the
	// order is decided under it.
	line, peerLine := ingressLine(&f, m.marker, m.cfg.BrokerLineMax), tableLine(&f)
	turn, err := m.enterIngress(f, line, peerLine)
	if err == nil {
		err = turn.written()
	}
	// The slot bounds the requests waiting on the broker (0049): once the
	// frame is written, its wait for the journal's fsync is not one, and
	// holding the slot through it would cap the frames of one group at the
	// bound. The requests waiting on the journal are bounded by the
	// ingress's connections.
	m.ingressWaiters.Release()
	if err != nil {
		if turn.c != nil {
			turn.release()
		}
		return f, err
	}
	err = turn.durable()
	turn.release()
	return f, err
}
