package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
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
	"nvpair-workload-manager/internal/wireframe"
)

// The peers the tests play against the daemon's peer port, and the stand-in
// peers the daemon sends to: a client holding a node's key, posting single
// frames and batches; and HTTPS servers pinned by the daemon that record,
// hold or refuse what it sends, as a stock peer or a slow one would.

func netMust(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func netMint(t testing.TB, principal string) devpki.Identity {
	t.Helper()
	id, err := devpki.Mint(principal)
	netMust(t, err)
	return id
}

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
		netMust(t, err)
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
	netMust(t, err)
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
	netMust(t, err)
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
	netMust(t, err)
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

func netDiscardLog() *log.Logger { return log.New(io.Discard, "", 0) }

// serveStandInPeer serves handler over TLS on a loopback port of its own,
// presenting ident's certificate and asking for the client's, as a peer's
// server does (the pin checks are the stand-in's own), until the test
// ends; it returns the address it bound.
func serveStandInPeer(t testing.TB, ident devpki.Identity, handler http.HandlerFunc) string {
	t.Helper()
	cert, err := ident.TLSCertificate()
	netMust(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	netMust(t, err)
	srv := &http.Server{
		Handler:   handler,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert},
		ErrorLog:  netDiscardLog(),
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// hbEvent is one frame a recording peer received: "fresh", "resync" or
// "remove", and the workload id.
type hbEvent struct{ kind, id string }

// hbSink is a pinned peer that records every frame it receives in arrival
// order. A batching sink advertises batches and takes them, as this daemon
// does; a single-frame sink advertises nothing and takes one frame per
// request, as the stock daemon does. delay holds each request, so a
// heartbeat pass is slow enough to be caught in the middle.
type hbSink struct {
	id       string
	ident    devpki.Identity
	addr     string
	batching bool
	delay    time.Duration

	mu     sync.Mutex // guards events, batches, final and failOnce
	events []hbEvent
	// final is each workload's last state the sink took, "removed" after
	// a removal: what a peer's broker would show.
	final    map[string]string
	batches  int             // requests that carried more than one frame
	refused  int             // multi-frame requests a single-frame sink refused
	failOnce map[string]bool // fresh frames answered 500 the first time
	// failResync answers every re-assertion 500; rejectResync answers the
	// re-assertion of that id 400. tries counts re-assertions received,
	// whatever their answer.
	failResync   bool
	rejectResync string
	tries        int
	// refuseOrigin answers every frame of that id 403 for its origin, as
	// the peer port refuses a peer that speaks for another node;
	// originTries counts them by kind.
	refuseOrigin string
	originTries  map[string]int

	// hold, when set, is a frame kind and id: the first request carrying
	// that frame is held for holdFor before any of its frames is recorded,
	// and holding is closed when the hold begins. Frames that arrive on
	// another connection meanwhile are recorded first: a request caught in
	// flight.
	hold     hbEvent
	holdFor  time.Duration
	holding  chan struct{}
	holdDone bool

	// gate, when set, holds every request until it is closed (release);
	// arrived counts the requests that reached the sink, held or not.
	gate    chan struct{}
	arrived int
}

func newHBSink(t *testing.T, batching bool, delay time.Duration) *hbSink {
	t.Helper()
	s := &hbSink{id: devpki.NewUUID(), ident: netMint(t, devpki.NewUUID()), batching: batching, delay: delay, failOnce: map[string]bool{}}
	s.addr = serveStandInPeer(t, s.ident, s.serve)
	return s
}

func (s *hbSink) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.arrived++
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	if s.delay > 0 {
		time.Sleep(s.delay) // a slow peer, by design of the test
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	isBatch := mt == peerBatchContentType
	if s.batching {
		w.Header().Set(peerBatchHeader, peerBatchAdvert)
	}
	if isBatch && !s.batching {
		s.mu.Lock()
		s.refused++
		s.mu.Unlock()
		http.Error(w, "not a JSON-RPC frame", http.StatusBadRequest) // what a stock daemon answers
		return
	}
	frames := [][]byte{body}
	if isBatch {
		frames = bytes.Split(bytes.TrimSuffix(body, []byte("\n")), []byte("\n"))
	}
	s.holdIfFirst(frames)
	if !isBatch {
		if status := s.record(body); status != http.StatusOK {
			http.Error(w, sinkReason(status), status)
			return
		}
		io.WriteString(w, "ok\n")
		return
	}
	var results []peerBatchResult
	failed := false
	for _, f := range frames {
		switch {
		case failed:
			results = append(results, peerBatchResult{Status: http.StatusServiceUnavailable, Reason: reasonNotAttempted})
		default:
			st := s.record(f)
			failed = st >= 500
			res := peerBatchResult{Status: st}
			if st != http.StatusOK {
				res.Reason = sinkReason(st)
			}
			results = append(results, res)
		}
	}
	s.mu.Lock()
	s.batches++
	s.mu.Unlock()
	b, _ := json.Marshal(peerBatchAnswer{Results: results})
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// holdIfFirst holds the request when it is the first that carries the
// frame the sink was told to hold.
func (s *hbSink) holdIfFirst(frames [][]byte) {
	s.mu.Lock()
	if s.holding == nil || s.holdDone || !slices.ContainsFunc(frames, func(f []byte) bool { ev, _ := parseHBEvent(f); return ev == s.hold }) {
		s.mu.Unlock()
		return
	}
	s.holdDone = true
	close(s.holding)
	d := s.holdFor
	s.mu.Unlock()
	time.Sleep(d) // the request in flight, by design of the test
}

// parseHBEvent reads what kind of frame frame is, and for which id.
func parseHBEvent(frame []byte) (hbEvent, bool) {
	var f struct {
		Method string `json:"method"`
		Params struct {
			Resync       bool `json:"resync"`
			WorkloadInfo struct {
				ID string `json:"id"`
			} `json:"workloadInfo"`
			WorkloadID string `json:"workloadId"`
		} `json:"params"`
	}
	if err := json.Unmarshal(frame, &f); err != nil {
		return hbEvent{}, false
	}
	ev := hbEvent{"fresh", f.Params.WorkloadInfo.ID}
	switch {
	case f.Method == wireframe.MethodRemove:
		ev = hbEvent{"remove", f.Params.WorkloadID}
	case f.Params.Resync:
		ev.kind = "resync"
	}
	return ev, true
}

// record notes one frame and returns the status to answer it with.
func (s *hbSink) record(frame []byte) int {
	ev, ok := parseHBEvent(frame)
	if !ok {
		return http.StatusBadRequest
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuseOrigin != "" && ev.id == s.refuseOrigin {
		if s.originTries == nil {
			s.originTries = map[string]int{}
		}
		s.originTries[ev.kind]++
		return http.StatusForbidden
	}
	if ev.kind == "resync" {
		s.tries++
		switch {
		case s.failResync:
			return http.StatusInternalServerError
		case s.rejectResync == ev.id:
			return http.StatusBadRequest
		}
	}
	if ev.kind == "fresh" && s.failOnce[ev.id] {
		delete(s.failOnce, ev.id)
		return http.StatusInternalServerError
	}
	s.events = append(s.events, ev)
	if s.final == nil {
		s.final = map[string]string{}
	}
	s.final[ev.id] = "removed"
	if ev.kind != "remove" {
		var f struct {
			Params struct {
				WorkloadInfo struct {
					State string `json:"state"`
				} `json:"workloadInfo"`
			} `json:"params"`
		}
		_ = json.Unmarshal(frame, &f)
		s.final[ev.id] = f.Params.WorkloadInfo.State
	}
	return http.StatusOK
}

// sinkReason is the reason the sink gives with a status: a 403 is always
// a refusal for origin.
func sinkReason(status int) string {
	if status == http.StatusForbidden {
		return originRefusalPrefix + "the sink refuses this workload"
	}
	return "failed"
}

func (s *hbSink) snapshot() []hbEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// count returns how many events of kind the sink received for id ("" for
// any id).
func (s *hbSink) count(kind, id string) int {
	n := 0
	for _, e := range s.snapshot() {
		if e.kind == kind && (id == "" || e.id == id) {
			n++
		}
	}
	return n
}

// holdAll makes every request wait, unrecorded, until release.
func (s *hbSink) holdAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = make(chan struct{})
}

// requests is how many requests reached the sink so far, held or not.
func (s *hbSink) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arrived
}

// finalState is the last state the sink took for id ("removed" after a
// removal, "" when it has none).
func (s *hbSink) finalState(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.final[id]
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
	p.addr = serveStandInPeer(t, ident, p.serve)
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
