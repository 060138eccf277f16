package ingress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"

	"nvpair-workload-manager/internal/httpguard"
)

// The node endpoint (spec 3.5.4): GET /v1/node on the ingress tells a
// producer what it needs to report correctly and nothing it could only
// learn by reading PAIR's files: this node's id and the file it came from,
// the daemon's version, the members of the latest discovery snapshot with
// whether this node delivers to each, and the bounds its frames must keep.
//
// It runs the ingress's browser checks first (Origin, Host, Fetch
// Metadata), like every ingress path. Unlike the read-back it needs no
// Workload-Read-Back-like header: its answer is the same whoever asks and
// whatever they ask, bounded by one discovery snapshot (itself one broker
// line), and says nothing about any producer's jobs; a page that slips
// past the other checks (a browser sending no Fetch Metadata) gets an
// opaque answer it cannot read (no CORS, Cross-Origin-Resource-Policy
// same-origin), whose cost and time are those of any other page's.

// NodeInfoPath is the node endpoint's path on the ingress.
const NodeInfoPath = "/v1/node"

// NodeInfo is the answer to GET /v1/node. Its members and their names
// are part of the ingress's contract (README, spec 3.5.4, api/openapi.json):
// members may be added, never renamed or removed.
type NodeInfo struct {
	NodeID       string       `json:"nodeId"`
	NodeIDSource string       `json:"nodeIdSource"`
	NodeIDFile   string       `json:"nodeIdFile"`
	Version      string       `json:"version"`
	Members      []NodeMember `json:"members"`
	Limits       NodeLimits   `json:"limits"`
}

// NodeMember is one node of the latest discovery snapshot.
type NodeMember struct {
	Name   string `json:"name"`
	NodeID string `json:"nodeId"`
	Self   bool   `json:"self"`
	// Delivering: this node is a broadcast target of ours right now
	// (spec 4): it advertises a wl port and an address, its clusterUuid is
	// pinned, and this node is a clustered member, so every frame a
	// producer posts here is queued for it.
	Delivering bool `json:"delivering"`
}

// NodeLimits are the bounds a producer's frames and jobs must keep.
type NodeLimits struct {
	BodyMaxBytes         int64 `json:"bodyMaxBytes"`
	BrokerLineMaxBytes   int   `json:"brokerLineMaxBytes"`
	WorkloadMaxBytes     int   `json:"workloadMaxBytes"`
	FieldMaxBytes        int   `json:"fieldMaxBytes"`
	ErrorMaxBytes        int   `json:"errorMaxBytes"`
	LeaseMinSeconds      int   `json:"leaseMinSeconds"`
	LeaseMaxSeconds      int   `json:"leaseMaxSeconds"`
	LiveWorkloads        int   `json:"liveWorkloads"`
	LiveWorkloadsMax     int   `json:"liveWorkloadsMax"`
	LiveWorkloadBytes    int64 `json:"liveWorkloadBytes"`
	LiveWorkloadBytesMax int64 `json:"liveWorkloadBytesMax"`
}

// serveNodeInfo answers GET /v1/node: the Origin (403), Host (421) and
// Fetch Metadata (403) checks first, as on every ingress path, then the
// method (405 with Allow: GET), then the query, which must be empty (400),
// then the answer.
func (s *Server) serveNodeInfo(w http.ResponseWriter, r *http.Request) {
	status, reason := s.refusePages(r)
	if status == 0 && r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		status, reason = http.StatusMethodNotAllowed, "method must be GET"
	}
	if status == 0 && r.URL.RawQuery != "" {
		status, reason = http.StatusBadRequest, NodeInfoPath+" takes no query parameters"
	}
	if status != 0 {
		reason = httpguard.ClipReason(reason)
		s.cfg.Responses.Inc(httpguard.StatusCode(status))
		log := s.log.With("channel", "ingress", "remote", r.RemoteAddr, "httpMethod", httpguard.ClipReason(r.Method), "path", NodeInfoPath)
		s.rejects.Log(log, slog.LevelWarn, r.RemoteAddr, status, "ingress request rejected", "status", status, "reason", reason)
		httpguard.Answer(w, status, reason)
		return
	}
	body := nodeInfoJSON(s.cfg.Relay.NodeInfo())
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", fmt.Sprint(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	s.cfg.Responses.Inc("200")
	// The answer has the 5 s write deadline of every ingress answer
	// (httpguard.AnswerWriteTimeout), armed as it starts.
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// nodeInfoJSON renders the answer, one line. HTML characters are not
// escaped, so a member's name takes no more room in the answer than in
// the snapshot (six bytes for one otherwise), and the answer stays within
// a small multiple of the broker line that carried the snapshot.
func nodeInfoJSON(info NodeInfo) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(info) // strings and numbers only: cannot fail
	return buf.Bytes()
}
