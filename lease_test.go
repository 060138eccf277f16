package main

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/wireframe"
)

// leaseTestUnit is one second of Workload-Lease in the in-process tests: a
// lease of 5 runs out after 100 ms, so they run in milliseconds. The real
// binary's tests (e2e/lease_test.go) use real seconds.
const leaseTestUnit = 20 * time.Millisecond

// leasedInfo is a workload object as a producer posts it to the ingress:
// no originatedFrom (stamped), the fields an expiry must keep, and one of
// the producer's own.
func leasedInfo(id, state string, seq int) map[string]any {
	w := testframe.Workload(id, state, "", map[string]any{"seq": seq, "requesterId": "lease-test", "harnessSlot": 3,
		"startedAt": json.RawMessage("1789661458000"), "completedAt": json.RawMessage("null"), "error": json.RawMessage("null")})
	delete(w, "originatedFrom")
	return w
}

// leaseNode is a node with its ingress on whose leases run leaseTestUnit
// per second; not started.
func leaseNode(t *testing.T, opts ...nodeOption) *testNode {
	t.Helper()
	n := newTestNode(t, opts...)
	n.m.setLeaseUnit(leaseTestUnit)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return n
}

// leasePair is a started leaseNode a and its pinned peer b, meshed.
func leasePair(t *testing.T, opts ...nodeOption) (a, b *testNode) {
	t.Helper()
	a, b = leaseNode(t, opts...), newTestNode(t)
	mesh(t, a, b)
	return a, b
}

// postLeased posts w to n's ingress with the lease given (none when 0) and
// requires 200.
func postLeased(t *testing.T, n *testNode, w map[string]any, seconds int) {
	t.Helper()
	var h []string
	if seconds > 0 {
		h = []string{ingress.LeaseHeader, itoa(seconds)}
	}
	if st, text := testkit.PostIngress(t, n.m.IngressAddr(), string(testframe.Lifecycle(w, nil)), h...); st != http.StatusOK {
		t.Fatalf("post %s %s with lease %d: %d %s", w["id"], w["state"], seconds, st, text)
	}
}

// leaseUpserts returns the workload objects n's broker got for id, in order.
func leaseUpserts(n *testNode, id string) []map[string]any {
	var out []map[string]any
	for _, w := range n.Upserts() {
		if w["id"] == id {
			out = append(out, w)
		}
	}
	return out
}

// leaseExpiries returns the objects n's broker got for id that an expiry
// wrote.
func leaseExpiries(n *testNode, id string) []map[string]any {
	var out []map[string]any
	for _, w := range leaseUpserts(n, id) {
		if e, _ := w["error"].(string); strings.HasPrefix(e, "producer stopped reporting") {
			out = append(out, w)
		}
	}
	return out
}

// waitExpiry waits until n's broker got the expiry of id and returns it.
func waitExpiry(t *testing.T, n *testNode, id string) map[string]any {
	t.Helper()
	testkit.Eventually(t, "the expiry of "+id+" at "+n.id[:8]+"'s broker", func() bool { return len(leaseExpiries(n, id)) > 0 })
	return leaseExpiries(n, id)[0]
}

// terminalStates returns the terminal states n's broker got for id in
// order, a repeat (a re-assertion) counted once.
func terminalStates(n *testNode, id string) []string {
	var out []string
	for _, w := range leaseUpserts(n, id) {
		s, _ := w["state"].(string)
		if wireframe.IsTerminalState(s) && (len(out) == 0 || out[len(out)-1] != s) {
			out = append(out, s)
		}
	}
	return out
}

func leaseCount(n *testNode) int { return n.m.table.Sizes().Leases }

// leaseDeadlineOf is run key's lease deadline, and whether it has one.
func leaseDeadlineOf(n *testNode, key wireframe.WorkloadKey) (time.Time, bool) {
	at := n.m.table.LeaseOf(key)
	return at, !at.IsZero()
}

