package httpguard

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/promtext"
)

// Connection caps (spec 3.7). Every listener of the daemon
// holds at most a fixed number of connections, so that all of them together
// stay far below the process's descriptor limit whatever a client does; the
// peer port also caps each source address, so one host cannot take the
// slots of the others.
//
// A connection over a cap is closed at once, before anything is read from
// it, with one exception that keeps a flood from locking out real clients:
// when the listener is full, a connection without a request in progress
// (new and not yet past its headers, or idle between requests) is closed
// to make room, as a server with a fixed pool of connection slots reclaims
// keep-alive connections under load: the longest-waiting one of the source
// holding the most connections (roomVictimLocked). A
// client that holds connections open without using them therefore holds
// them only until newer clients need the room; a client whose requests are
// in progress keeps its connections.
//
// A connection must also start its first request within connFirstRequest
// of being accepted, TLS handshake included: a client that never completes
// the handshake, or never sends a request, is closed then, well before the
// idle timeout would. The clock runs from the accept, on the server's own
// time, so it also counts how long the server took to get to the
// connection: it bounds a silent client, not a loaded host.

// Defaults, sized for a small cluster: a few dozen peers need a few
// connections each (two lanes each way), local producers a handful. The
// three listeners together hold at most 1,600 descriptors, well within the
// hard descriptor limit the Go runtime raises the daemon's soft limit to
// at startup (4,096 on a stock Linux, far more under systemd), with room
// for the peer clients, the pins and the pipes.
const (
	DefaultPeerMaxConns          = 1024
	DefaultPeerMaxConnsPerSource = 64
	DefaultIngressMaxConns       = 512
	DefaultMetricsMaxConns       = 64
	// connFirstRequest bounds the handshake plus the first request's
	// headers. On an idle LAN or loopback both take milliseconds, but a
	// burst of handshakes on a loaded host shares its CPU and they all end
	// late together: 128 at once on two cores at load 15 ended 2.5 to
	// 3.4 s after their accepts, and a 3 s bound closed the connections of
	// pinned peers just after their handshakes, before their first request
	// ("server closed idle connection", EOF, a broken pipe: never an
	// answer). The bound is therefore the whole-request read timeout,
	// ServerReadTimeout: net/http's own handshake and header deadlines
	// (5 s each) still apply within it, and at the cap a connection that
	// has started nothing is closed for room long before it.
	connFirstRequest = ServerReadTimeout
)

// ConnLimits are the listeners' connection caps (Config.Conns); a zero
// field takes its default.
type ConnLimits struct {
	Peer, PeerPerSource, Ingress, Metrics int
}

// maxConnCap bounds every connection flag, a sanity check on a typo: far
// beyond what any listener of a small cluster needs.
const maxConnCap = 1 << 20

// CheckConnLimits refuses a connection flag out of range, in one line that
// names the flag.
func CheckConnLimits(c ConnLimits) error {
	for _, f := range []struct {
		name string
		v    int
	}{{"--peer-max-conns", c.Peer}, {"--peer-max-conns-per-source", c.PeerPerSource}, {"--ingress-max-conns", c.Ingress}, {"--metrics-max-conns", c.Metrics}} {
		if f.v < 1 || f.v > maxConnCap {
			return fmt.Errorf("%s %d: must be between 1 and %d", f.name, f.v, maxConnCap)
		}
	}
	return nil
}

// ListenerLimits are the Manager's three limiters.
type ListenerLimits struct {
	Peer, Ingress, Metrics *ConnLimiter
}

// NewListenerLimits returns the limiters of the three listeners, a zero
// cap in c taking its default. A per-source refusal is logged to log, at
// most once per SourceLogInterval and source.
func NewListenerLimits(c ConnLimits, log *slog.Logger) ListenerLimits {
	orDefault := func(v, d int) int {
		if v <= 0 {
			return d
		}
		return v
	}
	return ListenerLimits{
		Peer:    newConnLimiter("peer", orDefault(c.Peer, DefaultPeerMaxConns), orDefault(c.PeerPerSource, DefaultPeerMaxConnsPerSource)).logTo(log),
		Ingress: newConnLimiter("ingress", orDefault(c.Ingress, DefaultIngressMaxConns), 0),
		Metrics: newConnLimiter("metrics", orDefault(c.Metrics, DefaultMetricsMaxConns), 0),
	}
}

