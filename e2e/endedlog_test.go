package e2e

import (
	"net/http"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// TestProcessPeerBackAfterTheRetentionGetsTheEndsItMissed is the
// conformance run's finding (spec 5.2): B leaves A's discovery, a job
// completes and another is removed on A, through its broker and through
// its ingress, A's re-sync set drops the ends, and B comes back. B's
// broker must show the completed jobs completed and the removed ones gone.
func TestProcessPeerBackAfterTheRetentionGetsTheEndsItMissed(t *testing.T) {
	nodes := writeCluster(t, 2)
	origin := nodes[0].ID
	a, b := startPair(t, nodes[0], nodes[1], "--resync-interval", "200ms", "--metrics", "127.0.0.1:0", "--local-ingress", "127.0.0.1:0")
	ingress := a.loggedValue("local ingress listening", "addr")
	metrics := a.loggedValue("metrics endpoint listening", "addr")
	post := func(frame string) {
		t.Helper()
		if st, text := testkit.PostIngress(t, ingress, frame); st != http.StatusOK {
			t.Fatalf("ingress post = %d %q, want 200", st, text)
		}
	}

	// Two jobs B knows while it is A's target.
	a.send(testframe.LifecycleLine("pj-gone", "running", origin))
	post(testframe.LifecycleLine("ij-gone", "running", origin))
	b.WaitUpserts("pj-gone", 1)
	b.WaitUpserts("ij-gone", 1)

	// B leaves A's discovery (its daemon restarting, say).
	a.send(string(wireframe.EncodeNotification("discovery:nodes", []byte(`{"nodes":[]}`))))
	a.waitLog("broadcast targets changed", "total=0")

	a.send(testframe.LifecycleLine("pj-done", "queued", origin))
	a.send(testframe.LifecycleLine("pj-done", "completed", origin))
	a.send(string(testframe.Removal("pj-gone", origin)))
	// The read loop answers a request after the frames before it: they
	// are committed.
	a.send(`{"jsonrpc":"2.0","id":"barrier","method":"log/set-level","params":{"level":"debug"}}`)
	a.WaitResponse(`"barrier"`)
	post(testframe.LifecycleLine("ij-done", "queued", origin))
	post(testframe.LifecycleLine("ij-done", "completed", origin))
	post(string(testframe.Removal("ij-gone", origin)))

	// A's set has dropped the completed runs (its retention is 400 ms).
	testkit.Eventually(t, "A's re-sync set empty", func() bool {
		return testkit.ScrapeValue(t, metrics, "nvpair_wlm_resync_set_entries") == 0
	})
	if b.UpsertCount("pj-done") != 0 || b.UpsertCount("ij-done") != 0 {
		t.Fatal("B got a job that ended while it was not A's target")
	}

	// B is back.
	a.discover(nodes[1], b.port)
	testkit.Eventually(t, "B's Jobs list with the ends it missed", func() bool {
		jobs := b.JobsList()
		pj, okP := jobs.Get(origin, "pj-done")
		ij, okI := jobs.Get(origin, "ij-done")
		_, goneP := jobs.Get(origin, "pj-gone")
		_, goneI := jobs.Get(origin, "ij-gone")
		return okP && pj.State == "completed" && okI && ij.State == "completed" && !goneP && !goneI
	})
}
