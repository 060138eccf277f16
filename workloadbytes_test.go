package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// Tests of the byte bounds (bounds.go, internal/wireframe/workloadbytes.go): one frame's params on every
// path, the re-sync set's bytes and each peer queue's bytes.

func withWorkloadMaxBytes(n int) nodeOption {
	return func(c *Config) { c.WorkloadMaxBytes = n }
}

// setResyncMaxBytes lowers the re-sync set's byte bound below what
// --max-live-workload-bytes accepts, so a test fills it with a few small
// frames. Call it before the node takes frames.
func setResyncMaxBytes(n *testNode, b int64) {
	n.m.cfg.MaxLiveWorkloadBytes = b
	n.m.table.SetMaxLiveBytes(b)
}

// resyncBytes is what the node's table re-asserts, in bytes.
func resyncBytes(n *testNode) int64 { return n.m.table.Sizes().RunBytes }

// paddedParams is a lifecycle frame's params of exactly size bytes: the
// workload (with origin, when not empty) and a member of the producer's
// own beside it, padded to the size.
func paddedParams(t testing.TB, id, origin string, size int) string {
	t.Helper()
	info := `{"id":"` + id + `","model":"m","engine":"e","state":"running"`
	if origin != "" {
		info += `,"originatedFrom":"` + origin + `"`
	}
	p := `{"workloadInfo":` + info + `},"note":"`
	pad := size - len(p) - len(`"}`)
	if pad < 0 {
		t.Fatalf("params of %d bytes cannot hold the workload %s", size, info)
	}
	p += strings.Repeat("n", pad) + `"}`
	if len(p) != size {
		t.Fatalf("padded params are %d bytes, want %d", len(p), size)
	}
	return p
}

// paddedFrame is the workload:started frame of paddedParams.
func paddedFrame(t testing.TB, id, origin string, size int) string {
	return `{"jsonrpc":"2.0","method":"workload:started","params":` + paddedParams(t, id, origin, size) + `}`
}

func overWorkloadBound(size, limit int) string {
	return (&wireframe.WorkloadTooLargeError{Size: size, Limit: limit}).Error()
}

func TestIngressRefusesParamsOverTheWorkloadBoundWith413NamingIt(t *testing.T) {
	const limit = wireframe.MinWorkloadMaxBytes
	n, q := ifxNode(t, withWorkloadMaxBytes(limit))
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	addr := n.m.IngressAddr()
	if status, reason := testkit.PostIngress(t, addr, paddedFrame(t, "at-bound", "", limit)); status != http.StatusOK {
		t.Fatalf("params of exactly %d bytes: %d %q, want 200", limit, status, reason)
	}
	if status, reason := testkit.PostIngress(t, addr, paddedFrame(t, "over-bound", "", limit+1)); status != http.StatusRequestEntityTooLarge || reason != overWorkloadBound(limit+1, limit) {
		t.Fatalf("params one byte over: %d %q, want 413 %q", status, reason, overWorkloadBound(limit+1, limit))
	}
	// The bytes beside the workload count: a removal carrying a member of
	// its own is refused alike.
	removal := `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"at-bound","mine":"` + strings.Repeat("r", limit) + `"}}`
	if status, reason := testkit.PostIngress(t, addr, removal); status != http.StatusRequestEntityTooLarge || !strings.Contains(reason, "--workload-max-bytes") {
		t.Fatalf("a removal over the bound: %d %q, want 413 naming the bound", status, reason)
	}
	ifxBrokerBarrier(t, n)
	if ids := netUpsertIDs(n); len(ids) != 1 || ids["at-bound"] != 1 || len(n.broker.WithMethod(wireframe.MethodRemove)) != 0 {
		t.Fatalf("the broker got upserts %v and %d removals, want the frame at the bound only", ids, len(n.broker.WithMethod(wireframe.MethodRemove)))
	}
	if got := ifxDrain(q); len(got) != 1 || !ifxIsTracked(n, n.id, "at-bound") || ifxIsTracked(n, n.id, "over-bound") {
		t.Fatalf("queued %v; want the frame at the bound queued and tracked, the one over neither", ifxDescribe(got))
	}
	if got := n.m.workloadBoundRefusals.Get("ingress"); got != 2 {
		t.Fatalf("workload bound refusals counted for the ingress: %d, want 2", got)
	}
	if got := n.m.fieldBoundRefusals.Get("ingress"); got != 0 {
		t.Fatalf("field bound refusals counted: %d, want 0", got)
	}
	if got := n.m.ingressResponses.Get("413"); got != 2 {
		t.Fatalf("413 answers counted: %d, want 2", got)
	}
}

