package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/peersend"
)

func TestBroadcastDeadPeerDoesNotDelayHealthyPeer(t *testing.T) {
	waitsOutRealTime(t, "a dead peer's attempts")
	a := newTestNode(t)
	hole, sink := testkit.NewBlackHole(t), newNetSink(t)
	testkit.Must(t, devpki.PinIdentity(a.clusterDir, hole.Ident))
	sink.pinIn(t, a)
	a.start()
	netDiscover(a, hole.Entry(), sink.entry())
	a.waitTargets(2)

	start := time.Now()
	a.sendLifecycle(testframe.Workload("job-1", "running", a.id))
	a.sendLifecycle(testframe.Workload("job-2", "running", a.id))
	testkit.Eventually(t, "the dead peer to be dialed", func() bool { return hole.Accepted.Load() > 0 })
	testkit.Eventually(t, "job-1 and job-2 at the healthy peer", func() bool { return sink.count("job-1") == 1 && sink.count("job-2") == 1 })
	// The dead peer holds each attempt for peerAttemptTimeout (5 s): a
	// healthy peer waiting behind it would see job-2 after 15 s.
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the healthy peer got the frame after the dead one's %s", took)
	}
	if took := netBarrier(t, a); took > time.Second {
		t.Fatalf("the read loop took %s to answer while a peer is dead", took)
	}
}

func TestBroadcastPreservesPerPeerOrder(t *testing.T) {
	a := newTestNode(t)
	s1, s2 := newNetSink(t), newNetSink(t)
	s1.pinIn(t, a)
	s2.pinIn(t, a)
	a.start()
	netDiscover(a, s1.entry(), s2.entry())
	a.waitTargets(2)

	const n = 200
	var want []string
	for i := range n {
		id := fmt.Sprintf("job-%03d", i)
		want = append(want, id)
		a.sendLifecycle(testframe.Workload(id, "running", a.id))
	}
	for i, s := range []*netSink{s1, s2} {
		testkit.Eventually(t, fmt.Sprintf("%d frames at sink %d", n, i+1), func() bool { return len(s.ids()) >= n })
		if got := s.ids(); !slices.Equal(got, want) {
			t.Fatalf("sink %d received the frames out of order or more than once:\n%v", i+1, got)
		}
	}
}

// A peer that answers nothing holds up only itself: the read loop takes
// every frame at once (there is no queue to fill: what the peer lacks lies
// above its mark), and once the peer answers it is sent every workload,
// once each, in the order they were committed.
func TestBroadcastHeldPeerKeepsReadLoopResponsiveAndGetsEveryWorkloadInOrder(t *testing.T) {
	a := newTestNode(t, withResyncInterval(time.Hour))
	sink := newNetSink(t)
	sink.hold() // the only peer answers nothing until released
	sink.pinIn(t, a)
	a.start()
	netDiscover(a, sink.entry())
	a.waitTargets(1)

	id := func(i int) string { return fmt.Sprintf("q-%04d", i) }
	a.sendLifecycle(testframe.Workload(id(0), "running", a.id))
	testkit.Eventually(t, "the first frame in flight at the peer", func() bool { return sink.count(id(0)) >= 1 })
	const extra = 2100
	var lines bytes.Buffer
	for i := 1; i <= extra; i++ {
		lines.Write(testframe.Lifecycle(testframe.Workload(id(i), "running", a.id), nil))
		lines.WriteByte('\n')
	}
	// Written from another goroutine: a read loop that blocks on the held
	// peer must fail this test, not hang it.
	taken := make(chan struct{})
	go func() {
		defer close(taken)
		_, _ = a.broker.toD.Write(lines.Bytes())
	}()
	select {
	case <-taken:
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("the read loop stopped taking frames while the peer was held")
	}
	if took := netBarrier(t, a); took > time.Second {
		t.Fatalf("the read loop took %s to answer with a held peer", took)
	}
	sink.release()
	a.sendLifecycle(testframe.Workload("q-after", "running", a.id))
	testkit.Eventually(t, "every workload at the peer", func() bool { return len(slices.Compact(sink.ids())) >= extra+2 })
	got := slices.Compact(sink.ids())
	var all []string
	for i := 0; i <= extra; i++ {
		all = append(all, id(i))
	}
	if !slices.Equal(got, append(all, "q-after")) {
		t.Fatalf("the peer received %d distinct frames, want q-0000..q-%04d and q-after, each once, in order", len(got), extra)
	}
	if d := netDrops(a); d != 0 {
		t.Fatalf("%d entries dropped, want none", d)
	}
}

