// Package peerwire owns the wire of the peer port, the part both ends of
// it must agree on: the batch format and its advertisement, the answers a
// sender reads (which refusals are final, which may change on another
// try, how long a Retry-After holds it), the slack a peer takes beyond the
// workload bound and the idle timeouts of both ends. The path is
// wireframe.EventsPath, which the ingress shares. The inbound server
// (internal/peerserver) and the outbound senders (internal/peersend) both
// read it; neither knows the other.
//
// It may import the standard library and this module's wireframe,
// httpguard and promtext, and must never import the daemon, the senders
// or the server.
package peerwire