// WriteMetrics renders the connection caps and what they refused.
func (ls ListenerLimits) WriteMetrics(t *promtext.Text) {
	all := []*ConnLimiter{ls.Peer, ls.Ingress, ls.Metrics}
	series := []struct {
		name, kind, help string
		get              func(*ConnLimiter) float64
	}{
		{"nvpair_wlm_connections_open", "gauge", "Connections a listener holds (peer, ingress, metrics).", func(l *ConnLimiter) float64 { return float64(l.OpenConns()) }},
		{"nvpair_wlm_connections_limit", "gauge", "The most connections a listener holds (--peer-max-conns, --ingress-max-conns, --metrics-max-conns).", func(l *ConnLimiter) float64 { return float64(l.max) }},
		{"nvpair_wlm_connections_per_source_limit", "gauge", "The most connections a listener holds from one source address (--peer-max-conns-per-source) per pinned member behind it; 0: no per-source cap.", func(l *ConnLimiter) float64 { return float64(l.perSource) }},
		{"nvpair_wlm_connections_per_source_limit_max", "gauge", "The highest per-source cap in force: --peer-max-conns-per-source times the most pinned members behind one address.", func(l *ConnLimiter) float64 { return float64(l.maxSourceCap()) }},
		{"nvpair_wlm_connections_closed_for_room_total", "counter", "Connections without a request in progress closed to make room for a new one at the cap.", func(l *ConnLimiter) float64 { return float64(l.evicted.Load()) }},
		{"nvpair_wlm_connections_unstarted_total", "counter", "Connections closed because no request started within 10 s of the accept (TLS handshake included).", func(l *ConnLimiter) float64 { return float64(l.unstarted.Load()) }},
	}
	for _, s := range series {
		t.Family(s.name, s.kind, s.help)
		for _, l := range all {
			t.Sample(s.name, []string{"listener"}, []string{l.name}, s.get(l))
		}
	}
	const refused = "nvpair_wlm_connections_refused_total"
	t.Family(refused, "counter", "Connections closed at the accept, before anything was read, by reason: full (the cap, with none to close for room) or per_source (the source's cap).")
	for _, l := range all {
		t.Sample(refused, []string{"listener", "reason"}, []string{l.name, "full"}, float64(l.refusedFull.Load()))
		t.Sample(refused, []string{"listener", "reason"}, []string{l.name, "per_source"}, float64(l.refusedSource.Load()))
	}
}

// ConnLimiter caps one listener's connections.
type ConnLimiter struct {
	name      string // the listener, as the metrics label it
	max       int
	perSource int // 0: no per-source cap (a loopback listener, where every client is one address)
	// FirstRequest is connFirstRequest; a test may change it before the
	// listener accepts its first connection.
	FirstRequest time.Duration

	// mu guards open, bySource and waiting. A leaf lock: connections are
	// closed after it is released.
	mu       sync.Mutex
	open     int
	bySource map[string]int // connections per source address; only sources with one
	// members are the pinned members behind each source address
	// (SetSourceMembers); a source's cap is perSource times their count.
	members map[string]int
	// waiting holds the connections without a request in progress, the one
	// that has waited longest at the front: the first to close for room. A
	// list threaded through the connections themselves: a keep-alive
	// connection joins it after every request, and a container/list
	// element there cost an allocation per request.
	waiting waitList

	refusedFull, refusedSource, evicted, unstarted atomic.Uint64

	// log and refusals write a per-source refusal, at most once per
	// SourceLogInterval and source; no line without log.
	log      *slog.Logger
	refusals *SourceLog
}

func newConnLimiter(name string, max, perSource int) *ConnLimiter {
	return &ConnLimiter{name: name, max: max, perSource: perSource, FirstRequest: connFirstRequest, bySource: map[string]int{}, refusals: NewSourceLog()}
}

func (l *ConnLimiter) logTo(log *slog.Logger) *ConnLimiter {
	l.log = log
	return l
}

// SetSourceMembers replaces the pinned members counted behind each source
// address (spec 3.7). Every peer of a cluster on one machine, or behind
// one NAT or proxy, connects from one address: a fixed cap per address
// refused the pinned peers themselves (1,367 handshakes at 80 members on
// one machine). So a source's cap is the flag times the members whose
// discovered address is that source, at least once: a source that fronts
// no member is held to the flag, and a flood from a member's address to
// the connections its members may hold. members is the daemon's, bounded
// by its targets; the limiter keeps it as given.
func (l *ConnLimiter) SetSourceMembers(members map[string]int) {
	l.mu.Lock()
	l.members = members
	l.mu.Unlock()
}

// sourceCapLocked is the most connections source may hold. Called with
// mu held.
func (l *ConnLimiter) sourceCapLocked(source string) int {
	return l.perSource * max(1, l.members[source])
}

// maxSourceCap is the highest per-source cap in force, for the metrics.
func (l *ConnLimiter) maxSourceCap() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	most := 1
	for _, n := range l.members {
		most = max(most, n)
	}
	return l.perSource * most
}

// refusedForSource counts and logs a connection refused over its source's
// cap.
func (l *ConnLimiter) refusedForSource(source string, limit int) {
	l.refusedSource.Add(1)
	if l.log == nil {
		return
	}
	l.refusals.LogKey(l.log, slog.LevelWarn, SourceLogKey{Source: source},
		"connection refused over its source's cap; peers behind an address discovery does not list (a NAT, a proxy) need --peer-max-conns-per-source raised",
		"listener", l.name, "source", source, "cap", limit)
}