func TestBroadcastRetriesServerErrorsButNotRejections(t *testing.T) {
	waitsOutRealTime(t, "the sender's backoff")
	a := newTestNode(t)
	sink := newNetSink(t)
	cases := []struct {
		id       string
		statuses []int // answers to successive attempts; 200 after the list
		attempts int
	}{
		{"r-500-500-200", []int{500, 500}, 3},
		{"r-400", []int{400}, 1},
		{"r-404", []int{404}, 1},
		{"r-413", []int{413}, 1},     // a body or a broker line over the peer's limit
		{"r-403-200", []int{403}, 2}, // the peer may not have re-read its pins yet
		{"r-429-200", []int{429}, 2},
		// Tried FrameMaxTries times, then skipped: the peer takes the frame
		// behind it (no head-of-line block, spec 5.1).
		{"r-503-503-503-skipped", []int{503, 503, 503}, peersend.FrameMaxTries},
	}
	for _, c := range cases {
		sink.script(c.id, c.statuses...)
	}
	sink.pinIn(t, a)
	a.start()
	netDiscover(a, sink.entry())
	a.waitTargets(1)

	for _, c := range cases {
		a.sendLifecycle(testframe.Workload(c.id, "running", a.id))
	}
	// Per-peer order: once the next frame is in, every retry before it is done.
	a.sendLifecycle(testframe.Workload("r-after", "running", a.id))
	testkit.Eventually(t, "r-after at the peer", func() bool { return sink.count("r-after") == 1 })
	for _, c := range cases {
		if got := sink.count(c.id); got != c.attempts {
			t.Errorf("%s: %d attempts, want %d", c.id, got, c.attempts)
		}
	}
	// r-400, r-404 and r-413 were refused for good: skipped and counted,
	// with a warning (rate-limited: one here).
	if got := netDrops(a); got != 3 {
		t.Errorf("%d entries skipped as refused, want 3", got)
	}
	var skipped uint64
	for _, st := range a.m.bcast.StatsSnapshot() {
		skipped += st.Skipped.Load()
	}
	if skipped != 1 {
		t.Errorf("%d entries skipped after their tries, want 1", skipped)
	}
	if !a.logs.Contains("level=WARN", "peer refused entries for good") {
		t.Errorf("no warning about the refused entries; logs:\n%s", a.logs)
	}
}

func TestBroadcastPoolsConnectionsToAPeer(t *testing.T) {
	a := newTestNode(t)
	sink := newNetSink(t)
	sink.pinIn(t, a)
	a.start()
	netDiscover(a, sink.entry())
	a.waitTargets(1)

	const n = 50
	for i := range n {
		a.sendLifecycle(testframe.Workload(fmt.Sprintf("job-%02d", i), "running", a.id))
	}
	testkit.Eventually(t, fmt.Sprintf("%d frames at the peer", n), func() bool { return len(sink.ids()) >= n })
	if conns, hellos := sink.conns.Load(), sink.hellos.Load(); conns > 2 || hellos > 2 {
		t.Fatalf("%d frames took %d connections and %d TLS handshakes, want at most 2", n, conns, hellos)
	}
}

