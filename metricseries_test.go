package main

import (
	"crypto/sha256"
	"runtime"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
)

// TestLabelledSeriesWithKnownLabelsExistFromTheFirstScrape: before any
// frame, the series by source, method and ingress code are there at zero,
// so a rate() over them is defined from the first scrape.
func TestLabelledSeriesWithKnownLabelsExistFromTheFirstScrape(t *testing.T) {
	n := newMetricsNode(t, true).start()
	first := scrape(t, n)
	for _, series := range []string{
		`nvpair_wlm_frames_received_total{source="ingress",method="workload:started"}`,
		`nvpair_wlm_frames_received_total{source="ingress",method="workloads:remove"}`,
		`nvpair_wlm_frames_received_total{source="peer",method="workload:errored"}`,
		`nvpair_wlm_frames_received_total{source="stdio",method="workload:submitted"}`,
		`nvpair_wlm_frames_received_total{source="stdio",method="other"}`,
		`nvpair_wlm_ingress_responses_total{code="200"}`,
		`nvpair_wlm_ingress_responses_total{code="400"}`,
		`nvpair_wlm_ingress_responses_total{code="503"}`,
		`nvpair_wlm_field_bound_refusals_total{source="ingress"}`,
		`nvpair_wlm_field_bound_refusals_total{source="peer"}`,
		`nvpair_wlm_field_bound_refusals_total{source="stdio"}`,
	} {
		v, ok := first[series]
		if !ok || v != 0 {
			t.Errorf("first scrape: %s = %v (present %v), want present at 0", series, v, ok)
		}
	}

	// Without the ingress there is nothing of it to count.
	off := newMetricsNode(t, false).start()
	for series := range scrape(t, off) {
		if series == `nvpair_wlm_ingress_responses_total{code="200"}` || series == `nvpair_wlm_frames_received_total{source="ingress",method="workload:started"}` {
			t.Errorf("a node without the ingress reports %s", series)
		}
	}
}

// TestProcessMetricsInTheStandardNames: on Linux the process_* families a
// Prometheus client library exports, with plausible values; elsewhere none.
func TestProcessMetricsInTheStandardNames(t *testing.T) {
	n := newMetricsNode(t, false).start()
	got := scrape(t, n)
	names := []string{"process_start_time_seconds", "process_resident_memory_bytes", "process_cpu_seconds_total",
		"process_open_fds", "process_max_fds", "process_virtual_memory_bytes"}
	if runtime.GOOS != "linux" {
		for _, name := range names {
			if _, ok := got[name]; ok {
				t.Errorf("%s reported off Linux", name)
			}
		}
		return
	}
	for _, name := range names {
		if _, ok := got[name]; !ok {
			t.Fatalf("%s missing", name)
		}
	}
	// The node runs inside the test process: it started before this test,
	// at most as long ago as the test binary has run (a generous hour).
	now := float64(time.Now().Unix())
	if st := got["process_start_time_seconds"]; st > now+1 || st < now-3600 {
		t.Errorf("process_start_time_seconds %v, now %v", st, now)
	}
	if rss := got["process_resident_memory_bytes"]; rss < 1<<20 {
		t.Errorf("process_resident_memory_bytes %v, want at least 1 MiB", rss)
	}
	// The kernel counts CPU time in clock ticks (10 ms): a test binary run
	// alone may not have used one yet, and reads 0. It spends some until
	// the counter moves, which it must.
	testkit.Eventually(t, "process_cpu_seconds_total above 0", func() bool {
		spendCPU(20 * time.Millisecond)
		return scrape(t, n)["process_cpu_seconds_total"] > 0
	})
	if fds, max := got["process_open_fds"], got["process_max_fds"]; fds < 3 || max < fds {
		t.Errorf("process_open_fds %v, process_max_fds %v", fds, max)
	}
}

// TestPeerBehindCountsTheChangesAPeerLacks: changes for a peer that never
// answers stay above its mark, and the per-peer gauge says how many.
func TestPeerBehindCountsTheChangesAPeerLacks(t *testing.T) {
	waitsOutRealTime(t, "the sender's backoff")
	n, hole := startWithBlackHoledPeer(t)
	series := `nvpair_wlm_peer_behind_versions{peer="` + hole.Ident.Principal + `"}`
	if v, ok := scrape(t, n)[series]; !ok || v != 0 {
		t.Fatalf("%s = %v (present %v) before any frame, want 0", series, v, ok)
	}
	const sent = 20
	for i := range sent {
		n.sendLifecycle(testframe.Workload("q-"+itoa(i), "running", n.id))
	}
	testkit.Eventually(t, "the black hole behind by every change", func() bool { return scrape(t, n)[series] == sent })
}

// spendCPU keeps one core busy for about d of wall time.
func spendCPU(d time.Duration) {
	sum := sha256.Sum256(nil)
	for end := time.Now().Add(d); time.Now().Before(end); {
		sum = sha256.Sum256(sum[:])
	}
}

// startWithBlackHoledPeer starts a node with its metrics endpoint whose one
// broadcast target is a pinned peer that never answers, so what is sent to
// it stays in its queue.
func startWithBlackHoledPeer(t *testing.T) (*testNode, *testkit.BlackHole) {
	t.Helper()
	n := newMetricsNode(t, false)
	hole := testkit.NewBlackHole(t)
	testkit.Must(t, devpki.PinIdentity(n.clusterDir, hole.Ident))
	n.start()
	n.broker.sendFrame("discovery:nodes", map[string]any{"nodes": []any{hole.Entry()}})
	n.waitTargets(1)
	return n, hole
}
