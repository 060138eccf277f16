package peerwire

import (
	"net/http"
	"strings"

	"nvpair-workload-manager/internal/wireframe"
)

// ReasonAlreadySeen is the peer server's reason for a duplicate
// (peerserver.Server.HandleFrame).
const ReasonAlreadySeen = "already seen"

// OriginRefusalPrefix starts the reason of every refusal for origin, in a
// single frame's answer and in a batch element's result alike. A sender of
// this project reads it to tell a refusal that no retry can change from the
// 403 of a peer that has not re-read its pins yet (IsOriginRefusal).
const OriginRefusalPrefix = "origin refused: "

// IsOriginRefusal reports whether a peer's answer (a single frame's, or a
// batch element's result) refused the frame for its origin: final, since
// the same frame would be refused again.
func IsOriginRefusal(status int, reason string) bool {
	return status == http.StatusForbidden && strings.HasPrefix(reason, OriginRefusalPrefix)
}

// RetryableAnswer is RetryableStatus, but for an answer whose reason is
// known: a refusal for origin is final although it is a 403.
func RetryableAnswer(status int, reason string) bool {
	return RetryableStatus(status) && !IsOriginRefusal(status, reason)
}

// RetryableStatus reports whether an answer may change on another try:
// server errors, 429, and 403 (the peer may not have re-read its pins yet),
// except a 403 that refused the frame for its origin (RetryableAnswer).
func RetryableStatus(status int) bool {
	return status >= 500 || status == http.StatusTooManyRequests || status == http.StatusForbidden
}

// WorkloadSlack is what the peer port takes beyond the workload bound:
// what the origin may add to a frame it took at the bound before relaying
// it. Its ingress measures a producer's params as sent and then stamps the
// origin (`,"originatedFrom":"<id>"`, the id at most wireframe.MaxKeyFieldBytes),
// and its heartbeat adds the re-assertion marker (`"resync":true,`). A
// peer with the same bound must take all of it, or a frame a producer
// was told was accepted would be refused, for good, at every peer.
const WorkloadSlack = len(`,"originatedFrom":""`) + wireframe.MaxKeyFieldBytes + wireframe.ResyncMarkerBytes