func TestWorkloadLeaseHeaderOutsideItsRulesIs400AndWritesNothing(t *testing.T) {
	n := leaseNode(t)
	n.start()
	addr := n.m.IngressAddr()
	running := string(testframe.Lifecycle(leasedInfo("bad-lease", "running", 1), nil))
	cases := []struct {
		name   string
		frame  string
		values []string
		reason string
	}{
		{"zero", running, []string{"0"}, "must be a whole number of seconds from 5 to 86400"},
		{"four, under the shortest", running, []string{"4"}, "from 5 to 86400"},
		{"a day and a second", running, []string{"86401"}, "from 5 to 86400"},
		{"a word", running, []string{"abc"}, `"abc"`},
		{"empty", running, []string{""}, "from 5 to 86400"},
		{"a fraction", running, []string{"5.0"}, "from 5 to 86400"},
		{"signed", running, []string{"+5"}, "from 5 to 86400"},
		{"negative", running, []string{"-5"}, "from 5 to 86400"},
		{"past every integer", running, []string{"99999999999999999999"}, "from 5 to 86400"},
		{"a list", running, []string{"5, 10"}, "from 5 to 86400"},
		{"two headers", running, []string{"10", "10"}, "given 2 times"},
		{"on a completed frame", string(testframe.Lifecycle(leasedInfo("bad-lease", "completed", 2), nil)), []string{"10"}, "on a completed frame"},
		{"on a failed frame", string(testframe.Lifecycle(leasedInfo("bad-lease", "failed", 2), nil)), []string{"10"}, "on a failed frame"},
		{"on a cancelled frame", string(testframe.Lifecycle(leasedInfo("bad-lease", "cancelled", 2), nil)), []string{"10"}, "on a cancelled frame"},
		{"on a removal", `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"bad-lease"}}`, []string{"10"}, "on a removal"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Content-Type": {"application/json"}, ingress.LeaseHeader: tc.values}
			st, text := testkit.MustDo(t, addr, testkit.Request{Header: h, Body: tc.frame})
			if st != http.StatusBadRequest || !strings.Contains(text, ingress.LeaseHeader) || !strings.Contains(text, tc.reason) {
				t.Fatalf("%s %q: %d %q, want 400 naming %s and %q", ingress.LeaseHeader, tc.values, st, text, ingress.LeaseHeader, tc.reason)
			}
		})
	}
	ifxBrokerBarrier(t, n)
	if fs := n.broker.WithMethod(wireframe.MethodUpsert); len(fs) != 0 {
		t.Fatalf("the broker got %d upserts from refused frames", len(fs))
	}
	if fs := n.broker.WithMethod(wireframe.MethodRemove); len(fs) != 0 {
		t.Fatalf("the broker got %d removals from refused frames", len(fs))
	}
	if ifxIsTracked(n, n.id, "bad-lease") || leaseCount(n) != 0 {
		t.Fatalf("a refused frame was tracked (%v) or leased (%d leases)", ifxIsTracked(n, n.id, "bad-lease"), leaseCount(n))
	}
	if got := n.m.leases.refused.Load(); got != uint64(len(cases)) {
		t.Fatalf("nvpair_wlm_lease_header_refusals_total = %d, want %d", got, len(cases))
	}
}

func TestWorkloadLeaseFromFiveSecondsToADayArmsALeaseOfThatLength(t *testing.T) {
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	for _, seconds := range []int{minLeaseSeconds, maxLeaseSeconds} {
		id := "lease-" + itoa(seconds)
		before := time.Now()
		postLeased(t, n, leasedInfo(id, "queued", 1), seconds)
		after := time.Now()
		at, ok := leaseDeadlineOf(n, wireframe.WorkloadKey{Origin: n.id, Engine: "llamacpp", RunID: "run-" + id, ID: id})
		want := time.Duration(seconds) * time.Second
		if !ok || at.Before(before.Add(want)) || at.After(after.Add(want)) {
			t.Fatalf("lease of %d s: deadline %v (held %v), want %v after the post", seconds, at, ok, want)
		}
	}
}