func TestPeerPortRefusesParamsOverTheWorkloadBoundWith413SingleAndPerBatchElement(t *testing.T) {
	const limit = wireframe.MinWorkloadMaxBytes
	h := newNetPeerHarness(t, withWorkloadMaxBytes(limit))
	origin := h.client.Principal
	frame := func(id string, size int) []byte { return []byte(paddedFrame(t, id, origin, size)) }
	// The peer port takes what an origin with the same bound may have added
	// to a frame at it: its ingress's origin stamp, its re-assertion marker.
	most := limit + peerwire.WorkloadSlack
	if status, reason := netPostAnswer(t, h.c, h.addr, frame("single-at", most)); status != http.StatusOK {
		t.Fatalf("params of exactly %d bytes: %d %q, want 200", most, status, reason)
	}
	if status, reason := netPostAnswer(t, h.c, h.addr, frame("single-over", most+1)); status != http.StatusRequestEntityTooLarge || reason != overWorkloadBound(most+1, limit) {
		t.Fatalf("params one byte over: %d %q, want 413 %q", status, reason, overWorkloadBound(most+1, limit))
	}
	// A batch element over the bound gets its own 413, final for that
	// frame, and the elements after it are applied.
	ans := netPostBatch(t, h.c, h.addr, frame("batch-0", 200), frame("batch-over", 2*limit), frame("batch-2", limit))
	want := []peerwire.BatchResult{
		{Status: http.StatusOK, Reason: ""},
		{Status: http.StatusRequestEntityTooLarge, Reason: overWorkloadBound(2*limit, limit)},
		{Status: http.StatusOK, Reason: ""},
	}
	if ans.status != http.StatusOK || !slices.Equal(ans.results, want) {
		t.Fatalf("batch answered %d %v, want 200 %v", ans.status, ans.results, want)
	}
	h.barrier(t)
	ids := netUpsertIDs(h.n)
	if ids["single-at"] != 1 || ids["batch-0"] != 1 || ids["batch-2"] != 1 || ids["single-over"] != 0 || ids["batch-over"] != 0 {
		t.Fatalf("the broker got %v, want the frames within the bound only", ids)
	}
	if got := h.n.m.workloadBoundRefusals.Get("peer"); got != 2 {
		t.Fatalf("workload bound refusals counted for the peer port: %d, want 2", got)
	}
}

// A frame a producer posts at the bound, with no origin, is stamped and,
// on every pass, marked as a re-assertion on its way to the peers: a peer
// with the same bound takes it fresh and re-asserted alike.
func TestAFrameAtTheIngressBoundReachesAPeerWithTheSameBoundFreshAndReasserted(t *testing.T) {
	const limit = wireframe.MinWorkloadMaxBytes
	a := newTestNode(t, withWorkloadMaxBytes(limit), withResyncInterval(200*time.Millisecond))
	b := newTestNode(t, withWorkloadMaxBytes(limit))
	if err := a.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	mesh(t, a, b)
	if status, reason := testkit.PostIngress(t, a.m.IngressAddr(), paddedFrame(t, "at-bound", "", limit)); status != http.StatusOK {
		t.Fatalf("params of exactly %d bytes: %d %q, want 200", limit, status, reason)
	}
	b.broker.WaitUpserts("at-bound", 3) // fresh, then two re-assertions
	if got := b.m.workloadBoundRefusals.Get("peer"); got != 0 {
		t.Fatalf("the peer refused %d of them for their size", got)
	}
}

