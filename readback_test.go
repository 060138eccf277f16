package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// readBackAll pages through the read-back limit at a time and returns the
// ids in order and the number of pages.
func readBackAll(t testing.TB, addr, query string, limit int, between func(page int)) ([]string, int) {
	t.Helper()
	var ids []string
	cursor := ""
	for page := 1; ; page++ {
		q := query + "&limit=" + itoa(limit)
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		a := testkit.ReadBack(t, addr, q)
		if len(a.Workloads) > limit {
			t.Fatalf("page %d holds %d workloads, over its limit %d", page, len(a.Workloads), limit)
		}
		ids = append(ids, a.IDs()...)
		if a.Next == nil {
			return ids, page
		}
		cursor = *a.Next
		if between != nil {
			between(page)
		}
	}
}

// readBackNode is a started node with its ingress on and a fake clock.
func readBackNode(t *testing.T, opts ...nodeOption) (*testNode, *ifxClock) {
	t.Helper()
	n := newTestNode(t, opts...)
	clock := ifxUseClock(n)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	return n, clock
}

func TestReadBackListsThisNodesIngressWorkloadsWithTheirLatestStateAndLeaseDeadline(t *testing.T) {
	n, clock := readBackNode(t, withResyncInterval(30*time.Second))
	postLeased(t, n, leasedInfo("leased", "running", 1), 600)
	postLeased(t, n, leasedInfo("unleased", "queued", 1), 0)
	postLeased(t, n, leasedInfo("unleased", "running", 2), 0)
	postLeased(t, n, leasedInfo("finished", "completed", 1), 0)
	postLeased(t, n, leasedInfo("gone", "running", 1), 0)
	if st, text := testkit.PostIngress(t, n.m.IngressAddr(), `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"gone"}}`); st != http.StatusOK {
		t.Fatalf("removal: %d %s", st, text)
	}
	postLeased(t, n, leasedInfo("taken-over", "queued", 1), 0)
	later := leasedInfo("taken-over", "running", 2)
	later["originatedFrom"] = n.id
	n.sendLifecycle(later) // the broker's own frame for an ingress job
	n.sendLifecycle(testframe.Workload("proxy-job", "running", n.id))
	ifxBrokerBarrier(t, n)
	testkit.Eventually(t, "the broker's frames to be tracked", func() bool {
		held := resyncHeld(t, n, n.id, "taken-over")
		return held["state"] == "running" && ifxIsTracked(n, n.id, "proxy-job")
	})

	a := testkit.ReadBack(t, n.m.IngressAddr(), "")
	if got, want := a.IDs(), []string{"leased", "unleased", "finished", "taken-over"}; !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v: the ingress's workloads in the order first reported, not the proxy's or a removed one", got, want)
	}
	wantState := []string{"running", "running", "completed", "running"}
	for i, w := range a.Workloads {
		if w.WorkloadInfo["state"] != wantState[i] || w.WorkloadInfo["originatedFrom"] != n.id || w.WorkloadInfo["harnessSlot"] != 3.0 {
			t.Errorf("%s listed as %v, want its latest object (%s), stamped, with the producer's fields", a.IDs()[i], w.WorkloadInfo, wantState[i])
		}
		switch {
		case i == 0 && (w.LeaseDeadline == nil || *w.LeaseDeadline != clock.now().Add(600*time.Second).UnixMilli()):
			t.Errorf("leased job's deadline %v, want %d", w.LeaseDeadline, clock.now().Add(600*time.Second).UnixMilli())
		case i > 0 && w.LeaseDeadline != nil:
			t.Errorf("%s has lease deadline %d, want null", a.IDs()[i], *w.LeaseDeadline)
		}
	}
	if a.Next != nil {
		t.Fatalf("next = %q at the end of the set, want null", *a.Next)
	}

	// Past the terminal retention the finished job is no longer listed,
	// even before a prune has dropped it from the set.
	clock.advance(61 * time.Second)
	if got := testkit.ReadBack(t, n.m.IngressAddr(), "").IDs(); slices.Contains(got, "finished") {
		t.Fatalf("listed %v: a terminal job past its retention", got)
	}
}

