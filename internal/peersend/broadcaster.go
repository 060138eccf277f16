package peersend

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/clustertrust"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/promtext"
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

// Target is one cluster member that this node broadcasts to.
type Target struct {
	HostUUID  string
	Name      string
	Principal string   // the clusterUuid whose pin the peer must present
	Addrs     []string // host:port candidates, dialed in this order
}

// ID names the target for the sender set: a change of address or principal
// is a new target with fresh connections.
func (t Target) ID() string {
	return t.HostUUID + "|" + t.Principal + "|" + strings.Join(t.Addrs, ",")
}

// MemberID names the target's member in the state table: its node and the
// principal it is pinned under. An address change keeps the member (and
// its mark); a new principal is a new member, sent the whole table.
func (t Target) MemberID() string { return t.HostUUID + "|" + t.Principal }

// Broadcaster owns the outbound path: one sender per target, each reading
// the state table from its member's mark (sender.go). There is no
// queue between the table and a peer: what a peer has not taken is what
// lies above its mark, so a slow or dead peer delays only itself, and
// holds nothing but its mark.
type Broadcaster struct {
	log      *slog.Logger
	trust    *clustertrust.ClusterTrust
	table    *statetable.Table
	interval time.Duration

	// mu guards closed, peers and stats. It is not a leaf: the table's
	// lock is taken under it (Join, Leave), never the other way; nothing
	// else is, and no network I/O happens under it.
	mu     sync.Mutex
	closed bool
	peers  map[string]*peerSender
	stats  map[string]*Stats // by principal; kept when a peer leaves

	// draining is closed at shutdown: a sender that has caught up then
	// stops (close).
	draining chan struct{}

	// rnd draws the senders' random offsets (jitter.go); dials holds the
	// connection attempts in flight to DefaultDialsInFlight (dialpace.go).
	rnd   randN
	dials *dialGate

	// Counters for the metrics.
	Handshakes, HandshakeFailures atomic.Uint64 // client side

	senders sync.WaitGroup
}

func New(log *slog.Logger, trust *clustertrust.ClusterTrust, table *statetable.Table, interval time.Duration) *Broadcaster {
	return &Broadcaster{
		log:      log,
		trust:    trust,
		table:    table,
		interval: interval,
		peers:    map[string]*peerSender{},
		draining: make(chan struct{}),
		rnd:      defaultRand,
		dials:    newDialGate(DefaultDialsInFlight),
	}
}

// SetTargets replaces the target set and returns what was added and removed.
// A new target joins the table as a member (a node new to it is sent the
// whole table, one that returns what changed since its mark) and gets its
// own sender; a removed one leaves, keeping its claim on the ends it has
// not taken, and its connections are closed.
func (b *Broadcaster) SetTargets(targets []Target) (added, removed []Target) {
	next := make(map[string]Target, len(targets))
	members := make(map[string]bool, len(targets))
	for _, t := range targets {
		// One sender per member: two targets for one node and principal
		// (a snapshot that lists a node twice) would share its mark.
		if members[t.MemberID()] {
			continue
		}
		members[t.MemberID()] = true
		next[t.ID()] = t
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
	fresh := 0
	for id := range next {
		if _, have := b.peers[id]; !have {
			fresh++
		}
	}
	for id, t := range next {
		if _, have := b.peers[id]; !have {
			b.startSenderLocked(id, t, b.rnd.within(firstDialSpread(fresh)))
			added = append(added, t)
		}
	}
	return added, removed
}

// startSenderLocked starts t's sender, its first request after firstDial
// (dialpace.go).
func (b *Broadcaster) startSenderLocked(id string, t Target, firstDial time.Duration) {
	st := b.stats[t.Principal]
	if st == nil {
		st = &Stats{Peer: t.Principal}
		if b.stats == nil {
			b.stats = map[string]*Stats{}
		}
		b.stats[t.Principal] = st
	}
	m := b.table.Join(t.MemberID())
	// The same node and principal under another hostUuid (a discovery
	// flap): the member it left behind is forgotten, so flaps do not
	// grow the members that left.
	b.table.ForgetGone(func(id string) bool { return id != m.ID() && strings.HasSuffix(id, "|"+t.Principal) })
	mark, restate := b.table.Restate(m)
	s := newPeerSender(t, st, b.dialTLS(t), b.table, m, mark, restate, b.interval, b.draining, b.log, b.rnd)
	s.firstDial = firstDial
	b.peers[id] = s
	b.senders.Go(s.run)
}

// StatsSnapshot returns every peer's delivery counters, sorted by peer.
func (b *Broadcaster) StatsSnapshot() []*Stats {
	b.mu.Lock()
	out := make([]*Stats, 0, len(b.stats))
	for _, s := range b.stats {
		out = append(out, s)
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(x, y *Stats) int { return strings.Compare(x.Peer, y.Peer) })
	return out
}

// dialTLS dials a target and completes the handshake against its pin, in
// one of the node's connection attempts in flight (dialpace.go), counting
// handshakes and their failures.
func (b *Broadcaster) dialTLS(t Target) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dial := dialInOrder(t.Addrs)
	cfg := b.trust.ClientTLSConfig(t.Principal, httpguard.PeerALPN)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return b.dials.dial(ctx, func(ctx context.Context) (net.Conn, error) {
			raw, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			c := tls.Client(raw, cfg)
			if err := c.HandshakeContext(ctx); err != nil {
				raw.Close()
				b.HandshakeFailures.Add(1)
				return nil, fmt.Errorf("TLS handshake: %w", err)
			}
			b.Handshakes.Add(1)
			return c, nil
		})
	}
}

