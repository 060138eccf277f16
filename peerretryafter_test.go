package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/devpki"
	"nvpair-workload-manager/internal/peersend"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/testframe"
	"nvpair-workload-manager/internal/testkit"
)

// ---- a peer that asks its senders to wait ----

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

// peerRequest is one request the peer was sent.
type peerRequest struct {
	at, answered time.Time
	ids          []string // the workload of each frame
	status       int
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
	if mt == peerwire.BatchContentType {
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
		w.Header().Set(peerwire.BatchHeader, peerwire.BatchAdvert)
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
	case mt == peerwire.BatchContentType:
		results := make([]peerwire.BatchResult, len(frames))
		for i := range results {
			results[i].Status = http.StatusOK
		}
		json.NewEncoder(w).Encode(peerwire.BatchAnswer{Results: results})
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

func (p *deferringPeer) pinIn(t testing.TB, n *testNode) {
	t.Helper()
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, p.ident))
}

func (p *deferringPeer) entry() map[string]any {
	return netAddrEntry(devpki.NewUUID(), p.ident.Principal, p.addr)
}

// startWithPeer starts a with p as its only target.
func startWithPeer(t *testing.T, a *testNode, p *deferringPeer) {
	t.Helper()
	p.pinIn(t, a)
	a.start()
	netDiscover(a, p.entry())
	a.waitTargets(1)
}

func senderStats(t *testing.T, a *testNode) *peersend.Stats {
	t.Helper()
	stats := a.m.bcast.StatsSnapshot()
	if len(stats) != 1 {
		t.Fatalf("%d peers' stats, want 1", len(stats))
	}
	return stats[0]
}

func TestFreshFramesWaitOutAPeersRetryAfterAndArriveInOrder(t *testing.T) {
	waitsOutRealTime(t, "a peer's Retry-After")
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			a := newTestNode(t)
			p := newDeferringPeer(t, testkit.Mint(t, devpki.NewUUID()), batching, 0, "")
			startWithPeer(t, a, p)
			// A first frame teaches the sender whether the peer batches.
			a.sendLifecycle(testframe.Workload("first", "running", a.id))
			testkit.Eventually(t, "the first frame at the peer", func() bool { return len(p.accepted()) == 1 })

			// Four 503s asking for 1 s: each is a wait, not a failed
			// attempt, so none costs the frame a backoff.
			p.setDefer(4, "1")
			want := ids("fresh", 12)
			for _, id := range want {
				a.sendLifecycle(testframe.Workload(id, "running", a.id))
			}
			want = append([]string{"first"}, want...)
			if !testkit.HoldsWithin(testkit.WaitTimeout+4*time.Second, func() bool { return len(p.accepted()) >= len(want) }) {
				t.Fatalf("the peer took %d of %d frames", len(p.accepted()), len(want))
			}
			if got := p.accepted(); !slices.Equal(got, want) {
				t.Fatalf("the peer took %v, want %v once each, in order", got, want)
			}
			if n := p.checkWaitsHonoured(t, time.Second); n != 4 {
				t.Fatalf("%d requests answered 503, want 4", n)
			}
			st := senderStats(t, a)
			if st.Dropped.Load() != 0 || st.FailedAttempts.Load() != 0 || st.RetryAfterWaits.Load() != 4 {
				t.Fatalf("dropped %d, failed attempts %d, Retry-After waits %d; want 0, 0, 4",
					st.Dropped.Load(), st.FailedAttempts.Load(), st.RetryAfterWaits.Load())
			}
			if held := time.Duration(st.RetryAfterHeldNanos.Load()); held < 4*time.Second {
				t.Fatalf("the peer was held %v, want the 4 s its answers asked for", held)
			}
			if !a.logs.Contains("level=WARN", "peer asked to wait (Retry-After)", "wait=1s") {
				t.Fatalf("no warning about the wait:\n%s", a.logs)
			}
		})
	}
}