func TestReadBackFiltersOnRequesterId(t *testing.T) {
	n, _ := readBackNode(t)
	for _, c := range []struct {
		id        string
		requester any // nil: absent
	}{
		{"a-1", "harness-a"}, {"b-1", "harness-b"}, {"a-2", "harness-a"}, {"null-1", json.RawMessage("null")}, {"none-1", nil}, {"empty-1", ""},
	} {
		w := leasedInfo(c.id, "running", 1)
		delete(w, "requesterId")
		if c.requester != nil {
			w["requesterId"] = c.requester
		}
		postLeased(t, n, w, 0)
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"requesterId=harness-a", []string{"a-1", "a-2"}},
		{"requesterId=harness-b", []string{"b-1"}},
		{"requesterId=", []string{"empty-1"}},
		{"requesterId=nobody", nil},
		{"", []string{"a-1", "b-1", "a-2", "null-1", "none-1", "empty-1"}},
	} {
		if got := testkit.ReadBack(t, n.m.IngressAddr(), c.query).IDs(); !slices.Equal(got, c.want) {
			t.Errorf("%q listed %v, want %v", c.query, got, c.want)
		}
	}
}

func TestReadBackPagesThroughEveryWorkloadOnceWithLimitAndCursor(t *testing.T) {
	n, _ := readBackNode(t)
	var all []string
	for i := range 25 {
		id := "page-" + itoa(100+i)
		all = append(all, id)
		postLeased(t, n, leasedInfo(id, "running", 1), 0)
	}
	got, pages := readBackAll(t, n.m.IngressAddr(), "", 7, nil)
	if !slices.Equal(got, all) || pages != 4 {
		t.Fatalf("%d pages listed %v, want 4 pages listing every workload once in order", pages, got)
	}

	// The set changes between pages: the workload the first page ended on
	// is removed (the cursor goes on from its place), one further on is
	// removed, one is added. Every workload there throughout is listed
	// once; the removed ones after their removal never.
	removal := func(id string) {
		if st, text := testkit.PostIngress(t, n.m.IngressAddr(), `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"`+id+`"}}`); st != http.StatusOK {
			t.Fatalf("removal: %d %s", st, text)
		}
	}
	got, _ = readBackAll(t, n.m.IngressAddr(), "", 7, func(page int) {
		if page == 1 {
			removal("page-106") // the last of page 1: the cursor's own entry
			removal("page-120")
			postLeased(t, n, leasedInfo("page-200", "running", 1), 0)
		}
	})
	want := append(slices.Clone(all[:20]), append(all[21:], "page-200")...)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v\nwant %v", got, want)
	}
}

