package wlmclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Node is the node's answer to GET /v1/node: who it is, whom it delivers
// to and the limits a producer must respect.
type Node struct {
	NodeID       string   `json:"nodeId"`       // this node's id, stamped as originatedFrom
	NodeIDSource string   `json:"nodeIdSource"` // the base name of the file the id came from (spec 3.5.4)
	NodeIDFile   string   `json:"nodeIdFile"`   // that file's path
	Version      string   `json:"version"`      // the daemon's version
	Members      []Member `json:"members"`      // the latest discovery snapshot's nodes, this one included
	Limits       Limits   `json:"limits"`       // the bounds a frame must fit
}

// Member is one cluster member.
type Member struct {
	Name       string `json:"name"`       // the member's name, as the cluster shows it
	NodeID     string `json:"nodeId"`     // its node id, for scheduledOn
	Self       bool   `json:"self"`       // the entry is this node's
	Delivering bool   `json:"delivering"` // whether this node currently delivers to it
}

// Limits are the bounds the node enforces on producers (spec 3.5.4).
type Limits struct {
	BodyMaxBytes         int64 `json:"bodyMaxBytes"`         // the request body cap
	BrokerLineMaxBytes   int64 `json:"brokerLineMaxBytes"`   // a frame's line to the broker
	WorkloadMaxBytes     int64 `json:"workloadMaxBytes"`     // a frame's params
	FieldMaxBytes        int64 `json:"fieldMaxBytes"`        // id, runId, engine, model, scheduledOn, requesterId
	ErrorMaxBytes        int64 `json:"errorMaxBytes"`        // error
	LeaseMinSeconds      int64 `json:"leaseMinSeconds"`      // the Workload-Lease range
	LeaseMaxSeconds      int64 `json:"leaseMaxSeconds"`      //
	LiveWorkloads        int64 `json:"liveWorkloads"`        // entries the node holds now
	LiveWorkloadsMax     int64 `json:"liveWorkloadsMax"`     // and at most
	LiveWorkloadBytes    int64 `json:"liveWorkloadBytes"`    // their bytes now
	LiveWorkloadBytesMax int64 `json:"liveWorkloadBytesMax"` // and at most
}

// Node asks the node who it is (GET /v1/node). A producer never reads
// PAIR's files for this. The answer is taken only when it is this node's
// document: a 200 of application/json, at most nodeAnswerMax bytes, a JSON
// object with a node id (a UUID, as every PAIR node id is), its members
// and its limits. Anything else (a redirect, a page, `{}`, another
// service's JSON) is an error: a producer that stamped or scheduled on an
// id it took from it would report in the name of nobody.
func (c *Client) Node(ctx context.Context) (*Node, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url+"/v1/node", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("wlmclient: GET /v1/node: %w", err)
	}
	defer resp.Body.Close()
	if isRedirect(resp.StatusCode) {
		return nil, &StatusError{Method: "GET /v1/node", Status: resp.StatusCode, Reason: redirectReason(resp)}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, nodeAnswerMax+1))
	if err != nil {
		return nil, fmt.Errorf("wlmclient: GET /v1/node: the answer did not arrive whole within RequestTimeout (%s): %w", c.cfg.RequestTimeout, err)
	}
	if resp.StatusCode != http.StatusOK {
		reason, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		return nil, &StatusError{Method: "GET /v1/node", Status: resp.StatusCode, Reason: reason}
	}
	n, err := parseNode(resp.Header.Get("Content-Type"), b)
	if err != nil {
		return nil, fmt.Errorf("wlmclient: GET /v1/node: %w", err)
	}
	c.members.learn(n, time.Now())
	return n, nil
}

// nodeAnswerMax bounds the answer of GET /v1/node the client reads: far
// above what a node of thousands of members answers, and a bound on what a
// server that never stops sending can make it hold.
const nodeAnswerMax = 4 << 20

