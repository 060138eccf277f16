package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/pairinstall"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/wireframe"
)

// Outbound delivery settings (contract section 7).
const (
	outboundQueueSize    = 1024
	peerQueueSize        = 1024
	peerAttemptTimeout   = 5 * time.Second
	peerAttempts         = 3
	peerRetryBaseDelay   = 250 * time.Millisecond
	peerDialTimeout      = 3 * time.Second
	peerMaxIdleConns     = 2
	dropLogInterval      = 10 * time.Second
	peerEventsPath       = "/v1/workloads/events"
	peerResponseDrainCap = 64 << 10
)

// peerClientIdleTimeout is shorter than the peer server's idle timeout, so
// the client always closes an idle connection before the server does and
// never sends a request onto a connection the server is closing.
const peerClientIdleTimeout = peerServerIdleTimeout / 2

// peerTarget is one cluster member that this node broadcasts to.
type peerTarget struct {
	hostUUID  string
	name      string
	principal string   // the clusterUuid whose pin the peer must present
	addrs     []string // host:port candidates, dialed in this order
}

// id names the target for the sender set: a change of address or principal
// is a new target with fresh connections.
func (t peerTarget) id() string {
	return t.hostUUID + "|" + t.principal + "|" + strings.Join(t.addrs, ",")
}

// outboundFrame is one local-origin frame on its way to the peers.
type outboundFrame struct {
	method   string
	line     []byte                // the JSON-RPC notification, the peer request body
	ref      wireframe.WorkloadRef // the workload it names, for the lanes' order (peerlanes.go)
	queuedAt time.Time             // set by enqueue, for the delivery latency
	recovery bool                  // sent from an overflow mark (overflow.go)
}

// broadcaster owns the outbound path: one ordered, bounded enqueue point, a
// dispatcher that copies each frame, in order, into every peer's own
// bounded queue, and one sender per peer that delivers its queue in order.
// A slow or dead peer therefore delays only its own queue.
type broadcaster struct {
	log   *slog.Logger
	trust *pairinstall.ClusterTrust
	// heartbeat is where each peer sender reads its passes, every interval.
	heartbeat heartbeatSource
	interval  time.Duration
	// queue is the single ordered enqueue point; only the dispatcher reads it.
	queue chan outboundFrame

	// mu guards closed, peers, stats and the send on queue. It is taken
	// under Manager.broadcastMu (enqueue) and is otherwise a leaf: nothing
	// is acquired while holding it, and no network I/O happens under it.
	mu     sync.Mutex
	closed bool
	peers  map[string]*peerSender
	stats  map[string]*peerStats // by principal; kept when a peer leaves

	// undispatched counts the frames enqueued and not yet offered to every
	// peer (see laneOrder.freshIdle).
	undispatched atomic.Int64

	// markLimit bounds each set of overflow marks, the enqueue point's and
	// every peer's: the re-sync set's own bound (--max-live-workloads),
	// set by setMarkLimit before the first target. marks are the workloads marked at the
	// enqueue point when it was full; enqueued and dispatched count the
	// frames put in queue and offered to the peers, so a mark is handed
	// to the peers once the frames enqueued before it have been offered
	// (overflow.go). The three are guarded by mu.
	markLimit            int
	marks                *overflowMarks
	enqueued, dispatched uint64

	// Counters for the metrics.
	queued, dropped, marked       atomic.Uint64 // at the enqueue point
	handshakes, handshakeFailures atomic.Uint64 // client side

	queueDrops   dropLogger
	queueMarks   overflowLog // its line when the enqueue point begins marking
	dispatchDone chan struct{}
	senders      sync.WaitGroup
}

func newBroadcaster(log *slog.Logger, trust *pairinstall.ClusterTrust, heartbeat heartbeatSource, interval time.Duration) *broadcaster {
	b := &broadcaster{
		log:          log,
		trust:        trust,
		heartbeat:    heartbeat,
		interval:     interval,
		queue:        make(chan outboundFrame, outboundQueueSize),
		peers:        map[string]*peerSender{},
		dispatchDone: make(chan struct{}),
		markLimit:    defaultMaxLiveWorkloads,
	}
	go b.dispatch()
	return b
}

// setMarkLimit sets the bound of the overflow marks (overflow.go); the
// Manager calls it before the first target.
func (b *broadcaster) setMarkLimit(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.markLimit = n
}

// enqueue queues a frame for every peer without blocking: when the queue is
// full the newest frame, this one, marks its workload for every peer
// instead, and its latest state follows on their heartbeat lanes
// (overflow.go).
func (b *broadcaster) enqueue(f outboundFrame) bool {
	b.reserve()
	return b.enqueueReserved(f)
}