// TargetCount returns the number of current targets.
func (b *Broadcaster) TargetCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.peers)
}

// TargetHosts returns the host UUIDs of the current targets: the nodes
// this node delivers to (GET /v1/node). O(targets) under mu.
func (b *Broadcaster) TargetHosts() map[string]struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]struct{}, len(b.peers))
	for _, s := range b.peers {
		out[s.target.HostUUID] = struct{}{}
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
func (b *Broadcaster) peerBehind() map[string]peerLag {
	b.mu.Lock()
	defer b.mu.Unlock()
	v := b.table.Version()
	out := make(map[string]peerLag, len(b.peers))
	for _, s := range b.peers {
		l := out[s.target.Principal]
		if mark, ok := b.table.MemberMark(s.member.ID()); ok && v > mark {
			l.versions += v - mark
		}
		l.lag = max(l.lag, b.table.Lag(s.member))
		out[s.target.Principal] = l
	}
	return out
}

// Close stops taking targets and gives the senders up to drain to catch
// their peers up; whatever is still untaken then stays above their marks,
// in the journal where it must be, for the next start.
func (b *Broadcaster) Close(drain time.Duration) {
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

// WriteMetrics renders the senders' metrics, one series per peer principal:
// deliveries, heartbeat passes, Retry-After waits and how far each peer is
// behind the table.
func (b *Broadcaster) WriteMetrics(t *promtext.Text) {
	stats := b.StatsSnapshot()
	perPeer := []struct {
		name, kind, help string
		get              func(*Stats) uint64
	}{
		{"nvpair_wlm_peer_deliveries_succeeded_total", "counter", "Entries of the state table a peer took (its mark moved past them).", func(s *Stats) uint64 { return s.Succeeded.Load() }},
		{"nvpair_wlm_peer_delivery_failures_total", "counter", "Failed delivery attempts to a peer.", func(s *Stats) uint64 { return s.FailedAttempts.Load() }},
		{"nvpair_wlm_peer_delivery_retries_total", "counter", "Delivery attempts to a peer that were retries.", func(s *Stats) uint64 { return s.Retries.Load() }},
		{"nvpair_wlm_peer_deliveries_dropped_total", "counter", "Entries a peer refused for good (a 4xx a retry cannot change); skipped for that peer.", func(s *Stats) uint64 { return s.Dropped.Load() }},
		{"nvpair_wlm_peer_deliveries_skipped_total", "counter", "Entries a peer failed (5xx, timeout) FrameMaxTries times in a row while it took the entry behind them; skipped for that peer, re-asserted by its heartbeat while live.", func(s *Stats) uint64 { return s.Skipped.Load() }},
		{"nvpair_wlm_peer_batches_sent_total", "counter", "Batch requests sent to a peer that advertised batches.", func(s *Stats) uint64 { return s.BatchesSent.Load() }},
		{"nvpair_wlm_peer_batch_frames_sent_total", "counter", "Frames sent to a peer inside batches (fresh frames and re-assertions).", func(s *Stats) uint64 { return s.BatchFramesSent.Load() }},
		{"nvpair_wlm_heartbeat_passes_started_total", "counter", "Heartbeat passes over the re-asserted runs started for a peer.", func(s *Stats) uint64 { return s.PassesStarted.Load() }},
		{"nvpair_wlm_heartbeat_passes_completed_total", "counter", "Heartbeat passes that reached the end of the re-asserted runs for a peer.", func(s *Stats) uint64 { return s.PassesCompleted.Load() }},
		{"nvpair_wlm_heartbeat_passes_overrun_total", "counter", "Heartbeat passes for a peer that took longer than the re-sync interval.", func(s *Stats) uint64 { return s.PassesOverrun.Load() }},
		{"nvpair_wlm_heartbeat_passes_abandoned_total", "counter", "Heartbeat passes for a peer ended early because it failed a re-assertion; the next pass repeats them.", func(s *Stats) uint64 { return s.PassesAbandoned.Load() }},
		{"nvpair_wlm_heartbeat_reasserted_total", "counter", "Re-assertions delivered to a peer.", func(s *Stats) uint64 { return s.Reasserted.Load() }},
		{"nvpair_wlm_heartbeat_reassert_failures_total", "counter", "Re-assertions a peer did not accept; the next pass repeats them.", func(s *Stats) uint64 { return s.ReassertFailures.Load() }},
		{"nvpair_wlm_heartbeat_pass_progress_entries", "gauge", "Entries the heartbeat pass under way (or the last one) has visited for a peer.", func(s *Stats) uint64 { return s.PassProgress.Load() }},
		{"nvpair_wlm_heartbeat_pass_size_entries", "gauge", "Runs re-asserted when a peer's current (or last) heartbeat pass started.", func(s *Stats) uint64 { return s.PassSize.Load() }},
	}
	for _, f := range perPeer {
		t.Family(f.name, f.kind, f.help)
		for _, s := range stats {
			t.Sample(f.name, []string{"peer"}, []string{s.Peer}, float64(f.get(s)))
		}
	}
	writeRetryAfterMetrics(t, stats)
	b.dials.writeMetrics(t)
	behind := b.peerBehind()
	t.Family("nvpair_wlm_peer_behind_versions", "gauge", "Versions the state table has given past a peer's mark: at most the entries it has yet to take; 0 for a caught-up peer or one that left.")
	for _, s := range stats {
		t.Sample("nvpair_wlm_peer_behind_versions", []string{"peer"}, []string{s.Peer}, float64(behind[s.Peer].versions))
	}
	t.Family("nvpair_wlm_peer_behind_seconds", "gauge", "How long a peer has lacked a change of the state table: the age of the oldest entry above its mark; 0 for a caught-up peer or one that left.")
	for _, s := range stats {
		t.Sample("nvpair_wlm_peer_behind_seconds", []string{"peer"}, []string{s.Peer}, behind[s.Peer].lag.Seconds())
	}

}

// SourceMembers counts the targets behind each IP address they were
// discovered at, for the peer port's per-source cap
// (httpguard.ConnLimiter.SetSourceMembers): a peer connects from the
// address it is reached at unless a NAT or proxy lies between. A target
// counts once per distinct address; an address given as a name is not
// resolved (discovery gives addresses, and a lookup here would put DNS on
// the snapshot's path) and counts nowhere. O(targets' addresses).
func SourceMembers(targets []Target) map[string]int {
	out := make(map[string]int)
	for _, t := range targets {
		seen := make(map[string]bool, len(t.Addrs))
		for _, a := range t.Addrs {
			ip, ok := addrIP(a)
			if ok && !seen[ip] {
				seen[ip] = true
				out[ip]++
			}
		}
	}
	return out
}

// addrIP is a host:port's IP as a connection from it names its source
// (no zone, an IPv4-mapped address unmapped), or false for a name.
func addrIP(hostport string) (string, bool) {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "", false
	}
	return ip.WithZone("").Unmap().String(), true
}
