package peerserver

import (
	"fmt"
	"net/http"
	"sync/atomic"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/ratelog"
)

// A peer speaks only for itself (spec 3.3, "Origin rule"). A pinned
// certificate proves which principal is at the other end of a connection,
// not which node an event came from: without this rule one pinned peer
// could upsert workloads in any member's name, this node's own included,
// and remove them, and a removal of this node's own workload would reach
// the broker while this node's re-sync set kept re-asserting it. So the
// peer port refuses a frame whose originatedFrom is this node, and, once
// the latest discovery snapshot says which node a principal is, a frame
// from that principal naming any other node.

// Binding is one entry of a discovery snapshot as the origin rule reads
// it: a principal (the clusterUuid its certificate is pinned under) and
// the node (hostUuid) the directory lists it for.
type Binding struct{ Principal, Node string }

// SetDiscovery takes the latest discovery snapshot's bindings: from now on
// a principal it lists may claim only the nodes it is listed for. The
// index is built before it is swapped in whole, so a request never waits
// for it.
func (s *Server) SetDiscovery(bindings []Binding) { s.origins.index.Store(newOriginIndex(bindings)) }

// OriginRefusalsSelf counts the frames refused for naming this node as
// their origin; OriginRefusalsOther those naming a node their principal is
// not listed for.
func (s *Server) OriginRefusalsSelf() uint64  { return s.origins.refusedSelf.Load() }
func (s *Server) OriginRefusalsOther() uint64 { return s.origins.refusedOther.Load() }

// originIndex is what one discovery snapshot says about the principals it
// lists: the nodes (hostUuid) each is listed for. It is built once per
// snapshot and never changed, so the peer port reads it without a lock.
type originIndex struct {
	known map[string]struct{}        // principals (clusterUuid) the snapshot lists
	bound map[principalHost]struct{} // the (principal, hostUuid) pairs it lists
}

type principalHost struct{ principal, host string }

// newOriginIndex indexes a snapshot's entries that name both a principal
// and a node. A principal listed for two nodes is bound to both: the
// directory vouches for each, and picking one would refuse the other's
// frames for as long as the snapshot stands.
func newOriginIndex(nodes []Binding) *originIndex {
	x := &originIndex{known: map[string]struct{}{}, bound: map[principalHost]struct{}{}}
	for _, n := range nodes {
		if n.Principal == "" || n.Node == "" {
			continue
		}
		x.known[n.Principal] = struct{}{}
		x.bound[principalHost{n.Principal, n.Node}] = struct{}{}
	}
	return x
}

// mayClaim reports whether principal may send events whose origin is node:
// yes when the snapshot does not list the principal (or there is no
// snapshot yet), else only for a node it is listed for. Two map lookups,
// whatever the size of the cluster.
func (x *originIndex) mayClaim(principal, node string) bool {
	if x == nil {
		return true
	}
	if _, listed := x.known[principal]; !listed {
		return true
	}
	_, ok := x.bound[principalHost{principal, node}]
	return ok
}

// originGuard holds the latest snapshot's index and the refusals' log and
// count. The index is swapped whole on each snapshot (an atomic pointer),
// so a peer request never takes discoveryMu, which a target change holds.
type originGuard struct {
	index                     atomic.Pointer[originIndex]
	refusedSelf, refusedOther atomic.Uint64 // by claim, for the metrics
	log                       ratelog.Burst // refusals, at most one line per ratelog.Interval
}

// Labels of nvpair_wlm_peer_origin_refused_total.
const (
	ClaimSelf  = "self"  // the frame named this node as its origin
	ClaimOther = "other" // it named a node its principal is not listed for
)

// originRefusal returns why a frame from principal naming origin is
// refused, or "" when it is not. self is this node's id. The values quoted
// come from the request and are clipped.
//
// Two origins are never another node's, whatever the snapshot says:
//   - the principal itself. Its certificate proves it, and a stock peer
//     stamps it while its directory entry still shows another hostUuid: on
//     a fresh host PAIR's scanner advertises the node id it minted before
//     the cluster manager wrote the node's identity, until the broker has
//     it re-read that identity (its convergeScannerIdentity), and the
//     frames carry the identity's id meanwhile (spec 3.3).
//   - none: an older sender's removal without originatedFrom removes
//     ("", id), which names no node's workload (every workload carries a
//     non-empty origin), so it speaks for nobody else.
func (g *originGuard) originRefusal(self, principal, origin string) (claim, reason string) {
	if origin == self {
		return ClaimSelf, peerwire.OriginRefusalPrefix + fmt.Sprintf("originatedFrom %q is this node: a peer speaks only for itself", httpguard.ClipField(origin))
	}
	if origin == "" || origin == principal {
		return "", ""
	}
	if !g.index.Load().mayClaim(principal, origin) {
		return ClaimOther, peerwire.OriginRefusalPrefix + fmt.Sprintf("originatedFrom %q is not the node discovery lists for principal %q: a peer speaks only for itself", httpguard.ClipField(origin), httpguard.ClipField(principal))
	}
	return "", ""
}

// checkPeerOrigin refuses an event a peer may not send: 403 and the reason,
// counted, and logged at most once per interval with the count since the
// last line; 0 when it may. The log is
// rate-limited because a misbehaving peer can send thousands a second, and
// one line with a count says as much.
func (s *Server) checkPeerOrigin(log *httpguard.RequestLog, principal string, ev *Event) (status int, reason string) {
	claim, reason := s.origins.originRefusal(s.cfg.Self, principal, ev.origin())
	if claim == "" {
		return 0, ""
	}
	if claim == ClaimSelf {
		s.origins.refusedSelf.Add(1)
	} else {
		s.origins.refusedOther.Add(1)
	}
	s.origins.log.NoteCounted(log.Logger(), "refused", "peer frames refused for their origin", "claim", claim, "reason", httpguard.ClipReason(reason))
	return http.StatusForbidden, reason
}

// WriteOriginMetrics renders the refusals for origin.
func (s *Server) WriteOriginMetrics(t *promtext.Text) {
	g := &s.origins
	const name = "nvpair_wlm_peer_origin_refused_total"
	t.Family(name, "counter", "Peer frames refused (403) because their originatedFrom is this node (claim=self) or a node discovery does not list for the sending principal (claim=other).")
	t.Sample(name, []string{"claim"}, []string{ClaimOther}, float64(g.refusedOther.Load()))
	t.Sample(name, []string{"claim"}, []string{ClaimSelf}, float64(g.refusedSelf.Load()))
}
