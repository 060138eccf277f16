package main

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// scrape reads a node's metrics endpoint into series -> value.
func scrape(t *testing.T, n *testNode) map[string]float64 {
	t.Helper()
	return testkit.ScrapeAddr(t, n.m.MetricsAddr())
}

// newMetricsNode builds a node with the metrics endpoint (and optionally
// the ingress) on loopback.
func newMetricsNode(t *testing.T, ingress bool, opts ...nodeOption) *testNode {
	n := newTestNode(t, opts...)
	if err := n.m.EnableMetrics("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if ingress {
		if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func TestMetricsCountersMoveWithTraffic(t *testing.T) {
	a, b := newMetricsNode(t, true), newMetricsNode(t, false)
	mesh(t, a, b)
	a0, b0 := scrape(t, a), scrape(t, b)
	delta := func(after, before map[string]float64, series string) float64 { return after[series] - before[series] }

	ingress := a.m.IngressAddr()
	for i := 1; i <= 3; i++ {
		w := testframe.Workload("ing-"+itoa(i), "running", "", map[string]any{"originatedFrom": nil})
		if s, _ := testkit.PostIngress(t, ingress, `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":`+mustJSON(t, w)+`}}`); s != 200 {
			t.Fatalf("ingress post %d: status %d", i, s)
		}
	}
	if s, _ := testkit.PostIngress(t, ingress, `{"jsonrpc":"2.0","method":"workload:started","params":{}}`); s != 400 {
		t.Fatalf("bad frame: status %d", s)
	}
	if s, _ := testkit.PostIngress(t, ingress, `{}`, "Origin", "http://evil.example"); s != 403 {
		t.Fatalf("browser post: status %d", s)
	}
	// Each step waits for the one before it at B: the peer is sent each
	// entry's latest state, so a change made before the last one was
	// taken would be folded into it, and the counts would be a race.
	b.broker.WaitUpserts("ing-3", 1)
	if s, _ := testkit.PostIngress(t, ingress, `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"ing-3"}}`); s != 200 {
		t.Fatalf("ingress removal: status %d", s)
	}
	a.sendLifecycle(testframe.Workload("std-1", "running", a.id))
	b.broker.WaitUpserts("std-1", 1)
	a.sendLifecycle(testframe.Workload("std-1", "running", a.id)) // a duplicate for B's dedup
	a.sendLifecycle(testframe.Workload("std-2", "running", a.id))
	testkit.Eventually(t, "6 frames at B", func() bool {
		return len(b.broker.WithMethod(wireframe.MethodUpsert))+len(b.broker.WithMethod(wireframe.MethodRemove)) == 6
	})
	testkit.Eventually(t, "A's deliveries counted", func() bool {
		return delta(scrape(t, a), a0, `nvpair_wlm_peer_deliveries_succeeded_total{peer="`+b.id+`"}`) == 7
	})
	// B leaves the target set and comes back: it keeps its mark, so it is
	// sent nothing fresh, and A's 4 runs are re-asserted to it at once, as
	// its broker may have inferred A's loss meanwhile (spec 5.1).
	a.discover()
	a.waitTargets(0)
	a.discover(b)
	a.waitTargets(1)
	testkit.Eventually(t, "A's runs re-asserted to B on its return", func() bool {
		return delta(scrape(t, a), a0, `nvpair_wlm_heartbeat_reasserted_total{peer="`+b.id+`"}`) == 4
	})

	// A TLS handshake that fails at B's server: plaintext on the TLS port.
	c, err := net.Dial("tcp", b.m.PeerAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	c.Read(make([]byte, 512))
	c.Close()

	a1 := scrape(t, a)
	var b1 map[string]float64
	testkit.Eventually(t, "B's server handshake failure counted", func() bool {
		b1 = scrape(t, b)
		return delta(b1, b0, `nvpair_wlm_tls_handshake_failures_total{side="server"}`) >= 1
	})
	wantA := map[string]float64{
		`nvpair_wlm_frames_received_total{source="ingress",method="workload:started"}`: 3,
		`nvpair_wlm_frames_received_total{source="ingress",method="workloads:remove"}`: 1,
		`nvpair_wlm_frames_received_total{source="stdio",method="workload:started"}`:   3,
		`nvpair_wlm_ingress_responses_total{code="200"}`:                               4,
		`nvpair_wlm_ingress_responses_total{code="400"}`:                               1,
		`nvpair_wlm_ingress_responses_total{code="403"}`:                               1,
		`nvpair_wlm_broker_writes_total`:                                               4,
		`nvpair_wlm_peer_deliveries_succeeded_total{peer="` + b.id + `"}`:              7,
		`nvpair_wlm_heartbeat_reasserted_total{peer="` + b.id + `"}`:                   4,
		`nvpair_wlm_heartbeat_reassert_failures_total{peer="` + b.id + `"}`:            0,
		`nvpair_wlm_peer_delivery_failures_total{peer="` + b.id + `"}`:                 0,
		`nvpair_wlm_peer_deliveries_dropped_total{peer="` + b.id + `"}`:                0,
		`nvpair_wlm_ends_evicted_total`:                                                0,
	}
	for series, want := range wantA {
		if got := delta(a1, a0, series); got != want {
			t.Errorf("A: %s moved by %v, want %v", series, got, want)
		}
	}
	gaugesA := map[string]float64{
		`nvpair_wlm_targets`: 1, `nvpair_wlm_pinned_peers`: 1,
		`nvpair_wlm_resync_set_entries`: 4, `nvpair_wlm_removals_held`: 1,
		`nvpair_wlm_resync_set_size`: 4, `nvpair_wlm_removal_memory_size`: 1, // the deprecated names, kept a release
		`nvpair_wlm_peer_behind_versions{peer="` + b.id + `"}`: 0,
		`nvpair_wlm_members`:                    1,
		`nvpair_wlm_clustered`:                  1,
		`nvpair_wlm_build_info{version="test"}`: 1,
	}
	for series, want := range gaugesA {
		if got := a1[series]; got != want {
			t.Errorf("A: %s = %v, want %v", series, got, want)
		}
	}
	if a1[`nvpair_wlm_tls_handshakes_total{side="client"}`] < 1 || a1["go_goroutines"] < 1 {
		t.Error("A: client handshakes or goroutines not reported")
	}
	wantB := map[string]float64{
		`nvpair_wlm_frames_received_total{source="peer",method="workload:started"}`: 6 + 4,
		`nvpair_wlm_frames_received_total{source="peer",method="workloads:remove"}`: 1,
		`nvpair_wlm_dedup_hits_total`:    1,
		`nvpair_wlm_broker_writes_total`: 6 + 4,
	}
	for series, want := range wantB {
		if got := delta(b1, b0, series); got != want {
			t.Errorf("B: %s moved by %v, want %v", series, got, want)
		}
	}
	if b1[`nvpair_wlm_tls_handshakes_total{side="server"}`] < 1 {
		t.Error("B: server handshakes not counted")
	}
}

func TestMetricsCountClientHandshakeFailures(t *testing.T) {
	waitsOutRealTime(t, "the sender's backoff")
	a, b := newMetricsNode(t, false), newTestNode(t)
	// A pins B's principal with a certificate B does not present.
	impostor, err := devpki.Mint(b.id)
	if err != nil {
		t.Fatal(err)
	}
	if err := devpki.PinIdentity(a.clusterDir, impostor); err != nil {
		t.Fatal(err)
	}
	b.trust(a)
	a.start()
	b.start()
	a.discover(b)
	a.waitTargets(1)
	a.sendLifecycle(testframe.Workload("never", "running", a.id))
	testkit.Eventually(t, "a refused client handshake counted", func() bool {
		return scrape(t, a)[`nvpair_wlm_tls_handshake_failures_total{side="client"}`] >= 1
	})
	// Nothing is given up: the frame stays above B's mark, retried.
	testkit.Eventually(t, "the failed attempts counted", func() bool {
		return scrape(t, a)[`nvpair_wlm_peer_delivery_failures_total{peer="`+b.id+`"}`] >= 1
	})
	if len(b.broker.WithMethod(wireframe.MethodUpsert)) != 0 {
		t.Fatal("a frame reached a server whose certificate does not match its pin")
	}
}

func TestMetricsEndpointRefusesBrowsersAndOtherMethods(t *testing.T) {
	n := newMetricsNode(t, false).start()
	port := n.m.metrics.BoundPort()
	cases := []struct {
		name, method, path, host string
		header                   map[string]string
		want                     int
	}{
		{"scrape", "GET", "/metrics", "", nil, 200},
		{"head", "HEAD", "/metrics", "", nil, 200},
		{"localhost", "GET", "/metrics", "localhost:" + port, nil, 200},
		{"origin", "GET", "/metrics", "", map[string]string{"Origin": "null"}, 403},
		{"rebinding host", "GET", "/metrics", "evil.example:" + port, nil, 421},
		{"post", "POST", "/metrics", "", nil, 405},
		{"other path", "GET", "/debug", "", nil, 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, "http://"+n.m.MetricsAddr()+c.path, nil)
			if c.host != "" {
				req.Host = c.host
			}
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.want)
			}
		})
	}
}

func TestEnableMetricsRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:9100", "192.168.1.10:9100", ":9100", "[::]:9100"} {
		if err := newTestNode(t).m.EnableMetrics(addr); err == nil || !strings.Contains(err.Error(), addr) {
			t.Errorf("EnableMetrics(%q) = %v, want an error naming the address", addr, err)
		}
	}
}

// TestMetricsPassPromtoolLint lints the live output with promtool, which
// .ci/run installs; outside CI a machine without it skips.
func TestMetricsPassPromtoolLint(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed; .ci/run installs the prometheus package")
		}
		t.Skip("promtool not installed")
	}
	a, b := newMetricsNode(t, true), newMetricsNode(t, false)
	mesh(t, a, b)
	a.sendLifecycle(testframe.Workload("lint", "running", a.id))
	testkit.Eventually(t, "a delivery", func() bool { return len(b.broker.WithMethod(wireframe.MethodUpsert)) == 1 })
	resp, err := http.Get("http://" + a.m.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = resp.Body
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}