func TestALeasedJobNotRenewedIsRetiredAsFailedAtItsBrokerAndThePeer(t *testing.T) {
	a, b := leasePair(t)
	queued := leasedInfo("crashed", "queued", 1)
	queued["scheduledOn"] = a.id
	postLeased(t, a, queued, 5)
	running := leasedInfo("crashed", "running", 2)
	running["scheduledOn"] = a.id
	posted := time.Now().UnixMilli()
	postLeased(t, a, running, 5)

	for _, n := range []*testNode{a, b} {
		got := waitExpiry(t, n, "crashed")
		want := map[string]any{"id": "crashed", "runId": "run-crashed", "model": "qwen3.5-9b", "engine": "llamacpp",
			"originatedFrom": a.id, "scheduledOn": a.id, "createdAt": 1789661457000.0, "startedAt": 1789661458000.0,
			"requesterId": "lease-test", "harnessSlot": 3.0, "state": "failed", "seq": 3.0,
			"error": "producer stopped reporting: lease of 5 s expired"}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s's broker: the expiry's %s = %v, want %v (the whole object: %v)", n.id[:8], k, got[k], v, got)
			}
		}
		if c, ok := got["completedAt"].(float64); !ok || int64(c) < posted {
			t.Errorf("%s's broker: completedAt %v, want the time of the expiry (after %d)", n.id[:8], got["completedAt"], posted)
		}
		if ts := terminalStates(n, "crashed"); len(ts) != 1 {
			t.Errorf("%s's broker got terminal states %v, want the one expiry", n.id[:8], ts)
		}
	}
	if held := resyncHeld(t, a, a.id, "crashed"); held["state"] != "failed" {
		t.Fatalf("the re-sync set holds %v, want the expiry (re-asserted as failed)", held)
	}
	if leaseCount(a) != 0 || a.m.leases.expired.Load() != 1 {
		t.Fatalf("after the expiry: %d leases held, %d expired; want 0 and 1", leaseCount(a), a.m.leases.expired.Load())
	}
	if !a.logs.Contains("lease expired: job retired as failed", "id=crashed", "leaseSeconds=5") {
		t.Fatalf("no log line for the expiry:\n%s", a.logs)
	}
	var metrics bytes.Buffer
	if err := a.m.writeMetrics(&metrics); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"nvpair_wlm_leases_expired_total 1", "nvpair_wlm_leases_active 0", "nvpair_wlm_leases_renewed_total 1"} {
		if !strings.Contains(metrics.String(), line+"\n") {
			t.Errorf("the metrics lack %q", line)
		}
	}
}