func TestBrokerFrameOverTheWorkloadBoundIsNeitherRelayedNorTrackedWithARateLimitedWarning(t *testing.T) {
	const limit = wireframe.MinWorkloadMaxBytes
	n, q := ifxNode(t, withWorkloadMaxBytes(limit))
	line := func(id string, size int) string {
		return `{"jsonrpc":"2.0","method":"workload:started","params":` + paddedParams(t, id, n.id, size) + `}`
	}
	n.m.handleLine([]byte(line("at-bound", limit)))
	for i := range 3 {
		n.m.handleLine([]byte(line("over-"+itoa(i), limit+1+i)))
	}
	// As a request, it is still answered: the broker applied it.
	req := `{"jsonrpc":"2.0","id":7,"method":"workload:started","params":` + paddedParams(t, "over-request", n.id, 2*limit) + `}`
	n.m.handleLine([]byte(req))
	if got := n.broker.WaitResponseLine("7"); !strings.Contains(got, `"result":null`) {
		t.Fatalf("the request over the bound was answered %s, want null", got)
	}
	if got := ifxDrain(q); len(got) != 1 {
		t.Fatalf("queued %v, want only the frame at the bound", ifxDescribe(got))
	}
	if got := ifxTrackedCount(n); got != 1 || !ifxIsTracked(n, n.id, "at-bound") {
		t.Fatalf("the re-sync set holds %d runs, want the frame at the bound only", got)
	}
	if got := n.m.workloadBoundRefusals.Get("stdio"); got != 4 {
		t.Fatalf("workload bound refusals counted for stdio: %d, want 4", got)
	}
	if got := strings.Count(n.logs.String(), "local frame not relayed: its params are over the workload bound"); got != 1 {
		t.Fatalf("%d warnings for 4 frames over the bound within the interval, want 1; logs:\n%s", got, n.logs)
	}
	if !n.logs.Contains("level=WARN", "--workload-max-bytes", "dropped=1") {
		t.Fatalf("the warning does not name the bound and its count; logs:\n%s", n.logs)
	}
}

func TestIngressAtTheResyncByteBoundIs503WithRetryAfterAndWritesNothing(t *testing.T) {
	n := newTestNode(t, withResyncInterval(30*time.Second))
	clock := ifxUseClock(n)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	addr := n.m.IngressAddr()
	for _, id := range []string{"job-1", "job-2"} {
		if st, body := testkit.PostIngress(t, addr, liFrame(id)); st != http.StatusOK {
			t.Fatalf("%s under the bound: %d %s", id, st, body)
		}
	}
	ifxBrokerBarrier(t, n)
	// Room for a few bytes more, not for a third workload.
	setResyncMaxBytes(n, resyncBytes(n)+32)
	written := len(n.broker.WithMethod(wireframe.MethodUpsert))

	resp := liPostWithHeaders(t, addr, liFrame("job-3"))
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a new workload at the byte bound: %d, want 503", resp.StatusCode)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra != 30 {
		t.Fatalf("Retry-After %q, want half the 60 s retention while every entry is live", resp.Header.Get("Retry-After"))
	}
	if _, body := testkit.PostIngress(t, addr, liFrame("job-3")); !strings.Contains(body, "--max-live-workload-bytes") {
		t.Fatalf("the reason %q does not name the bound", body)
	}
	// An update that grows its workload past the bound is refused too; one
	// that keeps its size passes.
	grown := strings.Replace(liFrame("job-1"), `"createdAt"`, `"note":"`+strings.Repeat("n", 64)+`","createdAt"`, 1)
	if st, body := testkit.PostIngress(t, addr, grown); st != http.StatusServiceUnavailable || !strings.Contains(body, "--max-live-workload-bytes") {
		t.Fatalf("an update growing past the bound: %d %s, want 503 naming the bound", st, body)
	}
	if st, body := testkit.PostIngress(t, addr, strings.Replace(liFrame("job-1"), `"seq":1`, `"seq":2`, 1)); st != http.StatusOK {
		t.Fatalf("an update of the same size at the bound: %d %s", st, body)
	}
	ifxBrokerBarrier(t, n)
	if got := len(n.broker.WithMethod(wireframe.MethodUpsert)); got != written+1 || ifxIsTracked(n, n.id, "job-3") {
		t.Fatalf("a refused frame was written (%d upserts, want %d) or tracked", got, written+1)
	}
	if held := resyncBytes(n); held > n.m.cfg.MaxLiveWorkloadBytes {
		t.Fatalf("the set holds %d bytes, over its bound of %d", held, n.m.cfg.MaxLiveWorkloadBytes)
	}

	// A terminal entry frees its bytes once it ages out.
	requireTerminalEntryHoldsItsRoomUntilItAgesOut(t, addr, clock, "job-2", "failed", wireframe.MethodErrored)
}

