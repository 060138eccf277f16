// Package peerwire owns the wire of the peer port, the part both ends of
// it must agree on: the path, the batch format and its advertisement, the
// answers a sender reads (which refusals are final, which may change on
// another try, how long a Retry-After holds it) and the slack a peer takes
// beyond the workload bound. The inbound server (internal/peerserver) and
// the outbound senders (internal/peersend) both read it; neither knows the
// other.
//
// It imports only the standard library and this module's wireframe,
// httpguard and statetable (for the re-assertion marker's size), and must
// never import the daemon, the senders or the server.
package peerwire
