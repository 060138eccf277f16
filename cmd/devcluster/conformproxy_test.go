package main

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// conformProxy sits between a producer and its node's ingress and records
// every request the producer makes and the answer it got: the conformance
// run's evidence of what the client sent, in which order, and after which
// answer. It forwards each request unchanged to the ingress, and copies the
// answer back. Two faults are its own:
//
//   - refusing: every request's connection is closed before any answer, the
//     transport error a producer sees while its daemon is away;
//   - the ingress unreachable (its daemon restarting): the same, so the
//     producer sees what it would without the proxy, a connection that
//     gives no answer.
type conformProxy struct {
	upstream string // the ingress's HOST:PORT
	addr     string // the proxy's own, for the producer
	srv      *http.Server
	client   *http.Client
	refusing atomic.Bool

	mu   sync.Mutex // guards reqs
	reqs []proxyRecord
}

// Outcomes of a proxied request.
const (
	outcomeAnswered = "answered" // the ingress answered, and the answer was passed on
	outcomeRefused  = "refused"  // the proxy was refusing: closed without an answer
	outcomeNoIngres = "no ingress"
)

// proxyRecord is one request through the proxy.
type proxyRecord struct {
	HTTPMethod  string
	Path        string
	FrameMethod string // the JSON-RPC method of an event post
	ID          string // the workload's id (a removal's workloadId)
	Seq         int64  // a removal's (it has none) is after every other frame's; -1 when a lifecycle frame has none
	State       string
	Lease       string // the Workload-Lease header
	Body        string
	Start, End  time.Time
	Outcome     string
	Status      int           // when answered
	RetryAfter  time.Duration // the answer's Retry-After, when whole seconds
}

func newConformProxy(t *testing.T, upstream string) *conformProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &conformProxy{
		upstream: upstream,
		addr:     ln.Addr().String(),
		client: &http.Client{
			Timeout:   30 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
		},
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go p.srv.Serve(ln)
	t.Cleanup(func() {
		p.srv.Close()
		p.client.CloseIdleConnections()
	})
	return p
}

func (p *conformProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := proxyRecord{HTTPMethod: r.Method, Path: r.URL.Path, Start: time.Now(), Seq: -1, Lease: r.Header.Get("Workload-Lease")}
	body, err := io.ReadAll(io.LimitReader(r.Body, 2<<20))
	if err != nil {
		cut(w)
		return
	}
	rec.Body = string(body)
	describeFrame(&rec, body)
	if p.refusing.Load() {
		rec.Outcome, rec.End = outcomeRefused, time.Now()
		p.add(rec)
		cut(w)
		return
	}
	req, err := http.NewRequest(r.Method, "http://"+p.upstream+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		cut(w)
		return
	}
	for _, h := range []string{"Content-Type", "Workload-Lease", "Accept"} {
		if v := r.Header.Values(h); len(v) > 0 {
			req.Header[h] = v
		}
	}
	resp, err := p.client.Do(req)
	if err != nil {
		rec.Outcome, rec.End = outcomeNoIngres, time.Now()
		p.add(rec)
		cut(w)
		return
	}
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 2<<20))
	resp.Body.Close()
	for _, h := range []string{"Content-Type", "Retry-After", "Allow"} {
		if v := resp.Header.Values(h); len(v) > 0 {
			w.Header()[h] = v
		}
	}
	rec.Outcome, rec.Status = outcomeAnswered, resp.StatusCode
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		rec.RetryAfter = time.Duration(s) * time.Second
	}
	// Recorded before the producer can read the answer, so a retry the
	// answer provokes always starts after this record ends.
	rec.End = time.Now()
	p.add(rec)
	w.WriteHeader(resp.StatusCode)
	w.Write(answer)
}

func (p *conformProxy) add(rec proxyRecord) {
	p.mu.Lock()
	p.reqs = append(p.reqs, rec)
	p.mu.Unlock()
}

// records returns every request recorded so far, in the order each ended.
func (p *conformProxy) records() []proxyRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]proxyRecord(nil), p.reqs...)
}

// cut closes the request's connection without an answer.
func cut(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetLinger(0) // a reset, as from a process that died
			}
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// describeFrame fills in what an event post's body says: its method, the
// workload's id, state and seq.
func describeFrame(rec *proxyRecord, body []byte) {
	var f struct {
		Method string `json:"method"`
		Params struct {
			WorkloadID   string `json:"workloadId"`
			WorkloadInfo struct {
				ID    string   `json:"id"`
				State string   `json:"state"`
				Seq   *float64 `json:"seq"`
			} `json:"workloadInfo"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &f) != nil {
		return
	}
	rec.FrameMethod = f.Method
	rec.ID = f.Params.WorkloadInfo.ID
	if rec.ID == "" {
		rec.ID = f.Params.WorkloadID
	}
	rec.State = f.Params.WorkloadInfo.State
	switch {
	case f.Params.WorkloadID != "":
		rec.Seq = math.MaxInt64 // nothing of the job follows its removal
	case f.Params.WorkloadInfo.Seq != nil:
		rec.Seq = int64(*f.Params.WorkloadInfo.Seq)
	}
}