func TestBrokerFrameOverTheResyncByteBoundIsNeitherRelayedNorKept(t *testing.T) {
	n, q := ifxNode(t)
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("stdio-1", "running", n.id))))
	setResyncMaxBytes(n, resyncBytes(n)+32)
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("stdio-2", "running", n.id))))
	if got := ifxDrain(q); len(got) != 1 {
		t.Fatalf("sent %s, want the first frame alone", ifxDescribe(got))
	}
	if !ifxIsTracked(n, n.id, "stdio-1") || ifxIsTracked(n, n.id, "stdio-2") {
		t.Fatal("want the first held and the one over the byte bound not")
	}
	// A held workload whose newer frame would pass the bound is dropped
	// from the table: re-asserting its older state would undo the newer
	// one, which its broker holds, at every peer.
	grown := `{"jsonrpc":"2.0","method":"workload:completed","params":{"workloadInfo":{"id":"stdio-1","model":"qwen3.5-9b","engine":"llamacpp","state":"completed","originatedFrom":"` +
		n.id + `","note":"` + strings.Repeat("n", 64) + `"}}}`
	n.m.handleLine([]byte(grown))
	ifxDrain(q)
	if ifxIsTracked(n, n.id, "stdio-1") || resyncBytes(n) != 0 {
		t.Fatalf("the grown workload is still held (%d bytes); want it no longer re-asserted", resyncBytes(n))
	}
	if got := n.m.table.Stats().Untracked.Load(); got != 2 {
		t.Fatalf("untracked counter = %d, want 2", got)
	}
	if got := strings.Count(n.logs.String(), "state table full (--max-live-workload-bytes)"); got != 1 {
		t.Fatalf("%d warnings for two frames within the interval, want 1; logs:\n%s", got, n.logs)
	}
}

// The ingress frames in flight count toward the byte bound as their runs
// count toward the entry bound: ingress posts alone never take the set
// past it.
func TestIngressFramesInFlightCountTowardTheResyncByteBound(t *testing.T) {
	n, _ := ifxNode(t)
	body := func(id string) []byte {
		return []byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON(id, "running", "")))
	}
	if _, err := n.m.ingestLocal(body("old-0")); err != nil {
		t.Fatal(err)
	}
	// What one new run may add: its re-assertion line at most. Room for
	// two more, less a byte: two in flight fill it, a third would pass it.
	f, err := wireframe.ParseIngress(body("new-0"), n.id, wireframe.DefaultWorkloadMaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	each := int64(len(wireframe.EncodeNotification(f.Method, f.Params)) + 0)
	setResyncMaxBytes(n, resyncBytes(n)+3*each-1)
	gw, heldDone := holdBroker(t, n)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if _, err := n.m.ingestLocal(body(fmt.Sprintf("new-%d", i))); err != nil {
				t.Errorf("new-%d: %v", i, err)
			}
		})
	}
	testkit.Eventually(t, "two new runs in flight", func() bool { return n.m.ingressFlight.inFlight() == 2 })
	var atLimit *ingress.AtLimitError
	if err := answeredWhileHeld(t, "a third new run", func() error {
		_, err := n.m.ingestLocal(body("new-2"))
		return err
	}); !errors.As(err, &atLimit) || atLimit.Bound != statetable.LimitBytes {
		t.Fatalf("a third new run while two are in flight at the byte bound: %v, want ingress.AtLimitError for bytes (503)", err)
	}
	close(gw.release)
	heldDone()
	wg.Wait()
	if held, bound := resyncBytes(n), n.m.cfg.MaxLiveWorkloadBytes; ifxTrackedCount(n) != 3 || held > bound {
		t.Fatalf("the re-sync set holds %d runs, %d bytes; want 3 within its bound of %d", ifxTrackedCount(n), held, bound)
	}
}

