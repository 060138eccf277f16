// Package ingress owns the loopback ingress's HTTP surface: the door
// through which producers on this machine post their frames
// (POST /v1/workloads/events), read back what this node shows of them
// (GET /v1/workloads) and learn what they need to report correctly
// (GET /v1/node). It refuses web pages (Origin, Host, Fetch Metadata)
// before it reads a body, bounds what a client can hold, and maps what
// the relay decided to one answer per request.
//
// It reaches the relay only through the Relay and Table interfaces. It may
// import the standard library and this module's wireframe, httpguard,
// brokerio, promtext and statetable (for the read-back's types). It must
// never import the daemon (package main), the peer packages or the
// journal.
package ingress
