package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/wireframe"
)

// gatedWriter holds every write of a relayed frame (workloads:upsert,
// workloads:remove) until open is called, as a broker that stops reading
// its stdout holds the daemon's writes: the writer blocks with the broker
// writer's mutex held. The daemon's own frames (ready, answers) pass.
type gatedWriter struct {
	w    io.Writer
	gate chan struct{}
	once sync.Once
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"method":"`+wireframe.MethodUpsert+`"`)) || bytes.Contains(p, []byte(`"method":"`+wireframe.MethodRemove+`"`)) {
		<-g.gate
	}
	return g.w.Write(p)
}

func (g *gatedWriter) open() { g.once.Do(func() { close(g.gate) }) }

// withGatedBroker makes the node's broker stop reading relayed frames
// until the returned writer is opened; it is opened at cleanup anyway.
func withGatedBroker(t *testing.T) (nodeOption, *gatedWriter) {
	g := &gatedWriter{gate: make(chan struct{})}
	t.Cleanup(g.open)
	return func(c *Config) { g.w = c.Out; c.Out = g }, g
}

func TestRequestsBeyondTheBrokerWaitersBoundAre503WithRetryAfterAndLeaveNothingBehind(t *testing.T) {
	type channel struct {
		name    string
		waiters func(m *Manager) *brokerio.Waiters
		// post sends the frame for id on this channel and returns the
		// answer, or a zero answer when none came within.
		post func(t *testing.T, id string, within time.Duration) testkit.BusyAnswer
		// other posts on the other channel, which must not be refused.
		other func(t *testing.T, id string, within time.Duration) testkit.BusyAnswer
	}
	opt, gate := withGatedBroker(t)
	h := newNetPeerHarnessWith(t, func(n *testNode) {
		if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}, opt, withConnLimits(httpguard.ConnLimits{PeerPerSource: 1024}))
	ingressPost := func(t *testing.T, id string, within time.Duration) testkit.BusyAnswer {
		return testkit.DoBusyAnswer(t, within, http.DefaultClient, "http://"+h.n.m.IngressAddr()+wireframe.EventsPath, "application/json",
			[]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON(id, "running", ""))))
	}
	peerPost := func(t *testing.T, id string, within time.Duration) testkit.BusyAnswer {
		return testkit.DoBusyAnswer(t, within, h.c, "https://"+h.addr+wireframe.EventsPath, "application/json",
			testframe.Lifecycle(testframe.Workload(id, "running", h.client.Principal), nil))
	}
	peerBatch := func(t *testing.T, id string, within time.Duration) testkit.BusyAnswer {
		return testkit.DoBusyAnswer(t, within, h.c, "https://"+h.addr+wireframe.EventsPath, peerwire.BatchContentType,
			append(testframe.Lifecycle(testframe.Workload(id, "running", h.client.Principal), nil), '\n'))
	}
	channels := []channel{
		{"ingress", func(m *Manager) *brokerio.Waiters { return m.ingressWaiters }, ingressPost, peerPost},
		{"peer", func(m *Manager) *brokerio.Waiters { return m.peerWaiters }, peerPost, ingressPost},
		{"peer batch", func(m *Manager) *brokerio.Waiters { return m.peerWaiters }, peerBatch, ingressPost},
	}
	for _, c := range channels {
		t.Run(c.name, func(t *testing.T) {
			gate = gateAgain(t, h.n, gate)
			waiters := c.waiters(h.n.m)
			var wg sync.WaitGroup
			// However this case ends, its requests are let through and
			// waited for before the next case.
			t.Cleanup(func() { gate.open(); wg.Wait() })
			answers := make(chan testkit.BusyAnswer, brokerio.WaitersMax+1)
			for i := range brokerio.WaitersMax {
				wg.Go(func() { answers <- c.post(t, c.name+"-waiting-"+itoa(i), testkit.WaitTimeout) })
			}
			testkit.Eventually(t, "every slot taken", func() bool { return waiters.Waiting() == brokerio.WaitersMax })

			refusedBefore := waiters.Refused()
			// At once: a refusal that waited would hold what the bound saves.
			a := c.post(t, c.name+"-refused", 2*time.Second)
			if a.Status != http.StatusServiceUnavailable || a.RetryAfter != "1" || !a.ConnectionClosing || !strings.HasPrefix(a.Text, brokerio.ReasonBusyPrefix) {
				t.Fatalf("request over the bound: %+v, want 503, Retry-After: 1, Connection: close, a reason naming the bound", a)
			}
			if got := waiters.Refused() - refusedBefore; got != 1 {
				t.Fatalf("refusals counted: %d, want 1", got)
			}
			// The other channel has slots of its own.
			wg.Go(func() { answers <- c.other(t, c.name+"-other", testkit.WaitTimeout) })
			otherWaiters := h.n.m.peerWaiters
			if waiters == h.n.m.peerWaiters {
				otherWaiters = h.n.m.ingressWaiters
			}
			testkit.Eventually(t, "the other channel's request waiting, not refused", func() bool { return otherWaiters.Waiting() == 1 })

			gate.open()
			wg.Wait()
			close(answers)
			for a := range answers {
				if a.Status != http.StatusOK {
					t.Fatalf("a waiting request got %+v once the broker read again, want 200", a)
				}
			}
			// Nothing of the refused request was kept: not tracked, not in
			// the dedup, so the same frame now goes through as new.
			if resyncHeldID(h.n, c.name+"-refused") {
				t.Fatal("the refused frame was tracked")
			}
			if a := c.post(t, c.name+"-refused", testkit.WaitTimeout); a.Status != http.StatusOK {
				t.Fatalf("the refused frame, sent again once the broker reads: %+v, want 200", a)
			}
			testkit.Eventually(t, "the refused frame at the broker once sent again", func() bool { return netUpsertIDs(h.n)[c.name+"-refused"] == 1 })
		})
	}
}

// gateAgain gives n a closed gate for the next case when g was opened.
func gateAgain(t *testing.T, n *testNode, g *gatedWriter) *gatedWriter {
	select {
	case <-g.gate:
	default:
		return g
	}
	next := &gatedWriter{w: g.w, gate: make(chan struct{})}
	t.Cleanup(next.open)
	n.m.out.SwapWriter(next)
	return next
}

// resyncHeldID reports whether n's re-sync set holds a run of id.
func resyncHeldID(n *testNode, id string) bool {
	for _, l := range passLines(n.m) {
		if bytes.Contains(l, []byte(`"id":"`+id+`"`)) {
			return true
		}
	}
	return false
}

// newNetPeerHarnessWith is newNetPeerHarness with before run on the node
// before it starts (to enable its ingress, say).
func newNetPeerHarnessWith(t *testing.T, before func(*testNode), opts ...nodeOption) *netPeerHarness {
	t.Helper()
	n := newTestNode(t, opts...)
	client := testkit.Mint(t, devpki.NewUUID())
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, client))
	before(n)
	n.start()
	return &netPeerHarness{n: n, client: client, c: testkit.PeerClient(t, &client, n.ident.DER), addr: n.m.PeerAddr().String()}
}

// TestARequestBeyondTheBoundWaitsBrieflyForASlot: a slot freed while a
// request waits for one is taken, so a burst beyond the bound is a short
// queue; with none freed, the request is refused once its patience is up,
// and sooner when its client goes away.
func TestARequestBeyondTheBoundWaitsBrieflyForASlot(t *testing.T) {
	b := brokerio.NewWaiters("ingress", 2)
	for range 2 {
		if !b.Acquire(nil) {
			t.Fatal("a free slot was refused")
		}
	}
	got := make(chan bool, 1)
	go func() { got <- b.Acquire(nil) }()
	b.Release() // while the third waits, or before it looks: it gets the slot either way
	if !<-got {
		t.Fatal("a request that found every slot taken was refused although one was freed at once")
	}

	start := time.Now()
	if b.Acquire(nil) {
		t.Fatal("a slot was taken with none free")
	}
	if waited := time.Since(start); waited < brokerio.WaiterPatience {
		t.Fatalf("refused after %v, before the %v of patience", waited, brokerio.WaiterPatience)
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if b.Acquire(gone) {
		t.Fatal("a slot was taken with none free for a client that went away")
	}
	if waited := time.Since(start); waited >= brokerio.WaiterPatience {
		t.Fatalf("a request whose client went away waited %v, its whole patience", waited)
	}
	if b.Refused() != 2 {
		t.Fatalf("%d refusals counted, want 2", b.Refused())
	}
}
