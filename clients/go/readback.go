package wlmclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Workload is one item of the node's read-back (GET /v1/workloads, spec
// 3.5.2): a workload reported through the ingress, as the node holds it.
type Workload struct {
	// Info is the workload object, numbers kept as json.Number so that a
	// seq or a time is never rounded.
	Info map[string]any
	// LeaseDeadline is when the node retires the job unless it hears of
	// it; zero when the job holds no lease.
	LeaseDeadline time.Time
}

// ID is the workload's id.
func (w Workload) ID() string { s, _ := w.Info["id"].(string); return s }

// State is the workload's state.
func (w Workload) State() string { s, _ := w.Info["state"].(string); return s }

// Seq is the workload's seq, 0 when it has none.
func (w Workload) Seq() int64 { return int64Of(w.Info["seq"]) }

// Bounds of a read-back, so that whatever answers on the ingress's
// address cannot make the client hold more than this.
const (
	// readBackPageMax bounds one answer's body: the daemon ends a page at
	// 8 MiB of workload objects (ingress.ReadBackPageBytes), plus one
	// object (1 MiB at most, the body cap's bound) and the envelope.
	readBackPageMax = 10 << 20
	// ReadBackMax bounds the workloads one ReadBack returns: the daemon's
	// own bound on the workloads it holds (--max-live-workloads) at its
	// default.
	ReadBackMax = 100_000
	// readBackPages bounds the pages one ReadBack follows: each lists up
	// to 1000 workloads or looks at 100,000 entries of the table, so this
	// is far beyond a table at its bound.
	readBackPages = 1000
)

// ReadBack lists the workloads this node shows that producers reported
// through its ingress (GET /v1/workloads), following the answer's next
// cursor to the end: those whose requesterId is requester, or every one
// when requester is "". A producer that restarted reads back which of its
// jobs the node still shows and carries on with them (Resume). A 503 (two
// read-backs in progress) is retried after its Retry-After within ctx;
// any other answer but a 200 is an error. Each request is bounded by
// Config.RequestTimeout, and the whole by ctx.
func (c *Client) ReadBack(ctx context.Context, requester string) ([]Workload, error) {
	var out []Workload
	cursor := ""
	for range readBackPages {
		q := url.Values{"limit": {"1000"}}
		if requester != "" {
			q.Set("requesterId", requester)
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		page, next, err := c.readBackPage(ctx, q.Encode())
		if err != nil {
			return nil, err
		}
		if len(out)+len(page) > ReadBackMax {
			return nil, fmt.Errorf("wlmclient: read-back: over %d workloads", ReadBackMax)
		}
		out = append(out, page...)
		if next == "" {
			return out, nil
		}
		cursor = next
	}
	return nil, fmt.Errorf("wlmclient: read-back: over %d pages", readBackPages)
}

// readBackPage asks for one page, waiting out the daemon's 503s within ctx.
func (c *Client) readBackPage(ctx context.Context, query string) ([]Workload, string, error) {
	for {
		status, retryAfter, body, err := c.getReadBack(ctx, query)
		if err != nil {
			return nil, "", fmt.Errorf("wlmclient: read-back: %w", err)
		}
		switch status {
		case http.StatusOK:
			return parseReadBack(body)
		case http.StatusServiceUnavailable:
			wait := min(max(retryAfter, time.Second), c.cfg.RetryAfterMax)
			select {
			case <-time.After(wait):
				continue
			case <-ctx.Done():
				return nil, "", fmt.Errorf("wlmclient: read-back: the node was busy until the deadline: %w", ctx.Err())
			}
		}
		reason, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
		return nil, "", &StatusError{Method: "GET /v1/workloads", Status: status, Reason: clip(reason)}
	}
}

// getReadBack sends one read-back request and reads its answer, at most
// readBackPageMax bytes of it.
func (c *Client) getReadBack(ctx context.Context, query string) (status int, retryAfter time.Duration, body []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url+"/v1/workloads?"+query, nil)
	if err != nil {
		return 0, 0, nil, err
	}
	req.Header.Set("Workload-Read-Back", "1")
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, 0, nil, err
	}
	defer resp.Body.Close()
	if isRedirect(resp.StatusCode) {
		return resp.StatusCode, 0, []byte(redirectReason(resp)), nil
	}
	body, err = io.ReadAll(io.LimitReader(resp.Body, readBackPageMax+1))
	if err != nil {
		return 0, 0, nil, fmt.Errorf("the answer did not arrive whole within RequestTimeout (%s): %w", c.cfg.RequestTimeout, err)
	}
	if len(body) > readBackPageMax {
		return 0, 0, nil, fmt.Errorf("an answer over %d bytes: not the daemon's read-back", readBackPageMax)
	}
	return resp.StatusCode, parseRetryAfter(resp.Header.Get("Retry-After")), body, nil
}

// parseReadBack reads one page: its workloads and its next cursor ("" at
// the end).
func parseReadBack(body []byte) ([]Workload, string, error) {
	var page struct {
		Workloads *[]struct {
			WorkloadInfo  map[string]any `json:"workloadInfo"`
			LeaseDeadline *json.Number   `json:"leaseDeadline"`
		} `json:"workloads"`
		Next *string `json:"next"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&page); err != nil {
		return nil, "", fmt.Errorf("wlmclient: read-back: not the daemon's answer: %w", err)
	}
	if page.Workloads == nil {
		return nil, "", fmt.Errorf("wlmclient: read-back: the answer has no workloads list: not the daemon's answer")
	}
	out := make([]Workload, 0, len(*page.Workloads))
	for _, w := range *page.Workloads {
		if id, _ := w.WorkloadInfo["id"].(string); id == "" {
			return nil, "", fmt.Errorf("wlmclient: read-back: a workload without an id: not the daemon's answer")
		}
		item := Workload{Info: w.WorkloadInfo}
		if w.LeaseDeadline != nil {
			if ms, err := w.LeaseDeadline.Int64(); err == nil {
				item.LeaseDeadline = time.UnixMilli(ms)
			}
		}
		out = append(out, item)
	}
	next := ""
	if page.Next != nil {
		next = *page.Next
	}
	return out, next, nil
}

// int64Of reads a JSON number held as json.Number or float64; 0 otherwise.
func int64Of(v any) int64 {
	switch n := v.(type) {
	case json.Number:
		i, err := n.Int64()
		if err != nil {
			return 0
		}
		return i
	case float64:
		return int64(n)
	case int64:
		return n
	}
	return 0
}
