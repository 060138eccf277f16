package wlmclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
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
// PAIR's files for this.
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
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("wlmclient: GET /v1/node: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		reason, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		return nil, &StatusError{Method: "GET /v1/node", Status: resp.StatusCode, Reason: reason}
	}
	var n Node
	if err := json.Unmarshal(b, &n); err != nil {
		return nil, fmt.Errorf("wlmclient: GET /v1/node: %w", err)
	}
	return &n, nil
}

// MemberID returns the node id of the member named name, for scheduledOn.
func (c *Client) MemberID(ctx context.Context, name string) (string, error) {
	n, err := c.Node(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range n.Members {
		if m.Name == name {
			return m.NodeID, nil
		}
	}
	return "", fmt.Errorf("wlmclient: the node lists no member named %q", name)
}