// limitedConn is an admitted connection: it gives its slot back when it is
// closed, by the server, by its first-request timer, or for room.
type limitedConn struct {
	net.Conn
	lim     *ConnLimiter
	source  string
	started *time.Timer // closes the connection unless a request starts in time
	// Guarded by lim.mu: whether the connection still counts against the
	// caps, and its place in lim.waiting while no request is in progress.
	slotted bool
	wait    links[limitedConn]
}

func (c *limitedConn) listLinks() *links[limitedConn] { return &c.wait }

// waitList is ConnLimiter.waiting: the connections without a request in
// progress, oldest first. Guarded by ConnLimiter.mu.
type waitList = ilist[limitedConn, *limitedConn]

func (c *limitedConn) Close() error {
	c.started.Stop()
	c.lim.release(c)
	return c.Conn.Close()
}

// Listen wraps ln so that its connections are capped.
func (l *ConnLimiter) Listen(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, lim: l}
}

type limitListener struct {
	net.Listener
	lim *ConnLimiter
}

// Accept returns the next connection admitted under the caps; a refused
// one is closed at once and the listener goes on accepting.
func (ln *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := ln.lim.admit(c); lc != nil {
			return lc, nil
		}
	}
}

// admit takes c under the caps, making room by closing the longest-waiting
// connection when the listener is full, or closes c and returns nil.
func (l *ConnLimiter) admit(c net.Conn) *limitedConn {
	source := sourceOf(c.RemoteAddr())
	l.mu.Lock()
	if l.perSource > 0 {
		if limit := l.sourceCapLocked(source); l.bySource[source] >= limit {
			l.mu.Unlock()
			l.refusedForSource(source, limit)
			c.Close()
			return nil
		}
	}
	var victim *limitedConn
	if l.open >= l.max {
		front := l.waiting.front
		if front == nil {
			l.mu.Unlock()
			l.refusedFull.Add(1)
			c.Close()
			return nil
		}
		// The victim's slot is handed to c here, so a burst cannot
		// overshoot the cap while the victim's Close runs.
		victim = l.roomVictimLocked(front)
		l.dropLocked(victim)
	}
	lc := &limitedConn{Conn: c, lim: l, source: source, slotted: true}
	l.open++
	l.bySource[source]++
	l.waiting.pushBack(lc)
	lc.started = time.AfterFunc(l.FirstRequest, func() {
		// Not lc.Close: that would read lc.started, which this goroutine
		// has no ordering with.
		l.unstarted.Add(1)
		l.release(lc)
		lc.Conn.Close()
	})
	l.mu.Unlock()
	if victim != nil {
		l.evicted.Add(1)
		victim.Close()
	}
	return lc
}

// roomVictimLocked picks the connection to close for room: among the
// connections without a request in progress, the longest-waiting one of
// the source that holds the most connections. Taking the oldest alone let
// a few sources that reconnect as fast as they are closed (a client the
// peer port refuses comes straight back) churn the slots so quickly that
// a pinned peer's fresh connection, still in its handshake, was always the
// oldest and was closed before its first request. Taking from the largest
// holder first leaves a source with few connections its own until every
// larger one is down to its size. The walk is over at most the cap's
// connections and runs only at the cap. Called with mu held; front is
// l.waiting.front, not nil.
func (l *ConnLimiter) roomVictimLocked(front *limitedConn) *limitedConn {
	victim := front
	most := l.bySource[victim.source]
	for c := nextIn(front); c != nil; c = nextIn(c) {
		if n := l.bySource[c.source]; n > most {
			victim, most = c, n
		}
	}
	return victim
}

// release gives a closed connection's slot back, once.
func (l *ConnLimiter) release(c *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.slotted {
		l.dropLocked(c)
	}
}

// dropLocked takes c out of the counts and the waiting list. Called with
// mu held, for a connection that is slotted.
func (l *ConnLimiter) dropLocked(c *limitedConn) {
	c.slotted = false
	l.waiting.remove(c)
	l.open--
	if n := l.bySource[c.source] - 1; n > 0 {
		l.bySource[c.source] = n
	} else {
		delete(l.bySource, c.source)
	}
}

// ConnState is the server's http.Server.ConnState hook: a connection with
// a request in progress cannot be closed for room, and one that has
// started a request has met its first-request deadline.
func (l *ConnLimiter) ConnState(c net.Conn, state http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	switch state {
	case http.StateActive:
		lc.started.Stop()
		l.mu.Lock()
		l.waiting.remove(lc)
		l.mu.Unlock()
	case http.StateIdle:
		l.mu.Lock()
		if lc.slotted && !lc.wait.in {
			l.waiting.pushBack(lc)
		}
		l.mu.Unlock()
	}
}

// sourceOf is the address a connection comes from, without its port.
func sourceOf(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// OpenConns is the listener's connection count, for the metrics.
func (l *ConnLimiter) OpenConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}
