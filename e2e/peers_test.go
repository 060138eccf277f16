package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
)

// The peers the tests play against the daemon's peer port, and the stand-in
// peers the daemon sends to: a client holding a node's key, posting single
// frames and batches; and HTTPS servers pinned by the daemon that record,
// hold or refuse what it sends, as a stock peer or a slow one would.

// netPostAnswer posts body to the peer endpoint at addr and returns the
// status and the answer's text.
func netPostAnswer(t testing.TB, c *http.Client, addr string, body []byte) (int, string) {
	t.Helper()
	resp, err := c.Post("https://"+addr+peerEventsPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST to %s: %v", addr, err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	testkit.Must(t, err)
	return resp.StatusCode, strings.TrimSpace(string(text))
}

// netAnswer is an answer of the peer port; results is the decoded batch
// answer when it is one.
type netAnswer struct {
	status  int
	header  http.Header
	text    string
	results []peerBatchResult
}

// netSend sends one request to the peer port and reads its answer.
func netSend(t testing.TB, c *http.Client, addr, method, path, contentType string, body []byte) netAnswer {
	t.Helper()
	return netDo(t, c, addr, method, path, contentType, body, false)
}

func netDo(t testing.TB, c *http.Client, addr, method, path, contentType string, body []byte, chunked bool) netAnswer {
	t.Helper()
	req, err := http.NewRequest(method, "https://"+addr+path, bytes.NewReader(body))
	testkit.Must(t, err)
	if chunked {
		req.ContentLength = -1
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	testkit.Must(t, err)
	a := netAnswer{status: resp.StatusCode, header: resp.Header, text: string(text)}
	if resp.StatusCode == http.StatusOK && resp.Header.Get("Content-Type") == "application/json" {
		var ans peerBatchAnswer
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ans); err != nil {
			t.Fatalf("batch answer %q: %v", text, err)
		}
		a.results = ans.Results
	}
	return a
}

// netPostBatch posts elems as one batch, each on its own line.
func netPostBatch(t testing.TB, c *http.Client, addr string, elems ...[]byte) netAnswer {
	t.Helper()
	return netSend(t, c, addr, http.MethodPost, peerEventsPath, peerBatchContentType, testframe.Batch(elems...))
}

// ids is count workload ids with a prefix, in order.
func ids(prefix string, count int) []string {
	out := make([]string, count)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}
