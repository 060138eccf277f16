// Package peersend owns the outbound side of the peer port: the broadcast
// targets (Broadcaster, Target) and one sender per target, which delivers
// the entries above its member's mark in the state table in version order,
// singly or in batches to a peer that advertised them, runs the peer's
// heartbeat passes and honours the hold a peer's Retry-After asks for; and
// the spreading of what every node would otherwise do at one instant: the
// passes' jitter, the node's bound on connection attempts in flight and
// the spread of a snapshot's first dials (jitter.go, dialpace.go).
// There is no queue between the table and a peer: what a peer has not
// taken is what lies above its mark (spec 5.1), so a slow or dead peer
// delays only itself.
//
// It may import the standard library and this module's peerwire,
// statetable, wireframe, httpguard, pairinstall, promtext and ratelog. It
// must never import the daemon (package main), the inbound server
// (internal/peerserver) or the broker's channel (internal/brokerio): a
// sender writes nothing to the broker.
package peersend