// nodeIDPattern is the shape of every PAIR node id: a UUID (spec 3.4.1).
var nodeIDPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// parseNode reads b, an answer of GET /v1/node with Content-Type ctype, and
// refuses it unless it is a node's document: JSON by its type, an object
// naming a node id, with a members list and a limits object.
func parseNode(ctype string, b []byte) (*Node, error) {
	if mt, _, err := mime.ParseMediaType(ctype); err != nil || mt != "application/json" {
		return nil, fmt.Errorf("the answer is %q, not application/json: not the daemon's node document", clip(ctype))
	}
	if len(b) > nodeAnswerMax {
		return nil, fmt.Errorf("the answer is over %d bytes: not the daemon's node document", nodeAnswerMax)
	}
	var shape struct {
		NodeID  *string          `json:"nodeId"`
		Members *json.RawMessage `json:"members"`
		Limits  *json.RawMessage `json:"limits"`
	}
	if err := json.Unmarshal(b, &shape); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	switch {
	case shape.NodeID == nil || !nodeIDPattern.MatchString(*shape.NodeID):
		return nil, errors.New("the answer names no node id (a UUID in nodeId): not the daemon's node document")
	case shape.Members == nil || (*shape.Members)[0] != '[':
		return nil, errors.New("the answer has no members list: not the daemon's node document")
	case shape.Limits == nil || (*shape.Limits)[0] != '{':
		return nil, errors.New("the answer has no limits object: not the daemon's node document")
	}
	var n Node
	if err := json.Unmarshal(b, &n); err != nil {
		return nil, fmt.Errorf("not the daemon's node document: %w", err)
	}
	return &n, nil
}

// clip shortens s, from a server the client does not trust, for an error.
func clip(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}

// MemberID returns the node id of the member named name, for scheduledOn.
//
// A member's node id is its identity and does not change, so the answer is
// kept: a name learned from GET /v1/node within memberFresh is answered
// without asking again, and an older one is asked for again but, when the
// node cannot answer (its daemon restarting) or answers with no members at
// all (a restarted daemon before its first discovery snapshot, spec
// 3.5.4), still answered from what was learned. A name never learned is
// always asked for: it may have joined since. Without this a Submit naming
// a member would fail whenever the daemon is away, where every other
// Submit just waits in the queue for it.
func (c *Client) MemberID(ctx context.Context, name string) (string, error) {
	id, fresh, known := c.members.lookup(name, time.Now())
	if fresh {
		return id, nil
	}
	if _, err := c.Node(ctx); err != nil {
		if known {
			return id, nil
		}
		return "", err
	}
	if id, _, known := c.members.lookup(name, time.Now()); known {
		return id, nil
	}
	return "", fmt.Errorf("wlmclient: the node lists no member named %q", name)
}

// memberFresh is how long a member name's node id, as GET /v1/node gave
// it, is used without asking the node again.
const memberFresh = time.Minute

// memberCache is what GET /v1/node last said about the members' names.
type memberCache struct {
	mu      sync.Mutex        // guards the fields below; a leaf: nothing is taken under it
	ids     map[string]string // member name -> node id, from the latest answer
	learned time.Time         // when that answer came
}

// learn keeps the members of an answer of GET /v1/node. An answer that
// lists none (a daemon before its first discovery snapshot) teaches
// nothing and leaves what was learned; of two members of one name, the
// first listed is kept, as a search of the answer would find it.
func (m *memberCache) learn(n *Node, now time.Time) {
	if len(n.Members) == 0 {
		return
	}
	ids := make(map[string]string, len(n.Members))
	for _, mb := range n.Members {
		if _, dup := ids[mb.Name]; !dup {
			ids[mb.Name] = mb.NodeID
		}
	}
	m.mu.Lock()
	m.ids, m.learned = ids, now
	m.mu.Unlock()
}

// lookup returns what the latest answer said of name: its node id,
// whether the answer is recent enough to use as it is, and whether it
// named the member at all.
func (m *memberCache) lookup(name string, now time.Time) (id string, fresh, known bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, known = m.ids[name]
	return id, known && now.Sub(m.learned) < memberFresh, known
}
