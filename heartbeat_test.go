package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/devpki"
	"nvpair-workload-manager/internal/peersend"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/testframe"
	"nvpair-workload-manager/internal/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

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

// release lets the held requests, and every later one, through.
func (s *hbSink) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
}

// holdFirst makes the sink hold the first request that carries ev for d.
// It returns a channel closed when that request arrives.
func (s *hbSink) holdFirst(ev hbEvent, d time.Duration) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold, s.holdFor, s.holding = ev, d, make(chan struct{})
	return s.holding
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

// resyncTries is how many re-assertions the sink was sent.
func (s *hbSink) resyncTries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tries
}

func newHBSink(t *testing.T, batching bool, delay time.Duration) *hbSink {
	t.Helper()
	s := &hbSink{id: devpki.NewUUID(), ident: netMint(t, devpki.NewUUID()), batching: batching, delay: delay, failOnce: map[string]bool{}}
	s.addr = serveStandInPeer(t, s.ident, s.serve)
	return s
}

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
	isBatch := mt == peerwire.BatchContentType
	if s.batching {
		w.Header().Set(peerwire.BatchHeader, peerwire.BatchAdvert)
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
	var results []peerwire.BatchResult
	failed := false
	for _, f := range frames {
		switch {
		case failed:
			results = append(results, peerwire.BatchResult{Status: http.StatusServiceUnavailable, Reason: peerwire.ReasonNotAttempted})
		default:
			st := s.record(f)
			failed = st >= 500
			res := peerwire.BatchResult{Status: st}
			if st != http.StatusOK {
				res.Reason = sinkReason(st)
			}
			results = append(results, res)
		}
	}
	s.mu.Lock()
	s.batches++
	s.mu.Unlock()
	b, _ := json.Marshal(peerwire.BatchAnswer{Results: results})
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
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
		return peerwire.OriginRefusalPrefix + "the sink refuses this workload"
	}
	return "failed"
}

// originRefusals is how many frames of kind the sink refused for origin.
func (s *hbSink) originRefusals(kind string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.originTries[kind]
}

func (s *hbSink) snapshot() []hbEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// freshIDs returns the ids of the fresh frames received, in arrival order.
func (s *hbSink) freshIDs() []string {
	var ids []string
	for _, e := range s.snapshot() {
		if e.kind == "fresh" {
			ids = append(ids, e.id)
		}
	}
	return ids
}

