package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/clustertrust"
	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
)

// stallReads makes the node's trust reads block, once stall is set, until
// the test ends, and returns stall and a channel that receives when a read
// is blocked. Called before the node runs.
func stallReads(t *testing.T, tr *clustertrust.ClusterTrust) (stall *atomic.Bool, stalled <-chan struct{}) {
	stall = new(atomic.Bool)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	t.Cleanup(func() { close(release) })
	tr.SetReadHookForTest(func(string) {
		if stall.Load() {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
		}
	})
	return stall, entered
}

func TestShutdownDoesNotWaitForATrustReadInProgress(t *testing.T) {
	n := newTestNode(t)
	stall, stalled := stallReads(t, n.m.trust)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.m.Run(ctx) }()
	n.broker.WaitMethod("ready", 1)

	stall.Store(true)
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, testkit.Mint(t, devpki.NewUUID()))) // a change, so the next reload reads
	select {
	case <-stalled:
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("no reload read the new pin")
	}
	start := time.Now()
	cancel()
	limit := n.m.cfg.DrainTimeout + time.Second
	select {
	case <-done:
		t.Logf("Run returned %v after cancel with a trust read blocked", time.Since(start).Round(time.Millisecond))
	case <-time.After(limit):
		t.Fatalf("Run still running %v (the drain timeout plus 1 s) after cancel while a trust read was blocked", limit)
	}
}