func TestExpiryKeepsTheJobsFieldsAndSetsTheOnesThatEndIt(t *testing.T) {
	now := time.UnixMilli(1789661460123)
	const errText = "producer stopped reporting: lease of 7 s expired"
	cases := []struct {
		name      string
		params    string
		seq       int64
		hasSeq    bool
		knownOnly bool
		want      string
	}{
		{"a running job with a seq", `{"workloadInfo":{"id":"j","seq":4,"state":"running","error":null,"completedAt":null,"x":[1]},"batch":"b"}`, 4, true, false,
			`{"id":"j","seq":5,"state":"failed","error":"` + errText + `","completedAt":1789661460123,"x":[1]}`},
		{"no seq: none is added", `{"workloadInfo":{"id":"j","state":"queued"}}`, 0, false, false,
			`{"id":"j","state":"failed","completedAt":1789661460123,"error":"` + errText + `"}`},
		{"the largest seq stays", `{"workloadInfo":{"id":"j","seq":9223372036854775807,"state":"running"}}`, math.MaxInt64, true, false,
			`{"id":"j","seq":9223372036854775807,"state":"failed","completedAt":1789661460123,"error":"` + errText + `"}`},
		{"known fields only", `{"workloadInfo":{"id":"j","pad":"xxxx","state":"running","requesterId":"r"}}`, 0, false, true,
			`{"id":"j","state":"failed","requesterId":"r","completedAt":1789661460123,"error":"` + errText + `"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := buildExpiryInfo(json.RawMessage(tc.params), errText, now, tc.seq, tc.hasSeq, tc.knownOnly)
			if err != nil || string(got) != tc.want {
				t.Fatalf("buildExpiryInfo = %s, %v\nwant %s", got, err, tc.want)
			}
		})
	}
}

// A control lease armed after the one under test and running out later
// serves as the clock: once its expiry is at the broker, the loop has
// passed the earlier deadline too.
func TestWhatEndsALease(t *testing.T) {
	cases := []struct {
		name string
		end  func(t *testing.T, n *testNode, id string)
	}{
		{"the producer's terminal frame", func(t *testing.T, n *testNode, id string) {
			postLeased(t, n, leasedInfo(id, "completed", 3), 0)
		}},
		{"the producer's removal", func(t *testing.T, n *testNode, id string) {
			if st, text := testkit.PostIngress(t, n.m.IngressAddr(), `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"`+id+`"}}`); st != http.StatusOK {
				t.Fatalf("removal: %d %s", st, text)
			}
		}},
		{"a frame of the producer's without the header", func(t *testing.T, n *testNode, id string) {
			postLeased(t, n, leasedInfo(id, "running", 3), 0)
		}},
		{"the broker's terminal frame (cancelled in the Jobs list)", func(t *testing.T, n *testNode, id string) {
			w := leasedInfo(id, "cancelled", 3)
			w["originatedFrom"] = n.id
			n.sendLifecycle(w)
		}},
		{"the broker's removal (removed from the Jobs list)", func(t *testing.T, n *testNode, id string) {
			n.sendRemove(id)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := leaseNode(t)
			n.start()
			postLeased(t, n, leasedInfo("ended", "running", 2), 5)
			tc.end(t, n, "ended")
			testkit.Eventually(t, "the lease to end", func() bool { return leaseCount(n) == 0 })
			postLeased(t, n, leasedInfo("clock", "running", 1), 10)
			waitExpiry(t, n, "clock")
			if got := leaseExpiries(n, "ended"); len(got) != 0 {
				t.Fatalf("the ended lease still expired: %v", got)
			}
			// Ended by the frame, not found dead at its deadline.
			if got := n.m.leases.failures.Get("no_entry"); got != 0 {
				t.Fatalf("the lease outlived its job until its deadline (%d dropped for want of a live run)", got)
			}
		})
	}
}

func TestABrokerFrameThatDoesNotEndTheJobLeavesItsLease(t *testing.T) {
	n := leaseNode(t)
	n.start()
	postLeased(t, n, leasedInfo("kept", "queued", 1), 5)
	w := leasedInfo("kept", "running", 2)
	w["originatedFrom"] = n.id
	n.sendLifecycle(w)
	got := waitExpiry(t, n, "kept")
	if got["seq"] != 3.0 {
		t.Fatalf("the expiry %v does not follow the broker's running frame (seq 2)", got)
	}
}

func TestARenewalMovesTheDeadlineByTheLengthItGives(t *testing.T) {
	n := leaseNode(t)
	n.start()
	postLeased(t, n, leasedInfo("renewed", "running", 1), 5)
	renewedAt := time.Now()
	postLeased(t, n, leasedInfo("renewed", "running", 1), 60) // the same frame again: a renewal
	postLeased(t, n, leasedInfo("clock", "running", 1), 10)
	waitExpiry(t, n, "clock")
	if got := leaseExpiries(n, "renewed"); len(got) != 0 {
		t.Fatalf("the renewed lease expired at its first deadline: %v", got)
	}
	at, ok := leaseDeadlineOf(n, wireframe.WorkloadKey{Origin: n.id, Engine: "llamacpp", RunID: "run-renewed", ID: "renewed"})
	if want := renewedAt.Add(60 * leaseTestUnit); !ok || at.Before(want) {
		t.Fatalf("deadline %v (held %v), want at least %v: the renewal's length", at, ok, want)
	}
	if n.m.table.Stats().LeaseRenewed.Load() != 1 {
		t.Fatalf("nvpair_wlm_leases_renewed_total = %d, want 1", n.m.table.Stats().LeaseRenewed.Load())
	}
	if got := waitExpiry(t, n, "renewed"); got["error"] != leaseExpiryError(60) {
		t.Fatalf("the expiry says %q, want the renewal's length", got["error"])
	}
}

// Expiry races a producer's late terminal frame: both take their place in
// the broker order under ingestMu, so one is written and committed before
// the other. Whichever comes second,
// the broker and the peer end on the same terminal state.
func TestExpiryRacingALateTerminalFrameEndsInOneTerminalStateEverywhere(t *testing.T) {
	t.Run("the expiry first: the producer's frame is the later word", func(t *testing.T) {
		stall := &liStallingWriter{match: []byte("producer stopped reporting"), entered: make(chan struct{}), release: make(chan struct{})}
		a := leaseNode(t, func(c *Config) { stall.w = c.Out; c.Out = stall })
		t.Cleanup(stall.unblock)
		b := newTestNode(t)
		mesh(t, a, b)
		postLeased(t, a, leasedInfo("raced", "running", 1), 5)
		<-stall.entered // the expiry is in its broker write
		done := make(chan int, 1)
		go func() {
			st, _ := testkit.PostIngress(t, a.m.IngressAddr(), string(testframe.Lifecycle(leasedInfo("raced", "completed", 2), nil)))
			done <- st
		}()
		testkit.Eventually(t, "the producer's frame to wait behind the expiry", func() bool { return a.m.ingressWaiters.Waiting() == 1 })
		stall.unblock()
		if st := <-done; st != http.StatusOK {
			t.Fatalf("the late terminal frame: %d", st)
		}
		// The origin's broker is written both, in order; the peer is sent
		// the run's latest state, which may be the completed frame alone
		// when the expiry had not yet gone out.
		testkit.Eventually(t, "both terminal frames at "+a.id[:8], func() bool { return len(terminalStates(a, "raced")) == 2 })
		if got := terminalStates(a, "raced"); got[0] != "failed" || got[1] != "completed" {
			t.Fatalf("%s's broker got %v, want failed then completed", a.id[:8], got)
		}
		testkit.Eventually(t, "the completed frame at "+b.id[:8], func() bool {
			got := terminalStates(b, "raced")
			return len(got) > 0 && got[len(got)-1] == "completed"
		})
		if held := resyncHeld(t, a, a.id, "raced"); held["state"] != "completed" {
			t.Fatalf("the re-sync set holds %v, want completed (re-asserted to every peer)", held["state"])
		}
	})
	t.Run("the producer's frame first: no expiry is ever written", func(t *testing.T) {
		stall := &liStallingWriter{match: []byte(`"state":"completed"`), entered: make(chan struct{}), release: make(chan struct{})}
		a := leaseNode(t, func(c *Config) { stall.w = c.Out; c.Out = stall })
		t.Cleanup(stall.unblock)
		b := newTestNode(t)
		mesh(t, a, b)
		postLeased(t, a, leasedInfo("raced", "running", 1), 5)
		done := make(chan int, 1)
		go func() {
			st, _ := testkit.PostIngress(t, a.m.IngressAddr(), string(testframe.Lifecycle(leasedInfo("raced", "completed", 2), nil)))
			done <- st
		}()
		<-stall.entered // the producer's frame is in its broker write
		testkit.Eventually(t, "the lease to come due", func() bool { _, due := a.m.table.DueLease(time.Now()); return due })
		stall.unblock()
		if st := <-done; st != http.StatusOK {
			t.Fatalf("the terminal frame: %d", st)
		}
		postLeased(t, a, leasedInfo("clock", "running", 1), 5)
		waitExpiry(t, a, "clock")
		waitExpiry(t, b, "clock")
		for _, n := range []*testNode{a, b} {
			if got := terminalStates(n, "raced"); len(got) != 1 || got[0] != "completed" {
				t.Fatalf("%s's broker got terminal states %v, want completed alone", n.id[:8], got)
			}
		}
		if got := a.m.leases.failures.Get("no_entry"); got != 0 {
			t.Fatalf("the expiry went on with a lease the producer's frame had ended (%d dropped)", got)
		}
	})
	t.Run("a renewal first: the job lives on", func(t *testing.T) {
		stall := &liStallingWriter{match: []byte(`"seq":2`), entered: make(chan struct{}), release: make(chan struct{})}
		a := leaseNode(t, func(c *Config) { stall.w = c.Out; c.Out = stall })
		t.Cleanup(stall.unblock)
		a.start()
		postLeased(t, a, leasedInfo("raced", "running", 1), 5)
		done := make(chan int, 1)
		go func() {
			// The longest lease there is (86400 units: half an hour here),
			// so the renewed lease cannot also run out while the clock job
			// below expires on a loaded machine.
			st, _ := testkit.PostIngress(t, a.m.IngressAddr(), string(testframe.Lifecycle(leasedInfo("raced", "running", 2), nil)), ingress.LeaseHeader, "86400")
			done <- st
		}()
		<-stall.entered // the renewal is in its broker write, not yet committed
		testkit.Eventually(t, "the lease to come due", func() bool { _, due := a.m.table.DueLease(time.Now()); return due })
		stall.unblock()
		if st := <-done; st != http.StatusOK {
			t.Fatalf("the renewal: %d", st)
		}
		postLeased(t, a, leasedInfo("clock", "running", 1), 10)
		waitExpiry(t, a, "clock")
		if got := leaseExpiries(a, "raced"); len(got) != 0 {
			t.Fatalf("a job renewed before its expiry was written was retired: %v", got)
		}
		if _, held := leaseDeadlineOf(a, wireframe.WorkloadKey{Origin: a.id, Engine: "llamacpp", RunID: "run-raced", ID: "raced"}); !held {
			t.Fatal("the renewed lease is gone")
		}
	})
}

// The daemon shuts down after a failed broker write; until it has, the
// expiry is retried with a bounded backoff, never dropped.
func TestALeaseWhoseExpiryCannotBeWrittenIsRetriedWithBackoffNotDropped(t *testing.T) {
	n := newTestNode(t, func(c *Config) {
		c.Out = &netMarkerFailingWriter{w: c.Out, marker: []byte("producer stopped reporting")}
	})
	clock := ifxUseClock(n)
	if _, err := n.m.ingestLocalLeased(testframe.Lifecycle(leasedInfo("stuck", "running", 1), nil), []string{"5"}); err != nil {
		t.Fatal(err)
	}
	key := wireframe.WorkloadKey{Origin: n.id, Engine: "llamacpp", RunID: "run-stuck", ID: "stuck"}
	n.m.expireDue()
	if _, held := leaseDeadlineOf(n, key); !held || n.m.leases.failures.Get("broker_write") != 0 {
		t.Fatal("a lease was expired before its deadline")
	}
	wantDelays := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	clock.advance(5 * time.Second)
	for i, d := range wantDelays {
		n.m.expireDue()
		at, held := leaseDeadlineOf(n, key)
		if !held || !at.Equal(clock.now().Add(d)) {
			t.Fatalf("failure %d: lease held %v, next try %v after now, want %v", i+1, held, at.Sub(clock.now()), d)
		}
		if got := n.m.leases.failures.Get("broker_write"); got != uint64(i+1) {
			t.Fatalf("failure %d: nvpair_wlm_lease_expiry_failures_total{reason=broker_write} = %d", i+1, got)
		}
		clock.advance(d)
	}
	if held := resyncHeld(t, n, n.id, "stuck"); held["state"] != "running" {
		t.Fatalf("an expiry the broker never got was tracked: %v", held)
	}
	if !n.logs.Contains("lease expiry not written to the broker; trying again", "id=stuck") {
		t.Fatalf("no warning for the failed expiry:\n%s", n.logs)
	}
}

func TestAnExpiryOverTheBrokerLineLimitRetiresTheJobWithItsKnownFields(t *testing.T) {
	n := newTestNode(t, withBrokerLineMax(wireframe.MinBrokerLineMax))
	clock := ifxUseClock(n)
	w := leasedInfo("wide", "running", 1)
	// The running frame's line to the broker is 20 bytes under the limit;
	// the expiry's, some 60 bytes longer, would be over it.
	lineOf := func() int {
		w["originatedFrom"] = n.id // as the ingress stamps it
		stamped, _ := json.Marshal(w)
		delete(w, "originatedFrom")
		return len(wireframe.EncodeNotification(wireframe.MethodUpsert, []byte(`{"workloadInfo":`+string(stamped)+`}`))) + 1
	}
	w["pad"] = ""
	w["pad"] = strings.Repeat("p", wireframe.MinBrokerLineMax-20-lineOf())
	if _, err := n.m.ingestLocalLeased(testframe.Lifecycle(w, nil), []string{"5"}); err != nil {
		t.Fatal(err)
	}
	clock.advance(5 * time.Second)
	n.m.expireDue()
	got := waitExpiry(t, n, "wide")
	if _, ok := got["pad"]; ok || got["harnessSlot"] != nil || got["requesterId"] != "lease-test" || got["state"] != "failed" {
		t.Fatalf("the expiry %v: want the known fields only, failed", got)
	}
	if leaseCount(n) != 0 || n.m.leases.expired.Load() != 1 {
		t.Fatalf("%d leases left, %d expired", leaseCount(n), n.m.leases.expired.Load())
	}
	if !n.logs.Contains("level=WARN", "lease expiry frame over the broker line limit", "id=wide") {
		t.Fatalf("no warning for the narrowed expiry:\n%s", n.logs)
	}
}

// A lease is held only by a live workload, so the leases are bounded by
// --max-live-workloads: at the bound a new leased job gets the set's 503.
func TestLeasesAreBoundedByTheLiveWorkloadLimit(t *testing.T) {
	n := leaseNode(t, withMaxLiveWorkloads(2))
	n.start()
	addr := n.m.IngressAddr()
	postLeased(t, n, leasedInfo("one", "running", 1), 60)
	postLeased(t, n, leasedInfo("two", "running", 1), 60)
	st, text := testkit.PostIngress(t, addr, string(testframe.Lifecycle(leasedInfo("three", "running", 1), nil)), ingress.LeaseHeader, "60")
	if st != http.StatusServiceUnavailable || !strings.Contains(text, "--max-live-workloads") {
		t.Fatalf("a third leased job at the limit of 2: %d %q, want 503 naming the limit", st, text)
	}
	postLeased(t, n, leasedInfo("one", "running", 2), 60) // a renewal is no new workload
	if leaseCount(n) != 2 {
		t.Fatalf("%d leases, want 2", leaseCount(n))
	}
	var metrics bytes.Buffer
	if err := n.m.writeMetrics(&metrics); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics.String(), "nvpair_wlm_leases_limit 2\n") || !strings.Contains(metrics.String(), "nvpair_wlm_leases_active 2\n") {
		t.Fatal("the metrics do not show the leases and their limit")
	}
}

// A leased frame that arrives after its run finished is written and
// relayed as every frame is, but it is no sign that the run lives: it arms
// nothing, so no expiry ever follows the run's own end.
func TestALeasedFrameTooLateForAFinishedRunArmsNoLease(t *testing.T) {
	n := leaseNode(t)
	n.start()
	postLeased(t, n, leasedInfo("late", "completed", 2), 0)
	postLeased(t, n, leasedInfo("late", "running", 1), 5)
	if leaseCount(n) != 0 {
		t.Fatalf("%d leases after a running frame for a finished run", leaseCount(n))
	}
	postLeased(t, n, leasedInfo("clock", "running", 1), 10)
	waitExpiry(t, n, "clock")
	if got := leaseExpiries(n, "late"); len(got) != 0 {
		t.Fatalf("a finished run got an expiry: %v", got)
	}
}
