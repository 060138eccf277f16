// Package wlmclient reports a producer's jobs to a nvpair-workload-manager
// node's loopback ingress (POST /v1/workloads/events) the way the daemon
// expects them, so that the right thing is the only easy thing:
//
//   - a [Job] sends its frames in the order they were asked for, one at a
//     time (never two frames of one job in flight), each with a rising seq,
//     the method that carries its state and times in epoch milliseconds;
//   - ids carry the producer's prefix, the host, the process id, the time
//     and 64 random bits, so two processes cannot mint the same id unless
//     the caller names the id itself ([JobSpec].ID);
//   - queued and running frames carry a Workload-Lease that is renewed at a
//     third of its length while the job lives, and the terminal frame ends it;
//   - a refused connection, a 5xx, a 408 or a 429 is retried with capped,
//     jittered exponential backoff, waiting at least the daemon's
//     Retry-After; any other 4xx is final for that frame (a 409 for the
//     whole job: the node's broker owns it) and is never retried;
//   - frames wait in a bounded in-memory queue; what was sent, retried,
//     refused and dropped is counted in [Client.Stats];
//   - with [Config].OutboxPath, terminal frames are kept in a file until
//     the daemon took them, and a restarted producer sends them again;
//   - [Client.Close] flushes within the caller's deadline;
//   - [Client.Node] reads this node's id, members and limits from
//     GET /v1/node, and [JobSpec].ScheduledOnMember names a member by name.
//
// The package uses the standard library only.
package wlmclient
