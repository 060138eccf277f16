// Package statetable owns the record of everything this node asserts to
// the cluster (spec 5): one entry per workload run that entered through
// this node (from its broker or a producer on the loopback ingress), with
// the run's latest frame, who owns it, its producer lease and a version
// from a node-local counter bumped on every change. An end is an entry too:
// a terminal run, or a removal tombstone, kept until every member has
// acknowledged it (or a byte bound forces the oldest out).
//
// Every path to the peers and to disk reads this table. Each member (a
// peer this node sends to, or one that left within its claim) has a mark:
// the highest version it answered 200 for. A peer's sender takes the
// entries above its mark, in version order, each at its latest state, so
// the fresh path, a new member's backfill and a returning member's catch-up
// are one loop, and a slow member is sent the latest state of an entry,
// never a stale one after a newer one. The heartbeat's passes walk the live
// entries in a stable order of their own.
//
// What the table must not lose (producer-owned entries and their leases,
// ends not acknowledged by every member, the members' marks) is written
// as records to a Journal (internal/statejournal frames them) in the same
// hold as the change, so the journal's order is the table's.
//
// The table's lock is the one the design card calls activeMu: it is a
// leaf under the ingress's ingestMu, and no caller holds it across I/O or
// O(size) work: every operation is O(1) amortized or bounded by a slice.
//
// It must never import the daemon (package main), net/http, or the peer
// transport: it is state and its rules, tested alone.
package statetable
