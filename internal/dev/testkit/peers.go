package testkit

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"mime"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/wireframe"
)

// The peer port as a stand-in peer speaks it, written as values (as e2e
// holds the daemon's contract): a test that names one states what the
// daemon must keep.
const (
	PeerBatchHeader      = "Nvpair-Wl-Batch"      // a node's batch advertisement
	PeerBatchContentType = "application/x-ndjson" // a batch: one frame a line
	// PeerBatchAdvert is the daemon's own advertisement: at most 256 frames
	// and 1 MiB (wireframe.MaxBytes) a batch. The stand-in peers give it.
	PeerBatchAdvert = "max-frames=256, max-bytes=1048576"
	// ReasonNotAttempted is the reason of a batch result after an element
	// that failed.
	ReasonNotAttempted = "not attempted: an earlier element failed"
	// OriginRefusalPrefix starts the reason of a frame refused for its
	// origin: a pinned peer naming a node its principal is not listed for.
	OriginRefusalPrefix = "origin refused: "
)

// peerBatchAnswer is the JSON answer to a batch: one result an element.
type peerBatchAnswer struct {
	Results []peerBatchResult `json:"results"`
}

// peerBatchResult is what became of one element: the status a single
// request carrying it would have been answered with, or 503 with
// ReasonNotAttempted for one after an element that failed.
type peerBatchResult struct {
	Status int    `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// Must fails the test on err.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Mint mints a node identity for principal (devpki.Mint), failing the
// test on an error.
func Mint(t testing.TB, principal string) devpki.Identity {
	t.Helper()
	id, err := devpki.Mint(principal)
	Must(t, err)
	return id
}

// DiscardLog is a server's error log that drops everything.
func DiscardLog() *log.Logger { return log.New(io.Discard, "", 0) }

// ServeStandInPeer serves handler over TLS on a loopback port of its own,
// presenting ident's certificate and asking for the client's, as a peer's
// server does (the pin checks are the stand-in's own), until the test
// ends; it returns the address it bound.
func ServeStandInPeer(t testing.TB, ident devpki.Identity, handler http.HandlerFunc) string {
	t.Helper()
	cert, err := ident.TLSCertificate()
	Must(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Must(t, err)
	srv := &http.Server{
		Handler:   handler,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert},
		ErrorLog:  DiscardLog(),
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// NewHBSink starts a recording peer (HBSink) with an identity of its own
// on a loopback port until the test ends.
func NewHBSink(t testing.TB, batching bool, delay time.Duration) *HBSink {
	t.Helper()
	s := &HBSink{ID: devpki.NewUUID(), Ident: Mint(t, devpki.NewUUID()), Batching: batching, Delay: delay, FailOnce: map[string]bool{}}
	s.Addr = ServeStandInPeer(t, s.Ident, s.Serve)
	return s
}

// HBEvent is one frame a recording peer received: "fresh", "resync" or
// "remove", and the workload id.
type HBEvent struct{ Kind, ID string }

// HBSink is a pinned peer that records every frame it receives in arrival
// order. A batching sink advertises batches and takes them, as this daemon
// does; a single-frame sink advertises nothing and takes one frame per
// request, as the stock daemon does. Delay holds each request, so a
// heartbeat pass is slow enough to be caught in the middle.
type HBSink struct {
	ID       string
	Ident    devpki.Identity
	Addr     string
	Batching bool
	Delay    time.Duration

	mu     sync.Mutex // guards events, batches, final and FailOnce
	events []HBEvent
	// final is each workload's last state the sink took, "removed" after
	// a removal: what a peer's broker would show.
	final    map[string]string
	batches  int             // requests that carried more than one frame
	refused  int             // multi-frame requests a single-frame sink refused
	FailOnce map[string]bool // fresh frames answered 500 the first time
	// FailResync answers every re-assertion 500; RejectResync answers the
	// re-assertion of that id 400. tries counts re-assertions received,
	// whatever their answer.
	FailResync   bool
	RejectResync string
	tries        int
	// RefuseOrigin answers every frame of that id 403 for its origin, as
	// the peer port refuses a peer that speaks for another node;
	// originTries counts them by kind.
	RefuseOrigin string
	originTries  map[string]int
	// failing (SetFailing) and failAll (SetFailAll) answer frames 500
	// "broker unavailable", as the peer port answers a frame whose broker
	// write failed (peerserver.Server.HandleFrame): one workload's frames,
	// fresh and re-asserted, or every frame. In a batch the elements after
	// such a one are answered 503, not attempted, as peerwire.RunBatch
	// does. failBatchHolding answers a batch holding that workload 500 as
	// a whole, as the peer port answers a batch whose answer it cannot
	// write per element (peerserver's servePeerBatch). failed counts the
	// frames and batches so answered.
	failing          map[string]bool
	failAll          bool
	failBatchHolding string
	failed           int

	// hold, when set, is a frame kind and id: the first request carrying
	// that frame is held for holdFor before any of its frames is recorded,
	// and holding is closed when the hold begins. Frames that arrive on
	// another connection meanwhile are recorded first: a request caught in
	// flight.
	hold     HBEvent
	holdFor  time.Duration
	holding  chan struct{}
	holdDone bool

	// gate, when set, holds every request until it is closed (release);
	// arrived counts the requests that reached the sink, held or not.
	gate    chan struct{}
	arrived int
}

// Serve answers one request to the peer port as the sink is set to.
func (s *HBSink) Serve(w http.ResponseWriter, r *http.Request) {
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
	if s.Delay > 0 {
		time.Sleep(s.Delay) // a slow peer, by design of the test
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	isBatch := mt == PeerBatchContentType
	if s.Batching {
		w.Header().Set(PeerBatchHeader, PeerBatchAdvert)
	}
	if isBatch && !s.Batching {
		s.mu.Lock()
		s.refused++
		s.mu.Unlock()
		http.Error(w, "not a JSON-RPC frame", http.StatusBadRequest) // what a stock daemon answers
		return
	}
	frames := [][]byte{body}
	if isBatch {
		frames = bytes.Split(bytes.TrimSuffix(body, []byte("\n")), []byte("\n"))
		if s.failsBatch(frames) {
			http.Error(w, "answer not encoded", http.StatusInternalServerError)
			return
		}
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
			results = append(results, peerBatchResult{Status: http.StatusServiceUnavailable, Reason: ReasonNotAttempted})
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
func (s *HBSink) holdIfFirst(frames [][]byte) {
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
func parseHBEvent(frame []byte) (HBEvent, bool) {
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
		return HBEvent{}, false
	}
	ev := HBEvent{"fresh", f.Params.WorkloadInfo.ID}
	switch {
	case f.Method == wireframe.MethodRemove:
		ev = HBEvent{"remove", f.Params.WorkloadID}
	case f.Params.Resync:
		ev.Kind = "resync"
	}
	return ev, true
}

// record notes one frame and returns the status to answer it with.
func (s *HBSink) record(frame []byte) int {
	ev, ok := parseHBEvent(frame)
	if !ok {
		return http.StatusBadRequest
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failAll || s.failing[ev.ID] {
		s.failed++
		return http.StatusInternalServerError
	}
	if s.RefuseOrigin != "" && ev.ID == s.RefuseOrigin {
		if s.originTries == nil {
			s.originTries = map[string]int{}
		}
		s.originTries[ev.Kind]++
		return http.StatusForbidden
	}
	if ev.Kind == "resync" {
		s.tries++
		switch {
		case s.FailResync:
			return http.StatusInternalServerError
		case s.RejectResync == ev.ID:
			return http.StatusBadRequest
		}
	}
	if ev.Kind == "fresh" && s.FailOnce[ev.ID] {
		delete(s.FailOnce, ev.ID)
		return http.StatusInternalServerError
	}
	s.events = append(s.events, ev)
	if s.final == nil {
		s.final = map[string]string{}
	}
	s.final[ev.ID] = "removed"
	if ev.Kind != "remove" {
		var f struct {
			Params struct {
				WorkloadInfo struct {
					State string `json:"state"`
				} `json:"workloadInfo"`
			} `json:"params"`
		}
		_ = json.Unmarshal(frame, &f)
		s.final[ev.ID] = f.Params.WorkloadInfo.State
	}
	return http.StatusOK
}

// sinkReason is the reason the sink gives with a status: a 403 is always
// a refusal for origin, a 500 the peer port's failed broker write.
func sinkReason(status int) string {
	switch status {
	case http.StatusForbidden:
		return OriginRefusalPrefix + "the sink refuses this workload"
	case http.StatusInternalServerError:
		return "broker unavailable"
	}
	return "failed"
}

// SetFailing makes the sink answer every frame of workload id 500 (on),
// or take them again (off).
func (s *HBSink) SetFailing(id string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing == nil {
		s.failing = map[string]bool{}
	}
	s.failing[id] = on
}

// SetFailAll makes the sink answer every frame 500 (on), or take them
// again (off): a peer whose broker is gone.
func (s *HBSink) SetFailAll(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failAll = on
}

// SetFailBatchHolding makes the sink answer every batch that holds a frame
// of workload id 500 as a whole ("" for none).
func (s *HBSink) SetFailBatchHolding(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failBatchHolding = id
}

// failsBatch reports whether the sink answers this batch 500 as a whole.
func (s *HBSink) failsBatch(frames [][]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failBatchHolding == "" {
		return false
	}
	for _, f := range frames {
		if ev, _ := parseHBEvent(f); ev.ID == s.failBatchHolding {
			s.failed++
			return true
		}
	}
	return false
}

// Failed is how many frames (and whole batches) the sink answered 500 as
// SetFailing, SetFailAll and SetFailBatchHolding told it to.
func (s *HBSink) Failed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// Snapshot returns the events received so far, in arrival order.
func (s *HBSink) Snapshot() []HBEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// Count returns how many events of kind the sink received for id ("" for
// any id).
func (s *HBSink) Count(kind, id string) int {
	n := 0
	for _, e := range s.Snapshot() {
		if e.Kind == kind && (id == "" || e.ID == id) {
			n++
		}
	}
	return n
}

// HoldAll makes every request wait, unrecorded, until release.
func (s *HBSink) HoldAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = make(chan struct{})
}

// Requests is how many requests reached the sink so far, held or not.
func (s *HBSink) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arrived
}

// FinalState is the last state the sink took for id ("removed" after a
// removal, "" when it has none).
func (s *HBSink) FinalState(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.final[id]
}

// Release lets the held requests, and every later one, through.
func (s *HBSink) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
}

// HoldFirst makes the sink hold the first request that carries ev for d.
// It returns a channel closed when that request arrives.
func (s *HBSink) HoldFirst(ev HBEvent, d time.Duration) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold, s.holdFor, s.holding = ev, d, make(chan struct{})
	return s.holding
}

// ResyncTries is how many re-assertions the sink was sent.
func (s *HBSink) ResyncTries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tries
}

// OriginRefusals is how many frames of kind the sink refused for origin.
func (s *HBSink) OriginRefusals(kind string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.originTries[kind]
}

// FreshIDs returns the ids of the fresh frames received, in arrival order.
func (s *HBSink) FreshIDs() []string {
	var ids []string
	for _, e := range s.Snapshot() {
		if e.Kind == "fresh" {
			ids = append(ids, e.ID)
		}
	}
	return ids
}

// BatchCounts returns the multi-frame requests taken and refused.
func (s *HBSink) BatchCounts() (taken, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.batches, s.refused
}