func TestNewManagerDefaultsTheByteBoundsAndRefusesUnusableOnes(t *testing.T) {
	for _, tc := range []struct {
		workload, wantWorkload int   // wantWorkload 0: refused
		live, wantLive         int64 // wantLive 0: refused
	}{
		{0, wireframe.DefaultWorkloadMaxBytes, 0, defaultMaxLiveWorkloadBytes},
		{wireframe.MinWorkloadMaxBytes, wireframe.MinWorkloadMaxBytes, minMaxLiveWorkloadBytes, minMaxLiveWorkloadBytes},
		{wireframe.MaxWorkloadMaxBytes, wireframe.MaxWorkloadMaxBytes, maxMaxLiveWorkloadBytes, maxMaxLiveWorkloadBytes},
		{wireframe.MinWorkloadMaxBytes - 1, 0, 0, defaultMaxLiveWorkloadBytes},
		{wireframe.MaxWorkloadMaxBytes + 1, 0, 0, defaultMaxLiveWorkloadBytes},
		{-1, 0, 0, defaultMaxLiveWorkloadBytes},
		{0, wireframe.DefaultWorkloadMaxBytes, minMaxLiveWorkloadBytes - 1, 0},
		{0, wireframe.DefaultWorkloadMaxBytes, maxMaxLiveWorkloadBytes + 1, 0},
		{0, wireframe.DefaultWorkloadMaxBytes, -1, 0},
	} {
		m, err := NewManager(Config{NodeID: devpki.NewUUID(), In: strings.NewReader(""), Out: &bytes.Buffer{},
			ClusterDir: t.TempDir(), WorkloadMaxBytes: tc.workload, MaxLiveWorkloadBytes: tc.live})
		switch {
		case tc.wantLive == 0:
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("--max-live-workload-bytes %d", tc.live)) {
				t.Errorf("MaxLiveWorkloadBytes %d: NewManager = %v, want an error naming the bound", tc.live, err)
			}
			continue
		case tc.wantWorkload == 0:
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("workload byte bound %d", tc.workload)) {
				t.Errorf("WorkloadMaxBytes %d: NewManager = %v, want an error naming the bound", tc.workload, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("WorkloadMaxBytes %d, MaxLiveWorkloadBytes %d: %v", tc.workload, tc.live, err)
		}
		m.bcast.Close(time.Second)
		if m.cfg.WorkloadMaxBytes != tc.wantWorkload || m.cfg.MaxLiveWorkloadBytes != tc.wantLive {
			t.Errorf("WorkloadMaxBytes %d, MaxLiveWorkloadBytes %d: took %d and %d; want %d and %d",
				tc.workload, tc.live, m.cfg.WorkloadMaxBytes, m.cfg.MaxLiveWorkloadBytes, tc.wantWorkload, tc.wantLive)
		}
	}
}

// A leased job at the workload bound is over it with its expiry's fields,
// which every peer would refuse for good: its expiry carries the known
// fields only.
func TestAnExpiryOverTheWorkloadBoundRetiresTheJobWithItsKnownFields(t *testing.T) {
	const limit = wireframe.MinWorkloadMaxBytes
	n := newTestNode(t, withWorkloadMaxBytes(limit))
	clock := ifxUseClock(n)
	w := leasedInfo("wide", "running", 1)
	w["pad"] = ""
	frame := string(testframe.Lifecycle(w, nil))
	w["pad"] = strings.Repeat("p", limit-(len(frame)-len(`{"jsonrpc":"2.0","method":"workload:started","params":}`))-8)
	if _, err := n.m.ingestLocalLeased(testframe.Lifecycle(w, nil), []string{"5"}); err != nil {
		t.Fatal(err)
	}
	clock.advance(5 * time.Second)
	n.m.expireDue()
	got := waitExpiry(t, n, "wide")
	if _, ok := got["pad"]; ok || got["state"] != "failed" {
		t.Fatalf("the expiry %v: want the known fields only, failed", got)
	}
	if leaseCount(n) != 0 || n.m.leases.expired.Load() != 1 {
		t.Fatalf("%d leases left, %d expired", leaseCount(n), n.m.leases.expired.Load())
	}
	if !n.logs.Contains("level=WARN", "lease expiry frame over the workload bound", "id=wide") {
		t.Fatalf("no warning for the narrowed expiry:\n%s", n.logs)
	}
}
