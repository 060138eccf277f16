package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// Adversarial test against the real binary (issue 20, item 3): producers
// post frames whose workload carries a 250 KiB member of their own, while
// the node's one peer never answers. Before the workload byte bound all
// 1,500 were 200: the re-sync set kept every one (375 MB) and the peer's
// queue 1,024 more copies, and RSS went from 10 to 650 MiB and stayed
// there. Now each is 413 naming the bound, and nothing of them is kept.
// Then the broker enters frames just within the bound: the peer's queue
// stops at its byte bound, 8 MiB, where 1,024 of them would be 16 MiB.

const (
	// advBigPosts is how many oversized frames the producers post.
	advBigPosts = 1500
	// advBigMember is the size of each one's member of its own.
	advBigMember = 250 << 10
	// advBigPosters is how many producers post at once.
	advBigPosters = 8
	// advBigRSSBudgetKiB is the RSS the daemon must stay within after the
	// posts: what it uses at rest (some 10 MiB), the bodies read at once
	// and not yet collected (8 posts of 250 KiB at a time here; the body
	// budget caps them at 32 MiB whatever the producers do) and room for
	// the collector's pacing. Without the bound it reached 650 MiB.
	advBigRSSBudgetKiB = 64 << 10
)

func TestAdversarialLargeMembersOfTheirOwnAre413AndRSSAndAPeerQueueStayWithinTheirBytes(t *testing.T) {
	nodes := writeCluster(t, 1)
	hole := testkit.NewBlackHole(t)
	testkit.Must(t, devpki.PinIdentity(nodes[0].ClusterDir, hole.Ident))
	d := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--log-level", "info")
	d.WaitMethod("discovery:subscribe", 1)
	ingress := d.loggedValue("local ingress listening", "addr")
	metrics := d.loggedValue("metrics endpoint listening", "addr")
	peers, _ := json.Marshal(map[string]any{"nodes": []any{hole.Entry()}})
	d.send(string(wireframe.EncodeNotification("discovery:nodes", peers)))
	d.waitLog("broadcast targets changed", "total=1")

	frame := func(i int, member string) string {
		return `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"big-` + itoa(i) +
			`","model":"m","engine":"e","state":"running","blob":"` + member + `"}}}`
	}
	if s, text := testkit.PostIngress(t, ingress, frame(-1, "small")); s != http.StatusOK {
		t.Fatalf("a frame well within the bound: %d %q", s, text)
	}
	d.WaitUpserts("big--1", 1) // read by the harness, so the count below is of the broker's lines
	rssBefore := advRSS(d)

	blob := strings.Repeat("b", advBigMember)
	var next atomic.Int64
	var mu sync.Mutex
	statuses := map[int]int{}
	var firstReason string
	var wg sync.WaitGroup
	for range advBigPosters {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= advBigPosts {
					return
				}
				s, text, err := advPost(ingress, frame(i, blob))
				if err != nil {
					t.Errorf("post %d: %v", i, err)
					return
				}
				mu.Lock()
				statuses[s]++
				if s != http.StatusOK && firstReason == "" {
					firstReason = text
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	rssAfter := advRSS(d)
	m := testkit.ScrapeAddr(t, metrics)
	queueBytes := m[`nvpair_wlm_peer_queue_bytes{peer="`+hole.Ident.Principal+`"}`]
	queueFrames := m[`nvpair_wlm_peer_queue_frames{peer="`+hole.Ident.Principal+`"}`]
	t.Logf("%d posts with a %d-byte member of their own: answers %v (first refusal %q); RSS %d -> %d KiB; re-sync set %v entries, %v bytes; peer queue %v frames, %v bytes; refusals counted %v",
		advBigPosts, advBigMember, statuses, firstReason, rssBefore, rssAfter,
		m["nvpair_wlm_resync_set_entries"], m["nvpair_wlm_resync_set_bytes"], queueFrames, queueBytes,
		m[`nvpair_wlm_workload_bound_refusals_total{source="ingress"}`])

	if statuses[http.StatusRequestEntityTooLarge] != advBigPosts {
		t.Fatalf("answers %v, want all %d 413", statuses, advBigPosts)
	}
	if want := fmt.Sprintf("over their %d-byte bound (--workload-max-bytes)", wireframe.DefaultWorkloadMaxBytes); !strings.Contains(firstReason, want) {
		t.Fatalf("the 413's reason %q does not name the bound (%q)", firstReason, want)
	}
	if rssAfter > advBigRSSBudgetKiB {
		t.Fatalf("RSS after the posts is %d KiB, over the budget of %d KiB", rssAfter, advBigRSSBudgetKiB)
	}
	if got := m[`nvpair_wlm_workload_bound_refusals_total{source="ingress"}`]; got != advBigPosts {
		t.Fatalf("refusals counted: %v, want %d", got, advBigPosts)
	}
	if n := len(d.WithMethod(wireframe.MethodUpsert)); n != 1 {
		t.Fatalf("%d upserts reached the broker, want only the small frame's", n)
	}
	// A producer within the bound is still served.
	if s, text := testkit.PostIngress(t, ingress, frame(advBigPosts, strings.Repeat("s", wireframe.DefaultWorkloadMaxBytes/2))); s != http.StatusOK {
		t.Fatalf("a frame within the bound after the posts: %d %q", s, text)
	}
	d.WaitMethod(wireframe.MethodUpsert, 2)

	// The broker enters frames just within the bound, 32 MiB of them, for
	// the black-holed peer: a peer holds no queue of its own (what it has
	// not taken lies above its mark in the state table), so they cost
	// their bytes in the table once, and the peer is behind by all of them.
	const brokerFrames = 1000
	within := strings.Repeat("w", wireframe.DefaultWorkloadMaxBytes-200)
	for i := range brokerFrames {
		d.send(`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"broker-` + itoa(i) +
			`","model":"m","engine":"e","state":"running","originatedFrom":"` + nodes[0].ID + `","blob":"` + within + `"}}}`)
	}
	behind := `nvpair_wlm_peer_behind_versions{peer="` + hole.Ident.Principal + `"}`
	testkit.Eventually(t, "every broker frame in the table, the black-holed peer behind by them", func() bool {
		m := testkit.ScrapeAddr(t, metrics)
		return m[`nvpair_wlm_frames_received_total{source="stdio",method="workload:started"}`] == brokerFrames &&
			m[behind] >= brokerFrames
	})
	m = testkit.ScrapeAddr(t, metrics)
	held := m["nvpair_wlm_resync_set_bytes"]
	t.Logf("%d broker frames with a %d-byte member to a black-holed peer: it is %v versions behind; the table holds %v bytes; RSS %d KiB",
		brokerFrames, len(within), m[behind], held, advRSS(d))
	if held < brokerFrames*float64(len(within)) || held > m["nvpair_wlm_resync_set_limit_bytes"] {
		t.Fatalf("the table holds %v bytes for %d frames of %d bytes, bound %v", held, brokerFrames, len(within), m["nvpair_wlm_resync_set_limit_bytes"])
	}
	// What the black-holed peer lacks costs nothing beyond the table: RSS
	// stays within the budget plus the table's bytes (and its garbage).
	if rss := advRSS(d); float64(rss) > advBigRSSBudgetKiB+3*held/1024 {
		t.Fatalf("RSS %d KiB with %v bytes held for a black-holed peer", rss, held)
	}
}

// advPost posts a frame to the ingress from any goroutine and returns the
// answer's status and text.
func advPost(addr, frame string) (int, string, error) {
	c := &http.Client{Timeout: testkit.WaitTimeout}
	resp, err := c.Post("http://"+addr+wireframe.EventsPath, "application/json", strings.NewReader(frame))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}