// The walk holds activeMu for one slice at a time; an entry removed while
// the lock is released keeps its next pointer, so the walk goes on past it
// rather than ending early.
func TestReadBackWalkGoesOnPastEntriesRemovedBetweenTwoSlices(t *testing.T) {
	n := newTestNode(t)
	for i := range 2 * ingress.ReadBackSlice {
		if _, err := n.m.ingestLocal(testframe.Lifecycle(leasedInfo("walk-"+itoa(1000+i), "running", 1), nil)); err != nil {
			t.Fatal(err)
		}
	}
	head := n.m.table.ReadStart(nil, ingress.ReadBackSlice, func(int) {})
	v := n.m.table.ReadSlice(head, nil, ingress.ReadBackSlice, ingress.ReadBackSlice)
	first, visited, next := v.Items, v.Visited, v.Next
	if len(first) != ingress.ReadBackSlice || visited != ingress.ReadBackSlice || next.AtEnd() {
		t.Fatalf("first slice: %d items, %d visited, next %v", len(first), visited, next)
	}
	// The next slice's first entry and the one after it leave the set.
	for _, id := range []string{"walk-" + itoa(1000+ingress.ReadBackSlice), "walk-" + itoa(1001+ingress.ReadBackSlice)} {
		if _, err := n.m.ingestLocal([]byte(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"` + id + `"}}`)); err != nil {
			t.Fatal(err)
		}
	}
	v = n.m.table.ReadSlice(next, nil, ingress.ReadBackSlice, ingress.ReadBackSlice)
	second, end := v.Items, v.Next
	if len(second) != ingress.ReadBackSlice-2 || !end.AtEnd() {
		t.Fatalf("second slice: %d items (want %d), end %v", len(second), ingress.ReadBackSlice-2, end)
	}
	if id := second[0].Mark.Key.ID; id != "walk-"+itoa(1002+ingress.ReadBackSlice) {
		t.Fatalf("the second slice starts at %s, want the first entry still in the set", id)
	}
}

func TestReadBackQueryOutsideItsRulesIs400NamingTheParameter(t *testing.T) {
	n, _ := readBackNode(t)
	postLeased(t, n, leasedInfo("q", "running", 1), 0)
	valid := testkit.ReadBack(t, n.m.IngressAddr(), "limit=1")
	if valid.Next != nil {
		t.Fatalf("one workload, limit 1: next %q, want null", *valid.Next)
	}
	long := strings.Repeat("c", ingress.MaxCursorBytes+1)
	for _, c := range []struct {
		query, reason string
	}{
		{"limit=0", "limit"},
		{"limit=10001", "limit"},
		{"limit=abc", "limit"},
		{"limit=-1", "limit"},
		{"limit=1&limit=2", "limit given 2 times"},
		{"requesterid=x", `unknown query parameter "requesterid"`},
		{"page=2", `unknown query parameter "page"`},
		{"requesterId=" + strings.Repeat("r", 257), "requesterId is 257 bytes, over its 256-byte bound"},
		{"requesterId=%ff", "requesterId must be valid UTF-8"},
		{"cursor=!!!", "cursor: not a cursor this node gave"},
		{"cursor=AQAAAAF4AA", "cursor: not a cursor this node gave"}, // a valid cursor (order 1, id "x") with bytes after it
		{"cursor=" + long, "cursor is 1441 bytes"},
		{"limit=%zz", "query"},
	} {
		st, _, body := testkit.GetReadBack(t, n.m.IngressAddr(), c.query)
		if st != http.StatusBadRequest || !strings.Contains(string(body), c.reason) {
			t.Errorf("%.60q: %d %q, want 400 with %q", c.query, st, body, c.reason)
		}
	}
	if got, want := testkit.ReadBack(t, n.m.IngressAddr(), "limit=10000").IDs(), []string{"q"}; !slices.Equal(got, want) {
		t.Fatalf("limit=10000 listed %v", got)
	}
}

func TestReadBackRefusesBrowsersAndOtherMethodsBeforeAnythingElse(t *testing.T) {
	n, _ := readBackNode(t)
	addr := n.m.IngressAddr()
	for _, c := range []struct {
		name, method string
		headers      []string
		want         int
	}{
		{"a page's GET (Origin)", http.MethodGet, []string{"Origin", "http://evil.example"}, http.StatusForbidden},
		{"Origin: null", http.MethodGet, []string{"Origin", "null"}, http.StatusForbidden},
		{"Origin before the method", http.MethodPost, []string{"Origin", "http://evil.example"}, http.StatusForbidden},
		{"a rebinding page's Host", http.MethodGet, []string{"Host", "evil.example:" + strings.Split(addr, ":")[1]}, http.StatusMisdirectedRequest},
		{"Host before the method", http.MethodDelete, []string{"Host", "evil.example"}, http.StatusMisdirectedRequest},
		{"POST", http.MethodPost, nil, http.StatusMethodNotAllowed},
		{"PUT", http.MethodPut, nil, http.StatusMethodNotAllowed},
		{"DELETE", http.MethodDelete, nil, http.StatusMethodNotAllowed},
		{"HEAD", http.MethodHead, nil, http.StatusMethodNotAllowed},
		{"OPTIONS (a preflight)", http.MethodOptions, nil, http.StatusMethodNotAllowed},
		{"method before the query", http.MethodPost, []string{}, http.StatusMethodNotAllowed},
		{"a page's no-cors GET (Fetch Metadata)", http.MethodGet, []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "no-cors"}, http.StatusForbidden},
		{"Fetch Metadata before the method", http.MethodPost, []string{"Sec-Fetch-Site", "same-site"}, http.StatusForbidden},
		{"Host before Fetch Metadata", http.MethodGet, []string{"Host", "evil.example", "Sec-Fetch-Site", "cross-site"}, http.StatusMisdirectedRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			query := ""
			if c.name == "method before the query" {
				query = "limit=0"
			}
			st, h, body := testkit.DoReadBack(t, c.method, addr, query, c.headers...)
			if st != c.want {
				t.Fatalf("%d %s, want %d", st, body, c.want)
			}
			if st == http.StatusMethodNotAllowed && h.Get("Allow") != http.MethodGet {
				t.Fatalf("405 with Allow %q, want GET", h.Get("Allow"))
			}
			if bytes.Contains(body, []byte("workloads")) {
				t.Fatalf("a refusal carries a listing: %s", body)
			}
		})
	}
}

func TestReadBackAnswerIsReadableByNoOtherOrigin(t *testing.T) {
	n, _ := readBackNode(t)
	st, h, _ := testkit.GetReadBack(t, n.m.IngressAddr(), "")
	want := map[string]string{
		"Content-Type":                 "application/json",
		"X-Content-Type-Options":       "nosniff",
		"Cross-Origin-Resource-Policy": "same-origin",
		"Cache-Control":                "no-store",
		"Access-Control-Allow-Origin":  "",
	}
	for k, v := range want {
		if h.Get(k) != v {
			t.Errorf("%s: %q, want %q", k, h.Get(k), v)
		}
	}
	if st != http.StatusOK {
		t.Fatalf("status %d", st)
	}
}

func TestReadBackEndsAPageAtItsByteBoundWithACursor(t *testing.T) {
	n, _ := readBackNode(t)
	const each = 200 << 10
	count := ingress.ReadBackPageBytes/each + 3
	trackWideIngressRuns(t, n, count, each)
	first := testkit.ReadBack(t, n.m.IngressAddr(), "limit=10000")
	if len(first.Workloads) != ingress.ReadBackPageBytes/each+1 || first.Next == nil {
		t.Fatalf("the first page holds %d workloads of %d bytes, next %v; want the page ended just past %d bytes, with a cursor",
			len(first.Workloads), each, first.Next, ingress.ReadBackPageBytes)
	}
	rest := testkit.ReadBack(t, n.m.IngressAddr(), "limit=10000&cursor="+url.QueryEscape(*first.Next))
	if len(first.Workloads)+len(rest.Workloads) != count || rest.Next != nil {
		t.Fatalf("the second page holds %d, next %v; want the other %d", len(rest.Workloads), rest.Next, count-len(first.Workloads))
	}
	if got := n.m.ingressStats.CutBytes(); got != 1 {
		t.Fatalf("nvpair_wlm_readback_pages_cut_total{bound=\"bytes\"} = %d, want 1", got)
	}
}

func TestReadBackEndsAPageAtItsScanBoundWithACursor(t *testing.T) {
	n, _ := readBackNode(t, withMaxLiveWorkloads(ingress.ReadBackScanMax+2*ingress.ReadBackSlice))
	// The broker's own workloads, which the read-back looks at and skips:
	// more than the bound rounded up to a whole slice.
	ev, err := wireframe.ParseLifecycle(wireframe.MethodStarted, json.RawMessage(`{"workloadInfo":`+mustJSON(t, testframe.Workload("proxy", "running", n.id))+`}`))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ingress.ReadBackScanMax + ingress.ReadBackSlice {
		ev.Info.ID = "proxy-" + itoa(i)
		commitDirect(t, n, &ev, statetable.FromBroker)
	}
	postLeased(t, n, leasedInfo("after-them", "running", 1), 0)

	first := testkit.ReadBack(t, n.m.IngressAddr(), "")
	if len(first.Workloads) != 0 || first.Next == nil {
		t.Fatalf("the first answer lists %v, next %v; want none and a cursor after %d entries looked at", first.IDs(), first.Next, ingress.ReadBackScanMax)
	}
	rest := testkit.ReadBack(t, n.m.IngressAddr(), "cursor="+url.QueryEscape(*first.Next))
	if got := rest.IDs(); !slices.Equal(got, []string{"after-them"}) || rest.Next != nil {
		t.Fatalf("the next answer lists %v, next %v", got, rest.Next)
	}
	if got := n.m.ingressStats.CutScan(); got != 1 {
		t.Fatalf("nvpair_wlm_readback_pages_cut_total{bound=\"scan\"} = %d, want 1", got)
	}
}

// A client that asks and never reads is dropped at the answer's write
// deadline: it cannot hold the request, and what it copied out of the set,
// for longer.
func TestReadBackClientThatStopsReadingIsDroppedAtTheWriteDeadline(t *testing.T) {
	old := ingress.ReadBackWriteTimeout
	ingress.ReadBackWriteTimeout = 300 * time.Millisecond
	t.Cleanup(func() { ingress.ReadBackWriteTimeout = old })
	n, _ := readBackNode(t)
	trackWideIngressRuns(t, n, ingress.ReadBackPageBytes/(200<<10), 200<<10)
	conn, err := net.Dial("tcp", n.m.IngressAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A small receive buffer, so the 8 MiB answer cannot all be taken in
	// by the kernel on the client's behalf.
	if err := conn.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "GET "+ingress.ReadBackPath+" HTTP/1.1\r\nHost: "+n.m.IngressAddr()+"\r\n"+ingress.ReadBackHeader+": 1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the read-back to give up on the client", func() bool {
		return n.logs.Contains("ingress read-back answered", "cutBy=client")
	})
}

// trackWideIngressRuns puts count ingress runs into n's re-sync set, each
// with a member of size bytes, straight into the set: parsing megabytes
// of frames under the race detector would take seconds.
func trackWideIngressRuns(t *testing.T, n *testNode, count, size int) {
	t.Helper()
	w := leasedInfo("wide", "running", 1)
	w["originatedFrom"], w["blob"] = n.id, strings.Repeat("b", size)
	ev, err := wireframe.ParseLifecycle(wireframe.MethodStarted, json.RawMessage(`{"workloadInfo":`+mustJSON(t, w)+`}`))
	if err != nil {
		t.Fatal(err)
	}
	for i := range count {
		ev.Info.ID = "wide-" + itoa(100+i)
		commitDirect(t, n, &ev, statetable.FromProducer)
	}
}

// The read-back requires a header a web page cannot send without a CORS
// preflight: without it, or with it given otherwise, the answer is 400
// naming it, and nothing of the set is looked at.
func TestReadBackWithoutItsHeaderIs400NamingItBeforeAnyWork(t *testing.T) {
	n, _ := readBackNode(t)
	addr := n.m.IngressAddr()
	postLeased(t, n, leasedInfo("hdr", "running", 1), 0)
	for _, c := range []struct {
		name    string
		headers []string
		reason  string
	}{
		{"missing", []string{ingress.ReadBackHeader, ""}, "the read-back requires the header Workload-Read-Back: 1 (a web page cannot send it)"},
		{"another value", []string{ingress.ReadBackHeader, "true"}, "header Workload-Read-Back must be given once, as 1"},
		{"empty", []string{ingress.ReadBackHeader, " "}, "header Workload-Read-Back must be given once, as 1"},
		{"twice", []string{ingress.ReadBackHeader, "1", ingress.ReadBackHeader, "1"}, "header Workload-Read-Back must be given once, as 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := n.m.ingressStats.Scanned()
			st, _, body := testkit.GetReadBack(t, addr, "", c.headers...)
			if st != http.StatusBadRequest || strings.TrimSpace(string(body)) != c.reason {
				t.Fatalf("%d %.200q, want 400 %q", st, body, c.reason)
			}
			if got := n.m.ingressStats.Scanned(); got != before {
				t.Fatalf("entries looked at moved %d -> %d for a refused read-back", before, got)
			}
		})
	}
	// The method is checked before the header, and the header before the
	// query: each request has one answer.
	if st, _, body := testkit.DoReadBack(t, http.MethodPost, addr, "limit=0", ingress.ReadBackHeader, ""); st != http.StatusMethodNotAllowed {
		t.Errorf("POST without the header: %d %s, want 405", st, body)
	}
	if st, _, body := testkit.GetReadBack(t, addr, "limit=0", ingress.ReadBackHeader, ""); st != http.StatusBadRequest || !strings.Contains(string(body), ingress.ReadBackHeader) {
		t.Errorf("a bad query without the header: %d %s, want the header's 400", st, body)
	}
	if got := testkit.ReadBack(t, addr, "").IDs(); !slices.Equal(got, []string{"hdr"}) {
		t.Fatalf("with the header: listed %v", got)
	}
}

// stallReadBack asks for a read-back on a connection that never reads, so
// the answer (over 8 MiB, the set holding wide runs) blocks in its write
// and the read-back stays in progress until the connection is closed.
func stallReadBack(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "GET "+ingress.ReadBackPath+"?limit=10000 HTTP/1.1\r\nHost: "+addr+"\r\n"+ingress.ReadBackHeader+": 1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	return conn
}

// At most ingress.ReadBackMaxInProgress read-backs are answered at once; one more
// is refused at once with 503 and Retry-After, not queued, and is counted;
// once one ends, read-backs are answered again.
func TestReadBacksInProgressAreBoundedAndOneMoreIs503WithRetryAfter(t *testing.T) {
	n, _ := readBackNode(t)
	addr := n.m.IngressAddr()
	trackWideIngressRuns(t, n, ingress.ReadBackPageBytes/(200<<10)+2, 200<<10)
	var stalled []net.Conn
	for range ingress.ReadBackMaxInProgress {
		stalled = append(stalled, stallReadBack(t, addr))
	}
	testkit.Eventually(t, "the stalled read-backs to be in progress", func() bool {
		return n.m.ingressStats.InProgress() == ingress.ReadBackMaxInProgress
	})
	var metrics strings.Builder
	if err := n.m.writeMetrics(&metrics); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nnvpair_wlm_readback_in_progress 2\n", "\nnvpair_wlm_readback_in_progress_max 2\n"} {
		if !strings.Contains(metrics.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	scanned := n.m.ingressStats.Scanned()
	st, h, body := testkit.GetReadBack(t, addr, "limit=1")
	if st != http.StatusServiceUnavailable || h.Get("Retry-After") != "1" ||
		strings.TrimSpace(string(body)) != "2 read-backs are in progress, the most this node answers at once; retry after 1 s" {
		t.Fatalf("one read-back more: %d Retry-After %q %.200q, want 503 with Retry-After 1", st, h.Get("Retry-After"), body)
	}
	if got := n.m.ingressStats.Busy(); got != 1 {
		t.Errorf("nvpair_wlm_readback_busy_refusals_total = %d, want 1", got)
	}
	if got := n.m.ingressStats.Scanned(); got != scanned {
		t.Errorf("the refused read-back looked at %d entries", got-scanned)
	}
	// The producer's frames are not held up by the read-backs.
	postLeased(t, n, leasedInfo("during", "running", 1), 0)

	stalled[0].Close()
	testkit.Eventually(t, "a place to free", func() bool { return n.m.ingressStats.InProgress() < ingress.ReadBackMaxInProgress })
	if got := testkit.ReadBack(t, addr, "limit=1"); len(got.Workloads) != 1 {
		t.Fatalf("after a place freed: listed %v", got.IDs())
	}
}

// Every answer looks at the same entries whatever its filter matches, so
// the time of ?requesterId=X&limit=1 does not tell whether X has jobs on
// this node: shown by the count of entries looked at, which is
// deterministic, rather than by the time.
func TestReadBackLooksAtTheSameEntriesWhetherItsFilterMatchesOrNot(t *testing.T) {
	n, _ := readBackNode(t, withMaxLiveWorkloads(2*ingress.ReadBackScanMax))
	// The broker's own workloads, which the read-back looks at and never
	// lists, around the jobs of two producers: "early" has its jobs at
	// the head of the set, "late" at its end.
	ev, err := wireframe.ParseLifecycle(wireframe.MethodStarted, json.RawMessage(`{"workloadInfo":`+mustJSON(t, testframe.Workload("proxy", "running", n.id))+`}`))
	if err != nil {
		t.Fatal(err)
	}
	proxies := func(count int) {
		for range count {
			ev.Info.ID = "proxy-" + itoa(n.m.table.Sizes().Runs)
			commitDirect(t, n, &ev, statetable.FromBroker)
		}
	}
	post := func(id, requester string) {
		w := leasedInfo(id, "running", 1)
		w["requesterId"] = requester
		postLeased(t, n, w, 0)
	}
	post("early-1", "early")
	post("early-2", "early")
	proxies(3*ingress.ReadBackSlice + 17)
	post("late-1", "late")
	set := n.m.table.Sizes().Runs

	looked := func(query string) (int, testkit.ReadBackAnswer) {
		before := n.m.ingressStats.Scanned()
		a := testkit.ReadBack(t, n.m.IngressAddr(), query)
		return int(n.m.ingressStats.Scanned() - before), a
	}
	for _, c := range []struct {
		query string
		ids   []string
		next  bool
	}{
		{"requesterId=early&limit=1", []string{"early-1"}, true},
		{"requesterId=late&limit=1", []string{"late-1"}, false},
		{"requesterId=nobody&limit=1", nil, false},
		{"limit=1", []string{"early-1"}, true},
		{"requesterId=early", []string{"early-1", "early-2"}, false},
	} {
		got, a := looked(c.query)
		if got != set {
			t.Errorf("%s looked at %d entries, want all %d whatever it matched", c.query, got, set)
		}
		if !slices.Equal(a.IDs(), c.ids) || (a.Next != nil) != c.next {
			t.Errorf("%s listed %v, next %v; want %v, a cursor: %v", c.query, a.IDs(), a.Next, c.ids, c.next)
		}
	}
	// A filter that matches once and no more says so (next null), though
	// it stopped at its limit: the walk looked on and found no other.
	one, _ := looked("requesterId=late&limit=1")
	none, _ := looked("requesterId=nobody&limit=1")
	if one != none {
		t.Fatalf("with a hit %d entries looked at, without %d", one, none)
	}

	// Past the scan bound the two still look at the same entries: the
	// bound, rounded up to a whole slice.
	proxies(ingress.ReadBackScanMax)
	bound := (ingress.ReadBackScanMax + ingress.ReadBackSlice - 1) / ingress.ReadBackSlice * ingress.ReadBackSlice
	for _, q := range []string{"requesterId=early&limit=1", "requesterId=nobody&limit=1"} {
		if got, a := looked(q); got != bound || a.Next == nil {
			t.Errorf("%s on %d entries looked at %d, next %v; want %d and a cursor", q, n.m.table.Sizes().Runs, got, a.Next, bound)
		}
	}
}