// batchCounts returns the multi-frame requests taken and refused.
func (s *hbSink) batchCounts() (taken, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.batches, s.refused
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

// join pins the sink in n and makes it n's broadcast target.
func (s *hbSink) join(t *testing.T, n *testNode) {
	t.Helper()
	netMust(t, devpki.PinIdentity(n.clusterDir, s.ident))
	n.m.trust.Reload()
	netDiscover(n, netAddrEntry(s.id, s.ident.Principal, s.addr))
	n.waitTargets(1)
}

// trackRunning enters count running workloads hb-<i> through n's broker,
// in that order, and waits until the read loop has taken them all.
func trackRunning(t *testing.T, n *testNode, count int) []string {
	t.Helper()
	ids := make([]string, count)
	for i := range ids {
		ids[i] = fmt.Sprintf("hb-%05d", i)
		n.sendLifecycle(testframe.Workload(ids[i], "running", n.id))
	}
	netBarrier(t, n)
	return ids
}

// passesCompleted is how many heartbeat passes n's sender to sink finished.
func passesCompleted(n *testNode, sink *hbSink) uint64 {
	for _, st := range n.m.bcast.StatsSnapshot() {
		if st.Peer == sink.ident.Principal {
			return st.PassesCompleted.Load()
		}
	}
	return 0
}

func TestHeartbeatNeverReassertsAWorkloadAfterItsRemovalWasSent(t *testing.T) {
	waitsOutRealTime(t, "heartbeat passes")
	// A slow single-frame peer keeps a pass in flight for seconds while
	// every workload is removed, in pass order: one of the removals hits
	// the entry the pass is about to visit.
	n := newTestNode(t, withResyncInterval(100*time.Millisecond))
	n.start()
	sink := newHBSink(t, false, time.Millisecond)
	const live = 800 // under the queues' 1024: no removal may be dropped
	ids := trackRunning(t, n, live)
	sink.join(t, n)
	testkit.Eventually(t, "a pass in flight", func() bool { return sink.count("resync", "") > 20 })
	for _, id := range ids {
		n.sendRemove(id)
	}
	testkit.Eventually(t, "every removal at the peer", func() bool { return sink.count("remove", "") == live })
	after := passesCompleted(n, sink)
	testkit.Eventually(t, "a whole pass after the removals", func() bool { return passesCompleted(n, sink) >= after+2 })

	requireNoReassertionAfterRemoval(t, sink.snapshot())
}

func TestHeartbeatPassCarriesOnPastItsIntervalAndReachesEveryWorkload(t *testing.T) {
	// Many live workloads, and a peer slow enough that one pass takes
	// several intervals: every workload is still re-asserted, and fresh
	// frames sent meanwhile all arrive, once each.
	n := newTestNode(t, withResyncInterval(50*time.Millisecond))
	n.start()
	sink := newHBSink(t, false, 0)
	live := 2500
	ids := trackRunning(t, n, live)
	sink.join(t, n)
	var fresh []string
	for i := range 200 {
		id := fmt.Sprintf("fresh-%03d", i)
		fresh = append(fresh, id)
		n.sendLifecycle(testframe.Workload(id, "running", n.id))
	}
	// The fresh frames follow the new peer's backfill of every workload
	// (one catch-up, in version order): a minute for both on a loaded
	// machine under the race detector.
	if !testkit.HoldsWithin(time.Minute, func() bool { return sink.count("fresh", "") == live+len(fresh) }) {
		t.Fatalf("timed out waiting for every fresh frame at the peer: %d of %d", sink.count("fresh", ""), live+len(fresh))
	}
	// Reaching every workload is the property, not how fast: a pass over
	// some 2,500 workloads to a peer on a loaded machine under the race
	// detector can outlast the usual wait, so this one waits a minute.
	reachedAll := testkit.HoldsWithin(time.Minute, func() bool {
		seen := map[string]bool{}
		for _, e := range sink.snapshot() {
			if e.kind == "resync" {
				seen[e.id] = true
			}
		}
		for _, id := range ids {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	if !reachedAll {
		t.Fatal("timed out waiting for every live workload re-asserted")
	}
	for _, id := range fresh {
		if c := sink.count("fresh", id); c != 1 {
			t.Fatalf("fresh frame %s arrived %d times, want once", id, c)
		}
	}
}

func TestMixedClusterBatchingAndSingleFramePeersReceiveEveryFrameInOrder(t *testing.T) {
	n := newTestNode(t)
	n.start()
	batching, single := newHBSink(t, true, time.Millisecond), newHBSink(t, false, time.Millisecond)
	for _, s := range []*hbSink{batching, single} {
		netMust(t, devpki.PinIdentity(n.clusterDir, s.ident))
	}
	n.m.trust.Reload()
	netDiscover(n, netAddrEntry(batching.id, batching.ident.Principal, batching.addr), netAddrEntry(single.id, single.ident.Principal, single.addr))
	n.waitTargets(2)
	// The first answer carries the advertisement; what queues behind the
	// frame in flight then goes in batches to the peer that takes them.
	var want []string
	for i := range 600 {
		id := fmt.Sprintf("mix-%03d", i)
		want = append(want, id)
		n.sendLifecycle(testframe.Workload(id, "running", n.id))
	}
	for _, s := range []*hbSink{batching, single} {
		testkit.Eventually(t, "every frame at each peer", func() bool { return s.count("fresh", "") >= len(want) })
		if got := s.freshIDs(); !slices.Equal(got, want) {
			t.Fatalf("a peer received the frames out of order or more than once (batching %v)", s.batching)
		}
	}
	if b, _ := batching.batchCounts(); b == 0 {
		t.Fatal("the peer that advertised batches was never sent one")
	}
	if b, refused := single.batchCounts(); b != 0 || refused != 0 {
		t.Fatalf("the single-frame peer was sent %d batches", b+refused)
	}
}

func TestBatchElementThatFailsIsRetriedInOrderWithWhatFollowedIt(t *testing.T) {
	n := newTestNode(t)
	n.start()
	sink := newHBSink(t, true, 2*time.Millisecond)
	sink.failOnce["retry-010"] = true
	sink.join(t, n)
	var want []string
	for i := range 40 {
		id := fmt.Sprintf("retry-%03d", i)
		want = append(want, id)
		n.sendLifecycle(testframe.Workload(id, "running", n.id))
	}
	testkit.Eventually(t, "every frame at the peer", func() bool { return sink.count("fresh", "") >= len(want) })
	if got := sink.freshIDs(); !slices.Equal(got, want) {
		t.Fatalf("after a failed element the peer holds %v, want every frame once, in order", got)
	}
}

func TestFreshFrameOvertakesAHeartbeatPassInFlight(t *testing.T) {
	waitsOutRealTime(t, "a heartbeat pass")
	// A pass slow enough to be caught in the middle: a fresh frame sent
	// then waits for the one re-assertion in flight, not for the rest of
	// the pass (the sender catches its peer up before every slice).
	n := newTestNode(t, withResyncInterval(3*time.Second))
	n.start()
	sink := newHBSink(t, false, 2*time.Millisecond)
	const live = 1000 // a pass paced over 2.4 s: ample time for the fresh frame to overtake it
	trackRunning(t, n, live)
	sink.join(t, n)
	testkit.Eventually(t, "the backfill at the peer", func() bool { return sink.count("fresh", "") >= live })
	if !testkit.HoldsWithin(time.Minute, func() bool { return sink.count("resync", "") >= 20 }) {
		t.Fatal("timed out waiting for a pass in flight")
	}
	n.sendLifecycle(testframe.Workload("urgent", "completed", n.id))
	testkit.Eventually(t, "the fresh frame at the peer", func() bool { return sink.count("fresh", "urgent") == 1 })
	before := 0
	for _, e := range sink.snapshot() {
		if e.kind == "fresh" && e.id == "urgent" {
			break
		}
		if e.kind == "resync" {
			before++
		}
	}
	if before >= live {
		t.Fatalf("the fresh frame arrived after all %d re-assertions of the pass: it waited for the whole pass", before)
	}
}

func TestFreshFrameForAWorkloadInTheHeartbeatRequestInFlightWaitsForIt(t *testing.T) {
	// A removal of a workload whose re-assertion is in flight must not
	// overtake it, or the peer would apply the re-assertion last and show
	// the workload again: one sender per peer sends them in turn.
	n := newTestNode(t, withResyncInterval(300*time.Millisecond))
	n.start()
	sink := newHBSink(t, true, 0)
	holding := sink.holdFirst(hbEvent{"resync", "hb-00001"}, 500*time.Millisecond)
	trackRunning(t, n, 3)
	sink.join(t, n)
	waitClosed(t, "the re-assertion of hb-00001 in flight", holding)
	n.sendRemove("hb-00001")
	testkit.Eventually(t, "the removal at the peer", func() bool { return sink.count("remove", "hb-00001") == 1 })
	requireNoReassertionAfterRemoval(t, sink.snapshot())
	if sink.count("resync", "hb-00001") != 1 {
		t.Fatalf("the re-assertion in flight never reached the peer: %v", sink.snapshot())
	}
}

func TestReassertionNeverOvertakesAFreshFrameQueuedBeforeIt(t *testing.T) {
	// A fresh frame is held in flight and a newer one for the same
	// workload waits behind it while passes begin every 50 ms: the
	// heartbeat lane must not re-assert the newer state ahead of both, or
	// the peer would see the workload go running, queued, running.
	n := newTestNode(t, withResyncInterval(50*time.Millisecond))
	n.start()
	sink := newHBSink(t, false, 0)
	sink.join(t, n)
	holding := sink.holdFirst(hbEvent{"fresh", "x"}, 500*time.Millisecond)
	n.sendLifecycle(testframe.Workload("x", "queued", n.id, map[string]any{"seq": 1}))
	waitClosed(t, "the queued frame in flight", holding)
	n.sendLifecycle(testframe.Workload("x", "running", n.id, map[string]any{"seq": 2}))
	testkit.Eventually(t, "both fresh frames and a re-assertion at the peer", func() bool {
		return sink.count("fresh", "x") == 2 && sink.count("resync", "x") >= 1
	})
	var got []string
	for _, e := range sink.snapshot() {
		if e.id == "x" {
			got = append(got, e.kind)
		}
	}
	if got[0] != "fresh" || got[1] != "fresh" {
		t.Fatalf("frames for x in arrival order %v: a re-assertion overtook a fresh frame queued before it", got)
	}
}

func TestHeartbeatPassToAFailingPeerEndsAtTheFirstFailure(t *testing.T) {
	waitsOutRealTime(t, "a heartbeat pass")
	// A peer that fails re-assertions (down, overloaded) is tried once per
	// interval, not once per entry: the pass ends at the first failure.
	// The interval is long enough that the check below sees one pass.
	n := newTestNode(t, withResyncInterval(2*time.Second))
	n.start()
	sink := newHBSink(t, false, 0)
	sink.failResync = true
	trackRunning(t, n, 50)
	sink.join(t, n)
	stats := func() *peersend.Stats {
		for _, st := range n.m.bcast.StatsSnapshot() {
			if st.Peer == sink.ident.Principal {
				return st
			}
		}
		return &peersend.Stats{}
	}
	if !testkit.HoldsWithin(time.Minute, func() bool { return stats().PassesAbandoned.Load() == 1 }) {
		t.Fatal("timed out waiting for the first pass to end")
	}
	if got := sink.resyncTries(); got != 1 {
		t.Fatalf("the failing peer was sent %d re-assertions in one pass, want 1", got)
	}
	// Fresh frames still go.
	n.sendLifecycle(testframe.Workload("after", "running", n.id))
	testkit.Eventually(t, "a fresh frame at the peer", func() bool { return sink.count("fresh", "after") == 1 })
}

func TestHeartbeatPassGoesOnPastAnEntryThePeerRejects(t *testing.T) {
	// A rejection (4xx) is about one entry: the pass carries on.
	n := newTestNode(t, withResyncInterval(300*time.Millisecond))
	n.start()
	sink := newHBSink(t, false, 0)
	sink.rejectResync = "hb-00001"
	trackRunning(t, n, 5)
	sink.join(t, n)
	testkit.Eventually(t, "the entries after the rejected one re-asserted", func() bool { return sink.count("resync", "hb-00004") == 1 })
}

// requireNoReassertionAfterRemoval fails when a workload was re-asserted to
// the peer after its removal reached it.
func requireNoReassertionAfterRemoval(t *testing.T, events []hbEvent) {
	t.Helper()
	removedAt := map[string]int{}
	for i, e := range events {
		switch e.kind {
		case "remove":
			removedAt[e.id] = i
		case "resync":
			if at, removed := removedAt[e.id]; removed {
				t.Fatalf("%s re-asserted at %d, after its removal reached the peer at %d", e.id, i, at)
			}
		}
	}
}

// waitClosed waits for ch to be closed, within the tests' usual deadline.
func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	testkit.Eventually(t, what, func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	})
}
