package main

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"
)

// linkNet carries the inter-node traffic of a --chaos run to and from the
// nodes the faults fall on: one loopback TCP relay per ordered pair of
// nodes (from, to) with either end faulted, whose port is what from's
// discovery snapshot lists for to (cluster.directoryFor); the other pairs
// talk directly. The relay copies bytes, TLS and all, so the daemons'
// pinned mTLS runs end to end through it; it lets the dev cluster cut a
// faulted node off (every link from or to it refuses and drops its
// connections) and slow a faulted node's answers (the bytes it sends back
// on every link to it are held a while) without touching a daemon.
// Relaying only the faulted nodes' links keeps the relays' descriptors
// linear in the nodes: every pair relayed cost about 5 a pair, 81,600 at
// 128 nodes, past the descriptor limit of a typical machine.
type linkNet struct {
	c *cluster

	mu    sync.Mutex // guards the fields below; a leaf lock
	links map[[2]*node]*link
	cut   map[*node]bool
	slow  map[*node]time.Duration
}

type link struct {
	from, to *node
	ln       net.Listener
	conns    map[net.Conn]bool // both ends of every relayed connection; guarded by linkNet.mu
}

// chaosFaulted is how many nodes a --chaos run relays: the cut and the
// slowed one (planChaos).
const chaosFaulted = 2

// chaosFDsNeeded is what a --chaos run of n nodes holds in this process at
// most: a relay's listener per ordered pair with a faulted end, both ends
// of each relayed connection (a sender holds up to two per peer: its fresh
// frames' and its heartbeat's), and the brokers' pipes and processes
// (fdsNeeded's share): about 3,300 at 128 nodes.
func chaosFDsNeeded(n int) uint64 {
	pairs := uint64(chaosFaulted) * 2 * uint64(n-1)
	return pairs*(1+2*2) + fdsNeeded(n)
}

// checkChaosFDs refuses a --chaos run that would run out of file
// descriptors midway (the relays' accepts and the producer's dials fail
// with "too many open files", and the run cannot converge for a reason
// that is not the daemons'). known is false where the limit is not
// knowable: the run goes ahead.
func checkChaosFDs(n int, limit uint64, known bool) error {
	if !known || limit >= chaosFDsNeeded(n) {
		return nil
	}
	return fmt.Errorf("--chaos with --nodes %d needs %d file descriptors (a relay per ordered pair of nodes), the limit is %d: raise it (ulimit -n) or run fewer nodes", n, chaosFDsNeeded(n), limit)
}

// newLinkNet opens a relay for every ordered pair of c's nodes with an
// end in faulted: the nodes setCut and setSlow may name.
func newLinkNet(c *cluster, faulted ...*node) (*linkNet, error) {
	l := &linkNet{c: c, links: map[[2]*node]*link{}, cut: map[*node]bool{}, slow: map[*node]time.Duration{}}
	for _, from := range c.nodes {
		for _, to := range c.nodes {
			if from == to || !slices.Contains(faulted, from) && !slices.Contains(faulted, to) {
				continue
			}
			if l.links[[2]*node{from, to}] != nil {
				continue // both ends faulted, or a node named twice
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				l.close()
				return nil, fmt.Errorf("chaos link %s->%s: %w", from.name, to.name, err)
			}
			k := &link{from: from, to: to, ln: ln, conns: map[net.Conn]bool{}}
			l.links[[2]*node{from, to}] = k
			go l.serve(k)
		}
	}
	return l, nil
}

// port is the port from dials to reach to: its relay's, or direct, to's
// own peer port, for a pair with neither end faulted.
func (l *linkNet) port(from, to *node, direct int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k := l.links[[2]*node{from, to}]; k != nil {
		return k.ln.Addr().(*net.TCPAddr).Port
	}
	return direct
}

func (l *linkNet) serve(k *link) {
	for {
		in, err := k.ln.Accept()
		if err != nil {
			return // closed
		}
		go l.relay(k, in)
	}
}

// relay carries one connection of link k to its node's daemon, unless
// either end is cut off.
func (l *linkNet) relay(k *link, in net.Conn) {
	l.mu.Lock()
	blocked := l.cut[k.from] || l.cut[k.to]
	l.mu.Unlock()
	if blocked {
		in.Close()
		return
	}
	out, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(k.to.peerPort())), 5*time.Second)
	if err != nil {
		in.Close()
		return
	}
	l.mu.Lock()
	if l.cut[k.from] || l.cut[k.to] {
		l.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	k.conns[in], k.conns[out] = true, true
	l.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { io.Copy(out, in); done <- struct{}{} }()
	go func() { l.copyAnswers(in, out, k.to); done <- struct{}{} }()
	<-done
	in.Close()
	out.Close()
	<-done
	l.mu.Lock()
	delete(k.conns, in)
	delete(k.conns, out)
	l.mu.Unlock()
}

// copyAnswers copies what node to sends back, holding each chunk while to
// is slowed.
func (l *linkNet) copyAnswers(dst io.Writer, src io.Reader, to *node) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.mu.Lock()
			d := l.slow[to]
			l.mu.Unlock()
			if d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// setCut cuts n off (every link from or to it drops its connections and
// refuses new ones) or brings it back.
func (l *linkNet) setCut(n *node, cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut[n] = cut
	if !cut {
		return
	}
	for key, k := range l.links {
		if key[0] == n || key[1] == n {
			for conn := range k.conns {
				conn.Close()
			}
		}
	}
}

// setSlow holds every answer n sends on its links for d (0: not slowed).
func (l *linkNet) setSlow(n *node, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.slow[n] = d
}

// close stops every relay and drops its connections.
func (l *linkNet) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range l.links {
		k.ln.Close()
		for conn := range k.conns {
			conn.Close()
		}
	}
}
