package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/devpki"
	"nvpair-workload-manager/internal/testframe"
	"nvpair-workload-manager/internal/testkit"
)

// The peers the tests play against the daemon's peer port, and the stand-in
// peers the daemon sends to: a client holding a node's key, posting single
// frames and batches; and HTTPS servers pinned by the daemon that record,
// hold or refuse what it sends, as a stock peer or a slow one would.

// netHandshake dials addr and completes a TLS handshake presenting ident.
func netHandshake(addr string, ident *devpki.Identity) error {
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
	if ident != nil {
		cert, err := ident.TLSCertificate()
		if err != nil {
			return err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: cfg}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// netPeerClient returns an HTTPS client that presents ident (no certificate
// when nil) and accepts only a server presenting serverDER.
func netPeerClient(t testing.TB, ident *devpki.Identity, serverDER []byte) *http.Client {
	t.Helper()
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by the pin comparison below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, serverDER) {
				return errors.New("server certificate is not the expected one")
			}
			return nil
		},
	}
	if ident != nil {
		cert, err := ident.TLSCertificate()
		testkit.Must(t, err)
		cfg.Certificates = []tls.Certificate{cert}
	}
	tr := &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: testkit.WaitTimeout}
}

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

// netAddrEntry is a discovery entry for a peer listening at hostPort.
func netAddrEntry(hostUUID, clusterUUID, hostPort string) map[string]any {
	host, port, _ := net.SplitHostPort(hostPort)
	p, _ := net.LookupPort("tcp", port)
	return map[string]any{
		"hostUuid": hostUUID, "name": "peer-" + hostUUID[:8], "ip": host, "clusterUuid": clusterUUID,
		"trusted": true, "services": map[string]any{"wl": map[string]any{"port": p}},
	}
}

// ids is count workload ids with a prefix, in order.
func ids(prefix string, count int) []string {
	out := make([]string, count)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

// peerRequest is one request the peer was sent.
type peerRequest struct {
	at, answered time.Time
	ids          []string // the workload of each frame
	status       int
}

// deferringPeer is a peer written for the tests: a TLS server presenting
// its pinned identity that answers its first requests 503 with a
// Retry-After, and 200 after them, recording every request.
type deferringPeer struct {
	id       string
	ident    devpki.Identity
	addr     string
	batching bool // it advertises batches

	mu         sync.Mutex // guards the fields below
	deferLeft  int        // requests still to answer 503
	retryAfter string     // their Retry-After
	requests   []peerRequest
}

func newDeferringPeer(t testing.TB, ident devpki.Identity, batching bool, deferN int, retryAfter string) *deferringPeer {
	t.Helper()
	p := &deferringPeer{id: ident.Principal, ident: ident, batching: batching, deferLeft: deferN, retryAfter: retryAfter}
	p.addr = testkit.ServeStandInPeer(t, ident, p.serve)
	return p
}

func (p *deferringPeer) serve(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, _ := io.ReadAll(r.Body)
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	frames := [][]byte{body}
	if mt == peerBatchContentType {
		frames = bytes.Split(bytes.TrimSuffix(body, []byte("\n")), []byte("\n"))
	}
	var ids []string
	for _, f := range frames {
		var v struct {
			Params struct {
				WorkloadInfo struct {
					ID string `json:"id"`
				} `json:"workloadInfo"`
			} `json:"params"`
		}
		_ = json.Unmarshal(f, &v)
		ids = append(ids, v.Params.WorkloadInfo.ID)
	}
	if p.batching {
		w.Header().Set(peerBatchHeader, peerBatchAdvert)
	}
	p.mu.Lock()
	status := http.StatusOK
	if p.deferLeft > 0 {
		p.deferLeft--
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", p.retryAfter)
	}
	// Recorded before the answer is written: the sender cannot have it
	// any earlier.
	p.requests = append(p.requests, peerRequest{at: at, answered: time.Now(), ids: ids, status: status})
	p.mu.Unlock()
	switch {
	case status != http.StatusOK:
		http.Error(w, "busy", status)
	case mt == peerBatchContentType:
		results := make([]peerBatchResult, len(frames))
		for i := range results {
			results[i].Status = http.StatusOK
		}
		json.NewEncoder(w).Encode(peerBatchAnswer{Results: results})
	default:
		io.WriteString(w, "ok\n")
	}
}

// setDefer makes the peer answer its next n requests 503 with retryAfter.
func (p *deferringPeer) setDefer(n int, retryAfter string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deferLeft, p.retryAfter = n, retryAfter
}

func (p *deferringPeer) log() []peerRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.requests)
}

// accepted is the workload of every frame the peer answered 200, in order.
func (p *deferringPeer) accepted() []string {
	var out []string
	for _, r := range p.log() {
		if r.status == http.StatusOK {
			out = append(out, r.ids...)
		}
	}
	return out
}

// checkWaitsHonoured fails unless every request after a 503 came at least
// wait after that 503 was answered, and returns how many 503s there were.
func (p *deferringPeer) checkWaitsHonoured(t testing.TB, wait time.Duration) int {
	t.Helper()
	reqs := p.log()
	deferred := 0
	for i, r := range reqs {
		if r.status != http.StatusServiceUnavailable {
			continue
		}
		deferred++
		if i+1 < len(reqs) {
			if gap := reqs[i+1].at.Sub(r.answered); gap < wait {
				t.Fatalf("request %d came %v after the 503 %d asking for %v", i+1, gap, i, wait)
			}
		}
	}
	return deferred
}
