//go:build linux

package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// Issue 20's unsent-body attack, against the real binary: local
// connections, from the producers' own address, that declare a body and
// never send it, reconnecting as soon as they are closed. Before the
// budgets were per channel and reserved after the trust checks, 36 such
// connections declaring 1 MiB held the one shared 32 MiB budget for the
// 10 s read timeout: producers were refused 71-96 % of the time and a
// pinned peer dropped frames. Now a declared 1 MiB is over the ingress's
// body cap and refused unread; a body at the cap holds its room for 2 s at
// most; the peer port's budget is not the ingress's; and a producer's post
// cuts the attackers' oldest unfinished body when the address is at its
// bound.
func TestAdversarialUnsentIngressBodiesLeaveProducersAndAPeerServed(t *testing.T) {
	skipUnderShort(t) // here, not in its subtests alone: they start the binary after its setup
	for _, tc := range []struct {
		name     string
		conns    int
		declared int
	}{
		{"36 declaring 1 MiB", 36, wireframe.MaxBytes},
		{"132 declaring 1 MiB", 132, wireframe.MaxBytes},
		// The ingress's body cap at the default --workload-max-bytes (GET
		// /v1/node's limits.bodyMaxBytes): 16 KiB of workload and 16 KiB
		// for the envelope.
		{"132 declaring the cap", 132, wireframe.DefaultWorkloadMaxBytes + 16<<10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := writeCluster(t, 2)
			a := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--log-level", "info")
			ingressAddr := a.loggedValue("local ingress listening", "addr")
			peerAddr := net.JoinHostPort("127.0.0.1", itoa(a.port))

			ctx, stop := context.WithCancel(context.Background())
			var attackers sync.WaitGroup
			head := "POST " + peerEventsPath + " HTTP/1.1\r\nHost: " + ingressAddr + "\r\nContent-Type: application/json\r\n" +
				"Content-Length: " + itoa(tc.declared) + "\r\n\r\n{"
			for range tc.conns {
				attackers.Go(func() {
					for ctx.Err() == nil {
						c, err := net.DialTimeout("tcp", ingressAddr, time.Second)
						if err != nil {
							continue
						}
						release := context.AfterFunc(ctx, func() { c.Close() })
						io.WriteString(c, head)
						io.Copy(io.Discard, c) // until the daemon answers and closes
						release()
						c.Close()
					}
				})
			}
			defer func() { stop(); attackers.Wait() }()
			testkit.Eventually(t, "the attack under way", func() bool {
				m := scrapeProc(t, a)
				return m[`nvpair_wlm_request_body_timeouts_total{channel="ingress"}`]+m[`nvpair_wlm_ingress_responses_total{code="413"}`] > 0 ||
					m["nvpair_wlm_ingress_unfinished_bodies"] >= float64(tc.conns)/2
			})

			peer := testkit.PeerClient(t, &nodes[1].Identity, nodes[0].Identity.DER)
			var slowest time.Duration
			refused := 0
			const posts = 40
			for i := range posts {
				id := "beside-" + itoa(i)
				start := time.Now()
				if st, _ := postIngressTo(t, ingressAddr, string(testframe.Lifecycle(testframe.Workload("local-"+id, "running", nodes[0].ID), nil))); st != http.StatusOK {
					refused++
				}
				slowest = max(slowest, time.Since(start))
				if st, text := netPostAnswer(t, peer, peerAddr, testframe.Lifecycle(testframe.Workload(id, "running", nodes[1].ID), nil)); st != http.StatusOK {
					t.Fatalf("pinned peer's frame %d: %d %q", i, st, text)
				}
			}
			m := scrapeProc(t, a)
			t.Logf("producer posts refused %d of %d, slowest %v; ingress: 413 %v, 408 %v, bodies cut %v, 503 %v, unfinished now %v",
				refused, posts, slowest, m[`nvpair_wlm_ingress_responses_total{code="413"}`],
				m[`nvpair_wlm_request_body_timeouts_total{channel="ingress"}`], m["nvpair_wlm_ingress_unfinished_bodies_cut_total"],
				m[`nvpair_wlm_request_body_refused_total{channel="ingress"}`], m["nvpair_wlm_ingress_unfinished_bodies"])
			if refused > 0 {
				t.Fatalf("%d of %d producer posts refused beside the unsent bodies, want none", refused, posts)
			}
			a.WaitUpserts("beside-"+itoa(posts-1), 1)
			a.WaitUpserts("local-beside-"+itoa(posts-1), 1)
		})
	}
}
