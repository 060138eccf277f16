package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/testframe"
	"nvpair-workload-manager/internal/testkit"
)

// What a producer does on the local ingress, for the tests of every
// subject: post frames (with a lease, or not) and read its node's workloads
// back.

// liClient opens one connection per request, so no test depends
// on what an earlier answer did to a pooled connection.
var liClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: testkit.WaitTimeout}

// liRequest is one request to the ingress; zero fields take POST, the
// events path and the URL's host. The header is sent as it is.
type liRequest struct {
	method, path, host string
	header             http.Header
	body               string
	bodyReader         io.Reader // instead of body, e.g. for a chunked body
}

// liDo sends rq to the ingress at addr and returns the status and the
// answer's text.
func liDo(addr string, rq liRequest) (int, string, error) {
	method, path := rq.method, rq.path
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = peerEventsPath
	}
	body := rq.bodyReader
	if body == nil {
		body = strings.NewReader(rq.body)
	}
	req, err := http.NewRequest(method, "http://"+addr+path, body)
	if err != nil {
		return 0, "", err
	}
	if rq.host != "" {
		req.Host = rq.host
	}
	for k, vs := range rq.header {
		req.Header[k] = vs
	}
	resp, err := liClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(text)), err
}

func liMust(t testing.TB, addr string, rq liRequest) (int, string) {
	t.Helper()
	status, text, err := liDo(addr, rq)
	if err != nil {
		t.Fatalf("%s %s: %v", rq.method, rq.path, err)
	}
	return status, text
}

// postIngress posts body to the ingress with Content-Type application/json
// and the given headers, as name/value pairs; "Host" sets the request's
// Host.
func postIngress(t testing.TB, addr, body string, headers ...string) (int, string) {
	t.Helper()
	if len(headers)%2 != 0 {
		t.Fatalf("headers %q are not name/value pairs", headers)
	}
	rq := liRequest{body: body, header: http.Header{"Content-Type": {"application/json"}}}
	for i := 0; i < len(headers); i += 2 {
		if http.CanonicalHeaderKey(headers[i]) == "Host" {
			rq.host = headers[i+1]
			continue
		}
		rq.header.Add(headers[i], headers[i+1])
	}
	return liMust(t, addr, rq)
}

// liFrame returns a valid workload:started frame for id, with no
// originatedFrom, as a producer sends it.
func liFrame(id string) string {
	return string(testframe.Lifecycle(testframe.Workload(id, "running", "", map[string]any{"originatedFrom": nil, "runId": id}), nil))
}

// leasedInfo is a workload object as a producer posts it to the ingress:
// no originatedFrom (stamped), the fields an expiry must keep, and one of
// the producer's own.
func leasedInfo(id, state string, seq int) map[string]any {
	w := testframe.Workload(id, state, "", map[string]any{"seq": seq, "requesterId": "lease-test", "harnessSlot": 3,
		"startedAt": json.RawMessage("1789661458000"), "completedAt": json.RawMessage("null"), "error": json.RawMessage("null")})
	delete(w, "originatedFrom")
	return w
}

// readBackAnswer is the read-back's JSON answer.
type readBackAnswer struct {
	Workloads []struct {
		WorkloadInfo  map[string]any `json:"workloadInfo"`
		LeaseDeadline *int64         `json:"leaseDeadline"`
	} `json:"workloads"`
	Next *string `json:"next"`
}

func (a readBackAnswer) ids() []string {
	var out []string
	for _, w := range a.Workloads {
		out = append(out, w.WorkloadInfo["id"].(string))
	}
	return out
}

// getReadBack sends GET /v1/workloads?query to the ingress at addr, with
// headers as name/value pairs ("Host" sets the request's Host). The
// read-back's header is sent as a producer sends it unless headers name
// it: then as they give it, and an empty value leaves it out.
func getReadBack(t testing.TB, addr, query string, headers ...string) (int, http.Header, []byte) {
	t.Helper()
	return doReadBack(t, http.MethodGet, addr, query, headers...)
}

func doReadBack(t testing.TB, method, addr, query string, headers ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+readBackPath+"?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(readBackHeader, readBackHeaderValue)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == readBackHeader {
			req.Header.Del(readBackHeader)
		}
	}
	for i := 0; i+1 < len(headers); i += 2 {
		switch {
		case headers[i] == "Host":
			req.Host = headers[i+1]
		case headers[i] == readBackHeader && headers[i+1] == "":
		default:
			req.Header.Add(headers[i], headers[i+1])
		}
	}
	resp, err := liClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, readBackPath, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, body
}

// readBack requires a 200 answer to query and decodes it.
func readBack(t testing.TB, addr, query string) readBackAnswer {
	t.Helper()
	st, _, body := getReadBack(t, addr, query)
	if st != http.StatusOK {
		t.Fatalf("read-back %q: %d %s", query, st, body)
	}
	var a readBackAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("read-back %q answered %s: %v", query, body, err)
	}
	return a
}
