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
	"nvpair-workload-manager/internal/statetable"
)

// Outbound delivery settings (spec.md section 4).
const (
	peerAttemptTimeout   = 5 * time.Second
	peerRetryBaseDelay   = 250 * time.Millisecond
	peerRetryMaxDelay    = 30 * time.Second
	peerDialTimeout      = 3 * time.Second
	peerMaxIdleConns     = 2
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

// memberID names the target's member in the state table: its node and the
// principal it is pinned under. An address change keeps the member (and
// its mark); a new principal is a new member, sent the whole table.
func (t peerTarget) memberID() string { return t.hostUUID + "|" + t.principal }

// broadcaster owns the outbound path: one sender per target, each reading
// the state table from its member's mark (peersender.go). There is no
// queue between the table and a peer: what a peer has not taken is what
// lies above its mark, so a slow or dead peer delays only itself, and
// holds nothing but its mark.
type broadcaster struct {
	log      *slog.Logger
	trust    *pairinstall.ClusterTrust
	table    *statetable.Table
	interval time.Duration

	// mu guards closed, peers and stats. It is a leaf: nothing is acquired
	// while holding it but the table's lock (Join, Leave), and no network
	// I/O happens under it.
	mu     sync.Mutex
	closed bool
	peers  map[string]*peerSender
	stats  map[string]*peerStats // by principal; kept when a peer leaves

	// draining is closed at shutdown: a sender that has caught up then
	// stops (close).
	draining chan struct{}

	// Counters for the metrics.
	handshakes, handshakeFailures atomic.Uint64 // client side

	senders sync.WaitGroup
}

func newBroadcaster(log *slog.Logger, trust *pairinstall.ClusterTrust, table *statetable.Table, interval time.Duration) *broadcaster {
	return &broadcaster{
		log:      log,
		trust:    trust,
		table:    table,
		interval: interval,
		peers:    map[string]*peerSender{},
		draining: make(chan struct{}),
	}
}

// setTargets replaces the target set and returns what was added and removed.
// A new target joins the table as a member (a node new to it is sent the
// whole table, one that returns what changed since its mark) and gets its
// own sender; a removed one leaves, keeping its claim on the ends it has
// not taken, and its connections are closed.
func (b *broadcaster) setTargets(targets []peerTarget) (added, removed []peerTarget) {
	next := make(map[string]peerTarget, len(targets))
	members := make(map[string]bool, len(targets))
	for _, t := range targets {
		// One sender per member: two targets for one node and principal
		// (a snapshot that lists a node twice) would share its mark.
		if members[t.memberID()] {
			continue
		}
		members[t.memberID()] = true
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
			b.table.Leave(s.member)
			removed = append(removed, s.target)
		}
	}
	for id, t := range next {
		if _, have := b.peers[id]; !have {
			b.startSenderLocked(id, t)
			added = append(added, t)
		}
	}
	return added, removed
}

func (b *broadcaster) startSenderLocked(id string, t peerTarget) {
	st := b.stats[t.principal]
	if st == nil {
		st = &peerStats{peer: t.principal}
		if b.stats == nil {
			b.stats = map[string]*peerStats{}
		}
		b.stats[t.principal] = st
	}
	s := newPeerSender(t, st, b.dialTLS(t), b.table, b.table.Join(t.memberID()), b.interval, b.draining, b.log)
	b.peers[id] = s
	b.senders.Go(s.run)
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

// peerLag is one peer's distance from the table: the versions given past
// its mark (at most the entries it has yet to take) and how long it has
// lacked the oldest of them.
type peerLag struct {
	versions uint64
	lag      time.Duration
}

// peerBehind returns, by peer principal, how far each peer is behind the
// table. O(targets).
func (b *broadcaster) peerBehind() map[string]peerLag {
	b.mu.Lock()
	defer b.mu.Unlock()
	v := b.table.Version()
	out := make(map[string]peerLag, len(b.peers))
	for _, s := range b.peers {
		l := out[s.target.principal]
		if mark, ok := b.table.MemberMark(s.member.ID()); ok && v > mark {
			l.versions += v - mark
		}
		l.lag = max(l.lag, b.table.Lag(s.member))
		out[s.target.principal] = l
	}
	return out
}

// close stops taking targets and gives the senders up to drain to catch
// their peers up; whatever is still untaken then stays above their marks,
// in the journal where it must be, for the next start.
func (b *broadcaster) close(drain time.Duration) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.draining)
	b.mu.Unlock()

	done := make(chan struct{})
	go func() { b.senders.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(drain):
	}
	b.mu.Lock()
	behind := 0
	for _, s := range b.peers {
		if b.table.Behind(s.member) {
			behind++
		}
		s.stop()
	}
	b.mu.Unlock()
	b.log.Warn("shutdown: peers not caught up in time; what they lack stays owed to them", "peers", behind, "drain", drain)
	<-done
}
