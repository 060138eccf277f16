package main

import (
	"io"
	"net/http"
	"testing"
)

// getNodeInfo asks the ingress at addr for GET /v1/node with the given
// headers (name/value pairs) and returns the status, the headers and the
// body.
func getNodeInfo(t testing.TB, addr, query string, headers ...string) (int, http.Header, []byte) {
	t.Helper()
	u := "http://" + addr + nodeInfoPath
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequest(http.MethodGet, u, nil)
	netMust(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := liClient.Do(req)
	netMust(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	netMust(t, err)
	return resp.StatusCode, resp.Header, body
}
