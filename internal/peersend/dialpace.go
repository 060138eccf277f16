package peersend

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/promtext"
)

// Mesh formation, paced (spec 4). One discovery snapshot makes every node
// a sender to every other at once: unpaced, that is N(N-1) dials and TLS
// handshakes together, which at 64 members on one machine took the mesh
// 4.7-20.6 s to form, through dial timeouts and retry storms (68,806
// failed deliveries at 128). Three things spread it: a node has at most
// DefaultDialsInFlight attempts (dial and handshake) in flight, a new
// sender waits a random part of firstDialSpread before its first request,
// and a failed attempt's backoff is jittered (nextBackoff).

// DefaultDialsInFlight bounds the node's outbound connection attempts in
// flight, the TCP dial and the TLS handshake together. A handshake costs
// the client about a millisecond of CPU and the server more: 16 at once
// keep a 128-member mesh's 127 dials to some 8 rounds of a few ms on a
// quiet machine, while a few dead peers (each holding its slot up to
// peerDialTimeout) still leave most slots to the live ones.
const DefaultDialsInFlight = 16

// dialStep and firstDialSpreadMax size the random wait before a new
// sender's first request: up to dialStep per sender the snapshot added,
// at most firstDialSpreadMax. A node that joins alone waits a few ms; a
// node whose first snapshot lists 127 peers spreads them over half a
// second, well within the 2 s in which a restarted origin's state must be
// at its peers (issue 37).
const (
	dialStep           = 4 * time.Millisecond
	firstDialSpreadMax = 500 * time.Millisecond
)

// firstDialSpread is the span a snapshot's new senders' first requests
// are spread over.
func firstDialSpread(added int) time.Duration {
	return min(time.Duration(added)*dialStep, firstDialSpreadMax)
}

// dialGate holds the node's connection attempts in flight to a bound; an
// attempt past it waits for a slot within its own deadline.
type dialGate struct {
	slots    chan struct{}
	inFlight atomic.Int64
	waited   atomic.Uint64 // attempts that found every slot taken
}

func newDialGate(n int) *dialGate { return &dialGate{slots: make(chan struct{}, n)} }

// dial runs attempt in a slot, within peerAttemptTimeout from the call,
// the wait for the slot included. The transport detaches a dial from its
// request's deadline, so the bound here is what frees a slot whose peer
// accepts and never answers its handshake.
func (g *dialGate) dial(ctx context.Context, attempt func(context.Context) (net.Conn, error)) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, peerAttemptTimeout)
	defer cancel()
	select {
	case g.slots <- struct{}{}:
	default:
		g.waited.Add(1)
		select {
		case g.slots <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for one of %d connection attempts in flight: %w", cap(g.slots), ctx.Err())
		}
	}
	g.inFlight.Add(1)
	defer func() { g.inFlight.Add(-1); <-g.slots }()
	return attempt(ctx)
}

// writeMetrics renders the bound on the attempts in flight and its use.
func (g *dialGate) writeMetrics(t *promtext.Text) {
	t.Family("nvpair_wlm_peer_dials_in_flight", "gauge", "Outbound connection attempts (dial and TLS handshake) in flight, node-wide.")
	t.Sample("nvpair_wlm_peer_dials_in_flight", nil, nil, float64(g.inFlight.Load()))
	t.Family("nvpair_wlm_peer_dials_in_flight_limit", "gauge", "The most outbound connection attempts in flight at once (peersend.DefaultDialsInFlight).")
	t.Sample("nvpair_wlm_peer_dials_in_flight_limit", nil, nil, float64(cap(g.slots)))
	t.Family("nvpair_wlm_peer_dial_waits_total", "counter", "Outbound connection attempts that found every slot taken and waited for one.")
	t.Sample("nvpair_wlm_peer_dial_waits_total", nil, nil, float64(g.waited.Load()))
}
