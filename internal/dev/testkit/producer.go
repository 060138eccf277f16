package testkit

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/wireframe"
)

// What a producer does on the local ingress: post frames and read its
// node's workloads back.

// Client opens one connection per request, so no test depends on what an
// earlier answer did to a pooled connection.
var Client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: WaitTimeout}

// Request is one request to the ingress; zero fields take POST, the events
// path and the URL's host. The header is sent as it is.
type Request struct {
	Method, Path, Host string
	Header             http.Header
	Body               string
	BodyReader         io.Reader // instead of Body, e.g. for a chunked body
}

// Do sends rq to the ingress at addr and returns the status and the
// answer's text.
func Do(addr string, rq Request) (int, string, error) {
	method, path := rq.Method, rq.Path
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = wireframe.EventsPath
	}
	body := rq.BodyReader
	if body == nil {
		body = strings.NewReader(rq.Body)
	}
	req, err := http.NewRequest(method, "http://"+addr+path, body)
	if err != nil {
		return 0, "", err
	}
	if rq.Host != "" {
		req.Host = rq.Host
	}
	for k, vs := range rq.Header {
		req.Header[k] = vs
	}
	resp, err := Client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(text)), err
}

// MustDo is Do that fails the test when no answer came.
func MustDo(t testing.TB, addr string, rq Request) (int, string) {
	t.Helper()
	status, text, err := Do(addr, rq)
	if err != nil {
		t.Fatalf("%s %s: %v", rq.Method, rq.Path, err)
	}
	return status, text
}

// PostIngress posts body to the ingress with Content-Type application/json
// and the given headers, as name/value pairs; "Host" sets the request's
// Host.
func PostIngress(t testing.TB, addr, body string, headers ...string) (int, string) {
	t.Helper()
	if len(headers)%2 != 0 {
		t.Fatalf("headers %q are not name/value pairs", headers)
	}
	rq := Request{Body: body, Header: http.Header{"Content-Type": {"application/json"}}}
	for i := 0; i < len(headers); i += 2 {
		if http.CanonicalHeaderKey(headers[i]) == "Host" {
			rq.Host = headers[i+1]
			continue
		}
		rq.Header.Add(headers[i], headers[i+1])
	}
	return MustDo(t, addr, rq)
}

// The read-back as a producer meets it, written as values.
const (
	ReadBackPath        = "/v1/workloads" // GET: the read-back of the node's workloads
	ReadBackHeader      = "Workload-Read-Back"
	ReadBackHeaderValue = "1"
)

// ReadBackAnswer is the read-back's JSON answer.
type ReadBackAnswer struct {
	Workloads []struct {
		WorkloadInfo  map[string]any `json:"workloadInfo"`
		LeaseDeadline *int64         `json:"leaseDeadline"`
	} `json:"workloads"`
	Next *string `json:"next"`
}

// IDs returns the answer's workload ids, in order.
func (a ReadBackAnswer) IDs() []string {
	var out []string
	for _, w := range a.Workloads {
		out = append(out, w.WorkloadInfo["id"].(string))
	}
	return out
}

// GetReadBack sends GET /v1/workloads?query to the ingress at addr, with
// headers as name/value pairs ("Host" sets the request's Host). The
// read-back's header is sent as a producer sends it unless headers name
// it: then as they give it, and an empty value leaves it out.
func GetReadBack(t testing.TB, addr, query string, headers ...string) (int, http.Header, []byte) {
	t.Helper()
	return DoReadBack(t, http.MethodGet, addr, query, headers...)
}

// DoReadBack is GetReadBack with another method.
func DoReadBack(t testing.TB, method, addr, query string, headers ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+ReadBackPath+"?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(ReadBackHeader, ReadBackHeaderValue)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == ReadBackHeader {
			req.Header.Del(ReadBackHeader)
		}
	}
	for i := 0; i+1 < len(headers); i += 2 {
		switch {
		case headers[i] == "Host":
			req.Host = headers[i+1]
		case headers[i] == ReadBackHeader && headers[i+1] == "":
		default:
			req.Header.Add(headers[i], headers[i+1])
		}
	}
	resp, err := Client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, ReadBackPath, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, body
}

// ReadBack requires a 200 answer to query and decodes it.
func ReadBack(t testing.TB, addr, query string) ReadBackAnswer {
	t.Helper()
	st, _, body := GetReadBack(t, addr, query)
	if st != http.StatusOK {
		t.Fatalf("read-back %q: %d %s", query, st, body)
	}
	var a ReadBackAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("read-back %q answered %s: %v", query, body, err)
	}
	return a
}

// NodeInfoPath is where the ingress answers what node it is.
const NodeInfoPath = "/v1/node"

// GetNodeInfo asks the ingress at addr for GET /v1/node with the given
// headers (name/value pairs) and returns the status, the headers and the
// body.
func GetNodeInfo(t testing.TB, addr, query string, headers ...string) (int, http.Header, []byte) {
	t.Helper()
	u := "http://" + addr + NodeInfoPath
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequest(http.MethodGet, u, nil)
	Must(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := Client.Do(req)
	Must(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	Must(t, err)
	return resp.StatusCode, resp.Header, body
}
