package testkit

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
)

// AddrEntry is a discovery:nodes entry for a trusted node hostUUID of
// cluster clusterUUID whose peer port is at hostPort.
func AddrEntry(hostUUID, clusterUUID, hostPort string) map[string]any {
	host, port, _ := net.SplitHostPort(hostPort)
	p, _ := net.LookupPort("tcp", port)
	return map[string]any{
		"hostUuid": hostUUID, "name": "peer-" + hostUUID[:8], "ip": host, "clusterUuid": clusterUUID,
		"trusted": true, "services": map[string]any{"wl": map[string]any{"port": p}},
	}
}

// BlackHole accepts TCP connections and never reads or answers.
type BlackHole struct {
	ID       string
	Ident    devpki.Identity
	ln       net.Listener
	Accepted atomic.Int32 // the connections it took
}

// NewBlackHole starts a black hole with an identity of its own on a
// loopback port until the test ends.
func NewBlackHole(t testing.TB) *BlackHole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Must(t, err)
	h := &BlackHole{ID: devpki.NewUUID(), Ident: Mint(t, devpki.NewUUID()), ln: ln}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.Accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return h
}

// Entry is the black hole's discovery:nodes entry.
func (h *BlackHole) Entry() map[string]any {
	return AddrEntry(h.ID, h.Ident.Principal, h.ln.Addr().String())
}

// PeerRequest is one request the peer was sent.
type PeerRequest struct {
	At, Answered time.Time
	IDs          []string // the workload of each frame
	Status       int
}

// DeferringPeer is a peer written for the tests: a TLS server presenting
// its pinned identity that answers its first requests 503 with a
// Retry-After, and 200 after them, recording every request.
type DeferringPeer struct {
	ID       string
	Ident    devpki.Identity
	Addr     string
	Batching bool // it advertises batches

	mu         sync.Mutex // guards the fields below
	deferLeft  int        // requests still to answer 503
	retryAfter string     // their Retry-After
	requests   []PeerRequest
}

// NewDeferringPeer starts a deferring peer presenting ident on a loopback
// port until the test ends: it answers its first deferN requests 503 with
// retryAfter.
func NewDeferringPeer(t testing.TB, ident devpki.Identity, batching bool, deferN int, retryAfter string) *DeferringPeer {
	t.Helper()
	p := &DeferringPeer{ID: ident.Principal, Ident: ident, Batching: batching, deferLeft: deferN, retryAfter: retryAfter}
	p.Addr = ServeStandInPeer(t, ident, p.Serve)
	return p
}

// Serve answers one request to the peer port: 503 while deferring, else 200.
func (p *DeferringPeer) Serve(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, _ := io.ReadAll(r.Body)
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	frames := [][]byte{body}
	if mt == PeerBatchContentType {
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
	if p.Batching {
		w.Header().Set(PeerBatchHeader, PeerBatchAdvert)
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
	p.requests = append(p.requests, PeerRequest{At: at, Answered: time.Now(), IDs: ids, Status: status})
	p.mu.Unlock()
	switch {
	case status != http.StatusOK:
		http.Error(w, "busy", status)
	case mt == PeerBatchContentType:
		results := make([]peerBatchResult, len(frames))
		for i := range results {
			results[i].Status = http.StatusOK
		}
		json.NewEncoder(w).Encode(peerBatchAnswer{Results: results})
	default:
		io.WriteString(w, "ok\n")
	}
}

// SetDefer makes the peer answer its next n requests 503 with retryAfter.
func (p *DeferringPeer) SetDefer(n int, retryAfter string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deferLeft, p.retryAfter = n, retryAfter
}

// Log returns every request the peer was sent, in order.
func (p *DeferringPeer) Log() []PeerRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.requests)
}

// Accepted is the workload of every frame the peer answered 200, in order.
func (p *DeferringPeer) Accepted() []string {
	var out []string
	for _, r := range p.Log() {
		if r.Status == http.StatusOK {
			out = append(out, r.IDs...)
		}
	}
	return out
}

// CheckWaitsHonoured fails unless every request after a 503 came at least
// wait after that 503 was answered, and returns how many 503s there were.
func (p *DeferringPeer) CheckWaitsHonoured(t testing.TB, wait time.Duration) int {
	t.Helper()
	reqs := p.Log()
	deferred := 0
	for i, r := range reqs {
		if r.Status != http.StatusServiceUnavailable {
			continue
		}
		deferred++
		if i+1 < len(reqs) {
			if gap := reqs[i+1].At.Sub(r.Answered); gap < wait {
				t.Fatalf("request %d came %v after the 503 %d asking for %v", i+1, gap, i, wait)
			}
		}
	}
	return deferred
}

// BusyAnswer is what a request got back.
type BusyAnswer struct {
	Status            int
	Text, RetryAfter  string
	ConnectionClosing bool
	// Served runs from the request's last byte written to the answer's
	// first byte read: the daemon's decision, without the dial, the
	// handshake and the wait for an accept that a loaded machine adds.
	Served time.Duration
}

// DoBusyAnswer posts body to url and returns the answer, or a zero answer
// (with the error logged) when none came within.
func DoBusyAnswer(t *testing.T, within time.Duration, c *http.Client, url, contentType string, body []byte) BusyAnswer {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return BusyAnswer{}
	}
	req.Header.Set("Content-Type", contentType)
	// The trace's callbacks run on the transport's goroutines.
	var wrote, answered atomic.Int64
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { wrote.Store(time.Now().UnixNano()) },
		GotFirstResponseByte: func() { answered.Store(time.Now().UnixNano()) },
	}))
	resp, err := c.Do(req)
	if err != nil {
		t.Logf("POST %s: %v", url, err)
		return BusyAnswer{}
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	// A daemon that refuses before reading the body can answer before the
	// transport reports the request written (or at all): Served is then 0,
	// since the answer did not wait for the request's last byte.
	var served time.Duration
	if w, a := wrote.Load(), answered.Load(); w != 0 && a > w {
		served = time.Duration(a - w)
	}
	return BusyAnswer{Status: resp.StatusCode, Text: strings.TrimSpace(string(text)), RetryAfter: resp.Header.Get("Retry-After"),
		ConnectionClosing: resp.Close, Served: served}
}

// Handshake dials addr and completes a TLS handshake presenting ident.
func Handshake(addr string, ident *devpki.Identity) error {
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

// PeerClient returns an HTTPS client that presents ident (no certificate
// when nil) and accepts only a server presenting serverDER.
func PeerClient(t testing.TB, ident *devpki.Identity, serverDER []byte) *http.Client {
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
		Must(t, err)
		cfg.Certificates = []tls.Certificate{cert}
	}
	tr := &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: WaitTimeout}
}
