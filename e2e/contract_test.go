package e2e

import (
	"net/http"
	"strconv"
	"strings"

	"nvpair-workload-manager/internal/statetable"
)

// The daemon's contract as these tests hold it from outside: the paths,
// headers, file names, texts and bounds that a producer, a peer, PAIR's
// broker or an operator meets. They are written here as values rather than
// taken from the daemon's code (package main, which no test outside it can
// import, and which must not be the judge of itself): a test that names one
// states what the binary must keep, so changing one is changing the
// contract, here and in spec.md.

// The peer port.
const (
	peerEventsPath       = "/v1/workloads/events" // where peers post frames and batches
	peerBatchHeader      = "Nvpair-Wl-Batch"      // a node's batch advertisement
	peerBatchContentType = "application/x-ndjson" // a batch: one frame a line
	// peerBatchAdvert is the daemon's own advertisement: at most 256 frames
	// and 1 MiB (wireframe.MaxBytes) a batch. The stand-in peers give it.
	peerBatchAdvert = "max-frames=256, max-bytes=1048576"
	// The reasons of a batch answer's results.
	reasonAlreadySeen  = "already seen"
	reasonNotAttempted = "not attempted: an earlier element failed"
	// originRefusalPrefix starts the reason of a frame refused for its
	// origin: a pinned peer naming a node its principal is not listed for.
	originRefusalPrefix = "origin refused: "
	// The claim label of nvpair_wlm_peer_origin_refused_total.
	claimSelf  = "self"  // the frame named the receiving node as its origin
	claimOther = "other" // it named a node its principal is not listed for
)

// peerBatchAnswer is the JSON answer to a batch: one result an element.
type peerBatchAnswer struct {
	Results []peerBatchResult `json:"results"`
}

// peerBatchResult is what became of one element: the status a single
// request carrying it would have been answered with, or 503 with
// reasonNotAttempted for one after an element that failed.
type peerBatchResult struct {
	Status int    `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// isOriginRefusal reports whether a peer's answer (a single frame's, or a
// batch element's result) refused the frame for its origin.
func isOriginRefusal(status int, reason string) bool {
	return status == http.StatusForbidden && strings.HasPrefix(reason, originRefusalPrefix)
}

// The local ingress.
const (
	readBackPath        = "/v1/workloads" // GET: the read-back of the node's workloads
	readBackHeader      = "Workload-Read-Back"
	readBackHeaderValue = "1"
	nodeInfoPath        = "/v1/node" // GET: the node's id, members and limits
	leaseHeader         = "Workload-Lease"
)

// restartLeaseGrace is the least time, in lease seconds, a lease restored
// from the journal is given after the daemon's restart: the shortest lease.
const restartLeaseGrace = statetable.MinLeaseSeconds

// leaseExpiryError is the error text of a job retired by its lease, as the
// broker and the peers get it.
func leaseExpiryError(seconds int) string {
	return "producer stopped reporting: lease of " + strconv.Itoa(seconds) + " s expired"
}

// The broker's side.
const (
	// brokerWaitersMax is how many requests of one channel (the ingress,
	// the peer port) may wait on a broker that does not read; the next is
	// answered 503 with Retry-After: brokerBusyRetryAfter seconds.
	brokerWaitersMax     = 64
	brokerBusyRetryAfter = 1
	// The dedup of peer frames holds 10,000 keys of dedupEntryBytes each,
	// whatever the keys' lengths: its bound in bytes is dedupMaxBytes.
	dedupEntryBytes = 192
	dedupMaxBytes   = 10000 * dedupEntryBytes
)

// The process and its files.
const (
	// exitAnotherInstance is the exit status of a start refused because
	// another daemon holds the app dir (spec 3.4.1).
	exitAnotherInstance = 3
	logLevelEnv         = "NVPAIR_LOG_LEVEL"         // the log level when --log-level is not given
	ingressConfigFile   = "workload-ingress.json"    // in the app dir: the ingress's address
	journalFileName     = "workload-manager.journal" // in the app dir: the state table's journal
)

// The file names of a PAIR installation, as the daemon's tests write and
// read them. They are spelled out here rather than taken from
// internal/pairinstall: they are PAIR's contract, which the daemon must
// keep, not a choice of the package.
const (
	identityFileName = "identity.json" // in the cluster dir
	nodeIDFileName   = "node-id.json"  // in the app dir
)

// identityDoc is a node identity document naming id.
func identityDoc(id string) string {
	return `{"node_uuid": "` + id + `", "created_at": 1789661457000}`
}
