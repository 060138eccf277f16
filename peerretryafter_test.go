package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/peersend"
	"nvpair-workload-manager/internal/peerwire"
)

// ---- a peer that asks its senders to wait ----

// deferringEntry is p's discovery:nodes entry, under a host UUID of its own.
func deferringEntry(p *testkit.DeferringPeer) map[string]any {
	return testkit.AddrEntry(devpki.NewUUID(), p.Ident.Principal, p.Addr)
}

// startWithPeer starts a with p as its only target.
func startWithPeer(t *testing.T, a *testNode, p *testkit.DeferringPeer) {
	t.Helper()
	testkit.Must(t, devpki.PinIdentity(a.clusterDir, p.Ident))
	a.start()
	netDiscover(a, deferringEntry(p))
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
			p := testkit.NewDeferringPeer(t, testkit.Mint(t, devpki.NewUUID()), batching, 0, "")
			startWithPeer(t, a, p)
			// A first frame teaches the sender whether the peer batches.
			a.sendLifecycle(testframe.Workload("first", "running", a.id))
			testkit.Eventually(t, "the first frame at the peer", func() bool { return len(p.Accepted()) == 1 })

			// Four 503s asking for 1 s: each is a wait, not a failed
			// attempt, so none costs the frame a backoff.
			p.SetDefer(4, "1")
			want := ids("fresh", 12)
			for _, id := range want {
				a.sendLifecycle(testframe.Workload(id, "running", a.id))
			}
			want = append([]string{"first"}, want...)
			if !testkit.HoldsWithin(testkit.WaitTimeout+4*time.Second, func() bool { return len(p.Accepted()) >= len(want) }) {
				t.Fatalf("the peer took %d of %d frames", len(p.Accepted()), len(want))
			}
			if got := p.Accepted(); !slices.Equal(got, want) {
				t.Fatalf("the peer took %v, want %v once each, in order", got, want)
			}
			if n := p.CheckWaitsHonoured(t, time.Second); n != 4 {
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
			p := testkit.NewDeferringPeer(t, testkit.Mint(t, devpki.NewUUID()), batching, 0, "")
			// The workloads are in the re-sync set before the peer is a
			// target: they reach it as its backfill, on the heartbeat lane.
			testkit.Must(t, devpki.PinIdentity(a.clusterDir, p.Ident))
			a.start()
			want := ids("hb", 6)
			for _, id := range want {
				a.sendLifecycle(testframe.Workload(id, "running", a.id))
			}
			// Every frame read and in the table before the peer joins.
			a.broker.send(`{"jsonrpc":"2.0","id":"barrier","method":"nope"}`)
			a.broker.WaitResponse(`"barrier"`)
			p.SetDefer(3, "1")
			netDiscover(a, deferringEntry(p))
			a.waitTargets(1)
			testkit.Eventually(t, "the backfill at the peer", func() bool { return len(p.Accepted()) >= len(want) })
			if got := p.Accepted(); !slices.Equal(got, want) {
				t.Fatalf("the peer took %v, want %v once each", got, want)
			}
			if n := p.CheckWaitsHonoured(t, time.Second); n != 3 {
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
			p := testkit.NewDeferringPeer(t, testkit.Mint(t, devpki.NewUUID()), false, 100, value)
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
	p := testkit.NewDeferringPeer(t, testkit.Mint(t, devpki.NewUUID()), false, 1000, "30")
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
	if len(p.Log()) != 1 {
		t.Fatalf("%d requests to a peer that asked for 30 s, want 1", len(p.Log()))
	}
	if !strings.Contains(a.logs.String(), "peers not caught up in time") {
		t.Fatalf("no warning that the held frame was abandoned:\n%s", a.logs)
	}
	t.Logf("stopped %v after the stop with a frame held for 30 s (drain timeout %v)", time.Since(start).Round(time.Millisecond), defaultDrainTimeout)
}