func TestBroadcastStopsSendingToARemovedTarget(t *testing.T) {
	a := newTestNode(t)
	s1, s2 := newNetSink(t), newNetSink(t)
	s1.pinIn(t, a)
	s2.pinIn(t, a)
	a.start()
	netDiscover(a, s1.entry(), s2.entry())
	a.waitTargets(2)
	a.sendLifecycle(testframe.Workload("job-1", "running", a.id))
	testkit.Eventually(t, "job-1 at both peers", func() bool { return s1.count("job-1") == 1 && s2.count("job-1") == 1 })

	netDiscover(a, s2.entry())
	a.waitTargets(1)
	// The removed target's sender ends and closes its pooled connection.
	testkit.Eventually(t, "the removed target's connections closed", func() bool { return s1.closed.Load() == s1.conns.Load() })
	a.sendLifecycle(testframe.Workload("job-2", "running", a.id))
	a.sendLifecycle(testframe.Workload("job-3", "running", a.id))
	testkit.Eventually(t, "job-2 and job-3 at the kept peer", func() bool { return s2.count("job-2") == 1 && s2.count("job-3") == 1 })
	if got := s1.ids(); !slices.Equal(got, []string{"job-1"}) {
		t.Fatalf("the removed target received %v after its removal", got)
	}
}

// ---- helpers (net helper) ----

// netSink is a peer written for the tests: a TLS server presenting its own
// pinned identity that records every request it gets and answers as
// scripted (200 by default).
type netSink struct {
	id     string // hostUuid
	ident  devpki.Identity
	addr   string
	srv    *http.Server
	conns  atomic.Int32 // connections accepted
	closed atomic.Int32 // connections closed
	hellos atomic.Int32 // TLS handshakes started

	mu       sync.Mutex // guards the fields below
	arrivals []string   // workload id of every request, in arrival order
	answers  map[string][]int
	gate     chan struct{} // when set, requests wait until it is closed
	released bool
}

func newNetSink(t testing.TB) *netSink {
	t.Helper()
	s := &netSink{id: devpki.NewUUID(), answers: map[string][]int{}}
	s.ident = testkit.Mint(t, devpki.NewUUID())
	cert, err := s.ident.TLSCertificate()
	testkit.Must(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	testkit.Must(t, err)
	s.addr = ln.Addr().String()
	s.srv = &http.Server{
		Handler: http.HandlerFunc(s.serve),
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequestClientCert,
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				s.hellos.Add(1)
				return nil, nil
			},
		},
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				s.conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				s.closed.Add(1)
			}
		},
		ErrorLog: testkit.DiscardLog(),
	}
	go s.srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { s.release(); s.srv.Close() })
	return s
}

func (s *netSink) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var f struct {
		Params struct {
			WorkloadInfo struct {
				ID string `json:"id"`
			} `json:"workloadInfo"`
			WorkloadID string `json:"workloadId"`
		} `json:"params"`
	}
	_ = json.Unmarshal(body, &f)
	id := f.Params.WorkloadInfo.ID + f.Params.WorkloadID
	s.mu.Lock()
	attempt := 0
	for _, a := range s.arrivals {
		if a == id {
			attempt++
		}
	}
	s.arrivals = append(s.arrivals, id)
	status := http.StatusOK
	if script := s.answers[id]; attempt < len(script) {
		status = script[attempt]
	}
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	w.WriteHeader(status)
	io.WriteString(w, "answer\n")
}

// script sets the answers to the successive attempts for workload id.
func (s *netSink) script(id string, statuses ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers[id] = statuses
}

// hold makes every request wait until release.
func (s *netSink) hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = make(chan struct{})
}

func (s *netSink) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate != nil && !s.released {
		close(s.gate)
		s.released = true
	}
}

// ids returns the workload id of every request so far, in arrival order.
func (s *netSink) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.arrivals)
}

// count returns how many requests carried workload id.
func (s *netSink) count(id string) int {
	n := 0
	for _, a := range s.ids() {
		if a == id {
			n++
		}
	}
	return n
}

func (s *netSink) pinIn(t testing.TB, n *testNode) {
	t.Helper()
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, s.ident))
}

func (s *netSink) entry() map[string]any {
	return testkit.AddrEntry(s.id, s.ident.Principal, s.addr)
}

// netDrops returns how many entries the node's peers refused for good.
func netDrops(n *testNode) int64 {
	var total int64
	for _, st := range n.m.bcast.StatsSnapshot() {
		total += int64(st.Dropped.Load())
	}
	return total
}