// reserve counts a frame as undispatched before it is tracked, so that no
// heartbeat lane finds the fresh lanes idle between the frame's track and
// its enqueue (see laneOrder). Every reserve is followed by enqueueReserved
// or unreserve.
func (b *broadcaster) reserve() { b.undispatched.Add(1) }

// unreserve takes back the reservation of a frame that is not to be queued.
func (b *broadcaster) unreserve() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dispatchedLocked()
}

// dispatchedLocked counts one reserved frame out of undispatched and, when
// it was the last, wakes every heartbeat lane waiting for its fresh lane to
// go idle: their own fresh lanes may have settled while it was counted.
// Called with mu held.
func (b *broadcaster) dispatchedLocked() {
	if b.undispatched.Add(-1) == 0 {
		for _, s := range b.peers {
			s.lanes.wake()
		}
	}
}

// enqueueReserved is enqueue for a frame reserved by reserve.
func (b *broadcaster) enqueueReserved(f outboundFrame) bool {
	f.queuedAt = time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		b.dispatchedLocked()
		return false
	}
	if b.marks == nil || !b.marks.holds(f.ref) {
		select {
		case b.queue <- f:
			b.enqueued++
			b.queued.Add(1)
			return true
		default:
		}
	}
	// Full, or the workload is marked already: the frame does not go
	// through the queue, so no heartbeat lane waits for its dispatch.
	b.dispatchedLocked()
	if b.marks == nil {
		b.marks = newOverflowMarks(b.markLimit)
	}
	removal := f.method == wireframe.MethodRemove
	ok, began := b.marks.add(f.ref, removal, !removal, 1, b.enqueued, f.queuedAt)
	if !ok {
		b.dropped.Add(1)
		b.queueDrops.note(b.log, "outbound queue full and its overflow marks at their bound, dropping the newest frame", "method", f.method, "limit", b.markLimit)
		return false
	}
	b.marked.Add(1)
	if began {
		// Each peer's line counts these frames when its burst ends.
		b.queueMarks.began(b.log, "outbound queue full: marking workloads, each peer is sent their latest state on its heartbeat lane",
			"queue", outboundQueueSize, "limit", b.markLimit)
	}
	return true
}

// dispatch copies frames from the enqueue point to the peer queues, in
// order, and hands the workloads marked at the enqueue point to every peer
// once the frames enqueued before them have been offered.
func (b *broadcaster) dispatch() {
	defer close(b.dispatchDone)
	for f := range b.queue {
		b.dispatchOne(f)
	}
	b.mu.Lock()
	for more := true; more; {
		more = b.transferMarksLocked() // every frame is dispatched: all are due
	}
	for _, s := range b.peers {
		close(s.queue) // the sender delivers what is left, then exits
	}
	b.mu.Unlock()
}

// dispatchOne offers f to every peer, then hands on the marks now due.
func (b *broadcaster) dispatchOne(f outboundFrame) {
	b.mu.Lock()
	for _, s := range b.peers {
		s.offer(f)
	}
	b.dispatched++
	b.dispatchedLocked() // after every offer: see laneOrder.freshIdle
	more := b.transferMarksLocked()
	b.mu.Unlock()
	for more {
		b.mu.Lock()
		more = b.transferMarksLocked()
		b.mu.Unlock()
	}
}

// transferMarksLocked hands up to overflowTransferBudget due marks of the
// enqueue point to every peer, where each marks its workload as a frame
// that found that peer's queue full would; it reports whether more are
// due. Called with mu held.
func (b *broadcaster) transferMarksLocked() (more bool) {
	if b.marks == nil || b.marks.len() == 0 {
		return false
	}
	taken := b.marks.takeReady(b.dispatched, overflowTransferBudget)
	for _, m := range taken {
		for _, s := range b.peers {
			s.markOverflow(m.ref, m.removal, m.state, m.frames, m.at)
		}
	}
	b.marks.settle(len(taken), 0, 0, 0)
	return b.marks.front.Load() <= b.dispatched
}

// setTargets replaces the target set and returns what was added and removed.
// New targets get their own sender; removed ones have their queue abandoned
// and their connections closed.
func (b *broadcaster) setTargets(targets []peerTarget) (added, removed []peerTarget) {
	next := make(map[string]peerTarget, len(targets))
	for _, t := range targets {
		next[t.id()] = t
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil
	}
	for id, s := range b.peers {
		if _, keep := next[id]; !keep {
			delete(b.peers, id)
			s.stop()
			removed = append(removed, s.target)
		}
	}
	for id, t := range next {
		if _, have := b.peers[id]; !have {
			st := b.stats[t.principal]
			if st == nil {
				st = &peerStats{peer: t.principal, latency: promtext.NewHistogram()}
				if b.stats == nil {
					b.stats = map[string]*peerStats{}
				}
				b.stats[t.principal] = st
			}
			hb := newHeartbeatStream(b.heartbeat, b.interval, st)
			hb.begin(time.Now()) // the backfill: see heartbeatStream.begin
			s := newPeerSender(t, st, b.dialTLS(t), hb, newLaneOrder(&b.undispatched, newOverflowMarks(b.markLimit)), b.log)
			b.peers[id] = s
			b.senders.Add(1)
			go func() {
				defer b.senders.Done()
				s.run()
			}()
			added = append(added, t)
		}
	}
	return added, removed
}