func TestHeartbeatWaitsOutAPeersRetryAfterAndCarriesOnItsPass(t *testing.T) {
	waitsOutRealTime(t, "a peer's Retry-After")
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			a := newTestNode(t)
			p := newDeferringPeer(t, testkit.Mint(t, devpki.NewUUID()), batching, 0, "")
			// The workloads are in the re-sync set before the peer is a
			// target: they reach it as its backfill, on the heartbeat lane.
			p.pinIn(t, a)
			a.start()
			want := ids("hb", 6)
			for _, id := range want {
				a.sendLifecycle(testframe.Workload(id, "running", a.id))
			}
			// Every frame read and in the table before the peer joins.
			a.broker.send(`{"jsonrpc":"2.0","id":"barrier","method":"nope"}`)
			a.broker.WaitResponse(`"barrier"`)
			p.setDefer(3, "1")
			netDiscover(a, p.entry())
			a.waitTargets(1)
			testkit.Eventually(t, "the backfill at the peer", func() bool { return len(p.accepted()) >= len(want) })
			if got := p.accepted(); !slices.Equal(got, want) {
				t.Fatalf("the peer took %v, want %v once each", got, want)
			}
			if n := p.checkWaitsHonoured(t, time.Second); n != 3 {
				t.Fatalf("%d requests answered 503, want 3", n)
			}
			st := senderStats(t, a)
			if st.PassesAbandoned.Load() != 0 || st.ReassertFailures.Load() != 0 || st.RetryAfterWaits.Load() != 3 {
				t.Fatalf("passes abandoned %d, re-assertion failures %d, Retry-After waits %d; want 0, 0, 3",
					st.PassesAbandoned.Load(), st.ReassertFailures.Load(), st.RetryAfterWaits.Load())
			}
		})
	}
}

func TestARetryAfterThatAsksForNoWaitIsAFailedAttemptAsBefore(t *testing.T) {
	waitsOutRealTime(t, "the sender's own backoff")
	for _, value := range []string{"0", "soon", "-1", "1.5"} {
		t.Run(value, func(t *testing.T) {
			a := newTestNode(t)
			p := newDeferringPeer(t, testkit.Mint(t, devpki.NewUUID()), false, 100, value)
			startWithPeer(t, a, p)
			a.sendLifecycle(testframe.Workload("retried", "running", a.id))
			st := senderStats(t, a)
			// Nothing is given up: the frame stays above the peer's mark
			// and goes again after each backoff.
			testkit.Eventually(t, "two failed attempts", func() bool { return st.FailedAttempts.Load() >= 2 })
			if st.Dropped.Load() != 0 {
				t.Fatalf("%d entries dropped for a retryable answer, want none", st.Dropped.Load())
			}
			if st.RetryAfterWaits.Load() != 0 {
				t.Fatalf("%d Retry-After waits honoured for %q, want none", st.RetryAfterWaits.Load(), value)
			}
		})
	}
}

func TestAPeersRetryAfterDoesNotHoldShutdownPastTheDrainTimeout(t *testing.T) {
	waitsOutRealTime(t, "the drain timeout")
	a := newTestNode(t)
	p := newDeferringPeer(t, testkit.Mint(t, devpki.NewUUID()), false, 1000, "30")
	startWithPeer(t, a, p)
	a.sendLifecycle(testframe.Workload("held", "running", a.id))
	st := senderStats(t, a)
	testkit.Eventually(t, "the peer's wait honoured", func() bool { return st.RetryAfterWaits.Load() == 1 })
	start := time.Now()
	a.cancel()
	select {
	case err := <-a.done:
		a.done <- err // for the node's cleanup, which waits for it too
	case <-time.After(peerwire.RetryAfterCap / 2):
		t.Fatalf("Run still running %v after its stop, held by the peer's 30 s wait", peerwire.RetryAfterCap/2)
	}
	if len(p.log()) != 1 {
		t.Fatalf("%d requests to a peer that asked for 30 s, want 1", len(p.log()))
	}
	if !strings.Contains(a.logs.String(), "peers not caught up in time") {
		t.Fatalf("no warning that the held frame was abandoned:\n%s", a.logs)
	}
	t.Logf("stopped %v after the stop with a frame held for 30 s (drain timeout %v)", time.Since(start).Round(time.Millisecond), defaultDrainTimeout)
}
