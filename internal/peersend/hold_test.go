package peersend

import (
	"context"
	"testing"
	"time"

	"nvpair-workload-manager/internal/peerwire"
)

// waitTimeout bounds every wait of these tests on another goroutine.
const waitTimeout = 10 * time.Second

func TestPeerHoldLetsNoRequestGoUntilTheWaitThenOneProbeAtATime(t *testing.T) {
	var h peerHold
	ctx := context.Background()
	if probe, err := h.wait(ctx); probe || err != nil {
		t.Fatalf("a peer that asked nothing: probe %v, err %v; want a plain request", probe, err)
	}
	h.settle(false, 0, time.Now())
	asked := time.Now()
	if added := h.settle(false, 300*time.Millisecond, asked); added != 300*time.Millisecond {
		t.Fatalf("the first deferral held the peer %v, want 300ms", added)
	}
	// A second deferral within the first extends the hold by the difference.
	if added := h.settle(false, 200*time.Millisecond, asked); added != 0 {
		t.Fatalf("a shorter deferral within the hold added %v, want 0", added)
	}
	type result struct {
		probe bool
		at    time.Time
	}
	results := make(chan result, 3)
	for range 3 {
		go func() {
			probe, err := h.wait(ctx)
			if err != nil {
				t.Error(err)
			}
			results <- result{probe, time.Now()}
		}()
	}
	first := <-results
	if !first.probe || first.at.Before(asked.Add(300*time.Millisecond)) {
		t.Fatalf("first request: probe %v at %v after the deferral; want the probe, not before 300ms", first.probe, first.at.Sub(asked))
	}
	// The others wait for the probe's answer; it defers again.
	h.settle(true, 200*time.Millisecond, time.Now())
	second := <-results
	if !second.probe {
		t.Fatal("after a second deferral the next request was not a probe")
	}
	h.settle(true, 0, time.Now()) // the peer took it
	if third := <-results; third.probe {
		t.Fatal("after an answer that was not a deferral, a request was still a probe")
	}
	if probe, _ := h.wait(ctx); probe {
		t.Fatal("a later request was a probe")
	}
}

func TestPeerHoldWaitEndsWithItsContext(t *testing.T) {
	var h peerHold
	h.settle(false, peerwire.RetryAfterCap, time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := h.wait(ctx); done <- err }()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("wait ended without an error when its context did")
		}
	case <-time.After(waitTimeout):
		t.Fatal("wait outlived its context")
	}
}