// peerStatsSnapshot returns every peer's delivery counters, sorted by peer.
func (b *broadcaster) peerStatsSnapshot() []*peerStats {
	b.mu.Lock()
	out := make([]*peerStats, 0, len(b.stats))
	for _, s := range b.stats {
		out = append(out, s)
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(x, y *peerStats) int { return strings.Compare(x.peer, y.peer) })
	return out
}

// dialTLS dials a target and completes the handshake against its pin,
// counting handshakes and their failures.
func (b *broadcaster) dialTLS(t peerTarget) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dial := dialInOrder(t.addrs)
	cfg := b.trust.ClientTLSConfig(t.principal, httpguard.PeerALPN)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := tls.Client(raw, cfg)
		if err := c.HandshakeContext(ctx); err != nil {
			raw.Close()
			b.handshakeFailures.Add(1)
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		b.handshakes.Add(1)
		return c, nil
	}
}

// targetCount returns the number of current targets.
func (b *broadcaster) targetCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.peers)
}

// targetHosts returns the hostUuids of the current targets: the nodes this
// node delivers to (GET /v1/node). O(targets) under mu, a leaf.
func (b *broadcaster) targetHosts() map[string]struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]struct{}, len(b.peers))
	for _, s := range b.peers {
		out[s.target.hostUUID] = struct{}{}
	}
	return out
}

// close stops the enqueue point and gives the peer queues up to drain to
// deliver what they hold; whatever is still undelivered then is abandoned.
func (b *broadcaster) close(drain time.Duration) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.queue)
	b.mu.Unlock()

	<-b.dispatchDone
	done := make(chan struct{})
	go func() { b.senders.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(drain):
	}
	b.mu.Lock()
	pending := 0
	for _, s := range b.peers {
		pending += len(s.queue) + s.lanes.marks.len()
		s.stop()
	}
	b.mu.Unlock()
	b.log.Warn("shutdown: peer queues not drained in time", "abandoned", pending, "drain", drain)
	<-done
}

// dropLogger logs the first drop and then at most one summary per
// dropLogInterval, so a full queue cannot flood the log.
type dropLogger struct {
	mu      sync.Mutex // guards last and pending; a leaf lock
	last    time.Time
	pending int
	total   atomic.Int64
}

func (d *dropLogger) note(log *slog.Logger, msg string, args ...any) {
	d.noteCounted(log, "dropped", msg, args...)
}

// noteCounted is note with the count logged under countKey, for events
// that are not drops.
func (d *dropLogger) noteCounted(log *slog.Logger, countKey, msg string, args ...any) {
	d.total.Add(1)
	d.mu.Lock()
	d.pending++
	if time.Since(d.last) < dropLogInterval {
		d.mu.Unlock()
		return
	}
	n := d.pending
	d.pending, d.last = 0, time.Now()
	d.mu.Unlock()
	log.Warn(msg, append(args, countKey, n)...)
}

// peerQueueDepths returns, by peer principal, the fresh frames waiting in
// that peer's queue for its fresh lane (at most peerQueueSize each). A
// peer that left the target set has no queue and is not in the map.
// It takes broadcaster.mu for a length per peer, no more.
func (b *broadcaster) peerQueueDepths() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int, len(b.peers))
	for _, s := range b.peers {
		out[s.target.principal] += len(s.queue)
	}
	return out
}

// peerQueueBytes returns, by peer principal, the bytes of the fresh frames
// waiting in that peer's queue (at most peerQueueMaxBytes each, beside
// peerQueueSize frames). Like peerQueueDepths, it takes broadcaster.mu
// for one load per peer.
func (b *broadcaster) peerQueueBytes() map[string]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int64, len(b.peers))
	for _, s := range b.peers {
		out[s.target.principal] += s.queueBytes.Load()
	}
	return out
}

// peerOverflowWorkloads returns, by peer principal, the workloads marked
// for that peer and not yet taken by its heartbeat lane (overflow.go). It
// takes broadcaster.mu for an atomic load per peer, no more.
func (b *broadcaster) peerOverflowWorkloads() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int, len(b.peers))
	for _, s := range b.peers {
		out[s.target.principal] += s.lanes.marks.len()
	}
	return out
}
