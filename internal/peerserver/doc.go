// Package peerserver owns the inbound side of the peer port: it takes
// the other members' frames over mutual TLS, single or batched, checks
// each sender's pin and the origin it claims, writes each event to the
// broker once (the dedup) and answers what became of it. It is the
// upstream worker's Server in shape: it is given what it emits to (the
// broker's writer) and the daemon's shared counters, never the daemon.
//
// It may import the standard library and this module's wireframe,
// peerwire, brokerio, httpguard, pairinstall, promtext and ratelog. It
// must never import the daemon (package main), the outbound senders
// (internal/peersend) or the state table: a peer's frame changes nothing
// this node asserts.
package peerserver
