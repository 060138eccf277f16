package main

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

func withMaxLiveWorkloads(n int) nodeOption {
	return func(c *Config) { c.MaxLiveWorkloads = n }
}

// liPostWithHeaders posts a frame to the ingress and returns the answer.
func liPostWithHeaders(t *testing.T, addr, body string) *http.Response {
	t.Helper()
	resp, err := http.Post("http://"+addr+wireframe.EventsPath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func TestIngressAtTheLiveWorkloadLimitIs503WithRetryAfterAndWritesNothing(t *testing.T) {
	n := newTestNode(t, withMaxLiveWorkloads(2), withResyncInterval(30*time.Second))
	clock := ifxUseClock(n)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	addr := n.m.IngressAddr()
	for _, id := range []string{"job-1", "job-2"} {
		if st, body := testkit.PostIngress(t, addr, liFrame(id)); st != http.StatusOK {
			t.Fatalf("%s under the limit: %d %s", id, st, body)
		}
	}
	ifxBrokerBarrier(t, n)
	written := len(n.broker.WithMethod(wireframe.MethodUpsert))

	resp := liPostWithHeaders(t, addr, liFrame("job-3"))
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a new workload at the limit: %d, want 503", resp.StatusCode)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("Retry-After %q, want whole seconds", resp.Header.Get("Retry-After"))
	}
	if _, body := testkit.PostIngress(t, addr, liFrame("job-3")); !strings.Contains(body, "--max-live-workloads") || !strings.Contains(body, "2") {
		t.Fatalf("the reason %q does not name the limit", body)
	}
	ifxBrokerBarrier(t, n)
	if got := len(n.broker.WithMethod(wireframe.MethodUpsert)); got != written || ifxIsTracked(n, n.id, "job-3") {
		t.Fatalf("a refused frame was written (%d upserts, want %d) or tracked", got, written)
	}

	// Updates of held workloads still pass; a terminal one still counts
	// until it ages out, and then its slot is free.
	requireTerminalEntryHoldsItsRoomUntilItAgesOut(t, addr, clock, "job-1", "completed", wireframe.MethodCompleted)
}

// requireTerminalEntryHoldsItsRoomUntilItAgesOut ends the held workload id
// in state (by method) at a bound of the re-sync set: a new workload is
// still 503 with the terminal retention (60 s) as its Retry-After, and
// admitted once the clock has passed it.
func requireTerminalEntryHoldsItsRoomUntilItAgesOut(t *testing.T, addr string, clock *ifxClock, id, state, method string) {
	t.Helper()
	done := strings.Replace(liFrame(id), `"running"`, `"`+state+`"`, 1)
	done = strings.Replace(done, wireframe.MethodStarted, method, 1)
	if st, body := testkit.PostIngress(t, addr, done); st != http.StatusOK {
		t.Fatalf("ending a held workload at the bound: %d %s", st, body)
	}
	resp := liPostWithHeaders(t, addr, liFrame("job-3"))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "60" {
		t.Fatalf("with a terminal entry held: %d, Retry-After %q; want 503 and its 60 s retention", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	clock.advance(61 * time.Second)
	if st, body := testkit.PostIngress(t, addr, liFrame("job-3")); st != http.StatusOK {
		t.Fatalf("once the terminal entry aged out: %d %s", st, body)
	}
}

// Every path to the peers reads the state table, so a broker frame the
// table cannot take is not relayed: counted and logged, rate-limited.
func TestBrokerFrameOverTheLiveWorkloadLimitIsNeitherKeptNorRelayed(t *testing.T) {
	n, q := ifxNode(t, withMaxLiveWorkloads(1))
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("stdio-1", "running", n.id))))
	n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("stdio-2", "running", n.id))))
	if got := ifxDrain(q); len(got) != 1 {
		t.Fatalf("sent %s, want the first frame alone", ifxDescribe(got))
	}
	if !ifxIsTracked(n, n.id, "stdio-1") || ifxIsTracked(n, n.id, "stdio-2") {
		t.Fatal("want the first tracked and the one over the limit not")
	}
	if got := n.m.table.Stats().Untracked.Load(); got != 1 {
		t.Fatalf("untracked counter = %d, want 1", got)
	}
	if !n.logs.Contains("level=WARN", "state table full") {
		t.Fatalf("no warning; logs:\n%s", n.logs)
	}
}
