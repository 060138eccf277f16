package peersend

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/clustertrust"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/statetable"
)

func quietBroadcaster(t *testing.T) *Broadcaster {
	t.Helper()
	table := statetable.New(statetable.Config{Self: "self", Retention: time.Minute, MaxLive: 100, MaxLiveBytes: 1 << 20,
		MaxEndedBytes: 1 << 20, MemberClaim: time.Hour})
	b := New(slog.New(slog.NewTextHandler(io.Discard, nil)), &clustertrust.ClusterTrust{}, table, time.Hour)
	t.Cleanup(func() { b.Close(0) })
	return b
}

// silentPeer accepts connections and never answers a handshake: each
// connection attempt to it stays in flight until its deadline.
func silentPeer(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = &atomic.Int64{}
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String(), accepted
}

// Twice DefaultDialsInFlight attempts at once reach the peer
// DefaultDialsInFlight at a time; the others wait, counted.
func TestConnectionAttemptsInFlightAreBoundedNodeWide(t *testing.T) {
	b := quietBroadcaster(t)
	addr, accepted := silentPeer(t)
	const n = 2 * DefaultDialsInFlight
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		dial := b.dialTLS(Target{HostUUID: "h", Principal: "p" + string(rune('a'+i)), Addrs: []string{addr}})
		wg.Go(func() {
			if c, err := dial(ctx, "tcp", addr); err == nil {
				c.Close()
			}
		})
	}
	testkit.Eventually(t, "every slot taken and the other attempts waiting", func() bool {
		return b.dials.inFlight.Load() == DefaultDialsInFlight && b.dials.waited.Load() == n-DefaultDialsInFlight
	})
	if got := accepted.Load(); got > DefaultDialsInFlight {
		t.Fatalf("the peer accepted %d connections at once, want at most %d", got, DefaultDialsInFlight)
	}
	cancel()
	wg.Wait()
	if got := b.dials.inFlight.Load(); got != 0 {
		t.Fatalf("%d attempts in flight after all ended", got)
	}
}

// A snapshot's new senders wait a random part of the spread before their
// first request, not all the same; one that joins alone barely waits.
func TestNewSendersOfOneSnapshotSpreadTheirFirstDials(t *testing.T) {
	b := quietBroadcaster(t)
	b.rnd = seeded()
	var targets []Target
	for i := range 64 {
		targets = append(targets, Target{HostUUID: "h" + string(rune('A'+i)), Principal: "p" + string(rune('A'+i)), Addrs: []string{"127.0.0.1:1"}})
	}
	b.SetTargets(targets)
	b.mu.Lock()
	var waits []time.Time
	t0 := time.Unix(0, 0)
	for _, s := range b.peers {
		if s.firstDial <= 0 || s.firstDial > firstDialSpread(64) {
			t.Errorf("first dial after %v, want within (0, %v]", s.firstDial, firstDialSpread(64))
		}
		waits = append(waits, t0.Add(s.firstDial))
	}
	b.mu.Unlock()
	first, last, distinct := passSpread(waits)
	if distinct < 60 || last.Sub(first) < firstDialSpread(64)/2 {
		t.Fatalf("64 senders' first dials: %d distinct, from %v to %v", distinct, first.Sub(t0), last.Sub(t0))
	}
	if firstDialSpread(1) > 10*time.Millisecond {
		t.Fatalf("a lone new sender may wait %v before its first dial", firstDialSpread(1))
	}
}

// The senders of one failed peer back off by about the same doubling
// waits, but not in step.
func TestRetryBackoffIsJittered(t *testing.T) {
	rnd := seeded()
	const senders = 32
	for step := range 8 {
		want := min(peerRetryBaseDelay<<step, peerRetryMaxDelay)
		seen := map[time.Duration]bool{}
		for range senders {
			s := &peerSender{rnd: rnd, backoff: want / 2}
			if step == 0 {
				s.backoff = 0
			}
			got := s.nextBackoff()
			if s.backoff != want {
				t.Fatalf("step %d: backoff %v, want %v", step, s.backoff, want)
			}
			if d := got - want; d < -want*backoffJitter/100 || d > want*backoffJitter/100 {
				t.Fatalf("step %d: wait %v, want %v ± %d %%", step, got, want, backoffJitter)
			}
			seen[got] = true
		}
		if len(seen) < senders*9/10 {
			t.Fatalf("step %d: %d senders wait %d distinct times", step, senders, len(seen))
		}
	}
}
