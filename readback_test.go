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
)

// readBackAnswer is the read-back's JSON answer.
type readBackAnswer struct {
	Workloads []struct {
		WorkloadInfo  map[string]any `json:"workloadInfo"`
		LeaseDeadline *int64         `json:"leaseDeadline"`
	} `json:"workloads"`
	Next *string `json:"next"`
}

func (a readBackAnswer) ids() []string {
	var out []string
	for _, w := range a.Workloads {
		out = append(out, w.WorkloadInfo["id"].(string))
	}
	return out
}

// getReadBack sends GET /v1/workloads?query to the ingress at addr, with
// headers as name/value pairs ("Host" sets the request's Host).
func getReadBack(t testing.TB, addr, query string, headers ...string) (int, http.Header, []byte) {
	t.Helper()
	return doReadBack(t, http.MethodGet, addr, query, headers...)
}

func doReadBack(t testing.TB, method, addr, query string, headers ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+readBackPath+"?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
		} else {
			req.Header.Add(headers[i], headers[i+1])
		}
	}
	resp, err := liClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, readBackPath, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, body
}

// readBack requires a 200 answer to query and decodes it.
func readBack(t testing.TB, addr, query string) readBackAnswer {
	t.Helper()
	st, _, body := getReadBack(t, addr, query)
	if st != http.StatusOK {
		t.Fatalf("read-back %q: %d %s", query, st, body)
	}
	var a readBackAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("read-back %q answered %s: %v", query, body, err)
	}
	return a
}

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
		a := readBack(t, addr, q)
		if len(a.Workloads) > limit {
			t.Fatalf("page %d holds %d workloads, over its limit %d", page, len(a.Workloads), limit)
		}
		ids = append(ids, a.ids()...)
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
	if st, text := postIngress(t, n.m.IngressAddr(), `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"gone"}}`); st != http.StatusOK {
		t.Fatalf("removal: %d %s", st, text)
	}
	postLeased(t, n, leasedInfo("taken-over", "queued", 1), 0)
	later := leasedInfo("taken-over", "running", 2)
	later["originatedFrom"] = n.id
	n.sendLifecycle(later) // the broker's own frame for an ingress job
	n.sendLifecycle(workload("proxy-job", "running", n.id))
	ifxBrokerBarrier(t, n)
	eventually(t, "the broker's frames to be tracked", func() bool {
		held := resyncHeld(t, n, n.id, "taken-over")
		return held["state"] == "running" && ifxIsTracked(n, n.id, "proxy-job")
	})

	a := readBack(t, n.m.IngressAddr(), "")
	if got, want := a.ids(), []string{"leased", "unleased", "finished", "taken-over"}; !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v: the ingress's workloads in the order first reported, not the proxy's or a removed one", got, want)
	}
	wantState := []string{"running", "running", "completed", "running"}
	for i, w := range a.Workloads {
		if w.WorkloadInfo["state"] != wantState[i] || w.WorkloadInfo["originatedFrom"] != n.id || w.WorkloadInfo["harnessSlot"] != 3.0 {
			t.Errorf("%s listed as %v, want its latest object (%s), stamped, with the producer's fields", a.ids()[i], w.WorkloadInfo, wantState[i])
		}
		switch {
		case i == 0 && (w.LeaseDeadline == nil || *w.LeaseDeadline != clock.now().Add(600*time.Second).UnixMilli()):
			t.Errorf("leased job's deadline %v, want %d", w.LeaseDeadline, clock.now().Add(600*time.Second).UnixMilli())
		case i > 0 && w.LeaseDeadline != nil:
			t.Errorf("%s has lease deadline %d, want null", a.ids()[i], *w.LeaseDeadline)
		}
	}
	if a.Next != nil {
		t.Fatalf("next = %q at the end of the set, want null", *a.Next)
	}

	// Past the terminal retention the finished job is no longer listed,
	// even before a prune has dropped it from the set.
	clock.advance(61 * time.Second)
	if got := readBack(t, n.m.IngressAddr(), "").ids(); slices.Contains(got, "finished") {
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
		if got := readBack(t, n.m.IngressAddr(), c.query).ids(); !slices.Equal(got, c.want) {
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
		if st, text := postIngress(t, n.m.IngressAddr(), `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"`+id+`"}}`); st != http.StatusOK {
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
	for i := range 2 * readBackSlice {
		if _, err := n.m.ingestLocal([]byte(ingressFrameJSON(leasedInfo("walk-"+itoa(1000+i), "running", 1)))); err != nil {
			t.Fatal(err)
		}
	}
	n.m.activeMu.Lock()
	head := n.m.resync.head
	n.m.activeMu.Unlock()
	first, _, visited, next := n.m.readBackSlice(head)
	if len(first) != readBackSlice || visited != readBackSlice || next == nil {
		t.Fatalf("first slice: %d items, %d visited, next %v", len(first), visited, next)
	}
	// The next slice's first entry and the one after it leave the set.
	for _, id := range []string{"walk-" + itoa(1000+readBackSlice), "walk-" + itoa(1001+readBackSlice)} {
		if _, err := n.m.ingestLocal([]byte(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"` + id + `"}}`)); err != nil {
			t.Fatal(err)
		}
	}
	second, _, _, end := n.m.readBackSlice(next)
	if len(second) != readBackSlice-2 || end != nil {
		t.Fatalf("second slice: %d items (want %d), end %v", len(second), readBackSlice-2, end)
	}
	if id := second[0].cursor.id; id != "walk-"+itoa(1002+readBackSlice) {
		t.Fatalf("the second slice starts at %s, want the first entry still in the set", id)
	}
}

func TestReadBackQueryOutsideItsRulesIs400NamingTheParameter(t *testing.T) {
	n, _ := readBackNode(t)
	postLeased(t, n, leasedInfo("q", "running", 1), 0)
	valid := readBack(t, n.m.IngressAddr(), "limit=1")
	if valid.Next != nil {
		t.Fatalf("one workload, limit 1: next %q, want null", *valid.Next)
	}
	long := strings.Repeat("c", maxCursorBytes+1)
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
		{"cursor=" + readBackCursor{order: 1, id: "x"}.encode() + "AA", "cursor: not a cursor this node gave"},
		{"cursor=" + long, "cursor is 1441 bytes"},
		{"limit=%zz", "query"},
	} {
		st, _, body := getReadBack(t, n.m.IngressAddr(), c.query)
		if st != http.StatusBadRequest || !strings.Contains(string(body), c.reason) {
			t.Errorf("%.60q: %d %q, want 400 with %q", c.query, st, body, c.reason)
		}
	}
	if got, want := readBack(t, n.m.IngressAddr(), "limit=10000").ids(), []string{"q"}; !slices.Equal(got, want) {
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
	} {
		t.Run(c.name, func(t *testing.T) {
			query := ""
			if c.name == "method before the query" {
				query = "limit=0"
			}
			st, h, body := doReadBack(t, c.method, addr, query, c.headers...)
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
	st, h, _ := getReadBack(t, n.m.IngressAddr(), "")
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
	count := readBackPageBytes/each + 3
	trackWideIngressRuns(t, n, count, each)
	first := readBack(t, n.m.IngressAddr(), "limit=10000")
	if len(first.Workloads) != readBackPageBytes/each+1 || first.Next == nil {
		t.Fatalf("the first page holds %d workloads of %d bytes, next %v; want the page ended just past %d bytes, with a cursor",
			len(first.Workloads), each, first.Next, readBackPageBytes)
	}
	rest := readBack(t, n.m.IngressAddr(), "limit=10000&cursor="+url.QueryEscape(*first.Next))
	if len(first.Workloads)+len(rest.Workloads) != count || rest.Next != nil {
		t.Fatalf("the second page holds %d, next %v; want the other %d", len(rest.Workloads), rest.Next, count-len(first.Workloads))
	}
	if got := n.m.readBacks.cutBytes.Load(); got != 1 {
		t.Fatalf("nvpair_wlm_readback_pages_cut_total{bound=\"bytes\"} = %d, want 1", got)
	}
}

func TestReadBackEndsAPageAtItsScanBoundWithACursor(t *testing.T) {
	n, _ := readBackNode(t, withMaxLiveWorkloads(readBackScanMax+2*readBackSlice))
	// The broker's own workloads, which the read-back looks at and skips:
	// more than the bound rounded up to a whole slice.
	ev, err := parseLifecycle(methodStarted, json.RawMessage(`{"workloadInfo":`+mustJSON(t, workload("proxy", "running", n.id))+`}`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	n.m.activeMu.Lock()
	for i := range readBackScanMax + readBackSlice {
		ev.info.ID = "proxy-" + itoa(i)
		n.m.resync.track(&ev, now, false)
	}
	n.m.activeMu.Unlock()
	postLeased(t, n, leasedInfo("after-them", "running", 1), 0)

	first := readBack(t, n.m.IngressAddr(), "")
	if len(first.Workloads) != 0 || first.Next == nil {
		t.Fatalf("the first answer lists %v, next %v; want none and a cursor after %d entries looked at", first.ids(), first.Next, readBackScanMax)
	}
	rest := readBack(t, n.m.IngressAddr(), "cursor="+url.QueryEscape(*first.Next))
	if got := rest.ids(); !slices.Equal(got, []string{"after-them"}) || rest.Next != nil {
		t.Fatalf("the next answer lists %v, next %v", got, rest.Next)
	}
	if got := n.m.readBacks.cutScan.Load(); got != 1 {
		t.Fatalf("nvpair_wlm_readback_pages_cut_total{bound=\"scan\"} = %d, want 1", got)
	}
}

// A client that asks and never reads is dropped at the answer's write
// deadline: it cannot hold the request, and what it copied out of the set,
// for longer.
func TestReadBackClientThatStopsReadingIsDroppedAtTheWriteDeadline(t *testing.T) {
	old := readBackWriteTimeout
	readBackWriteTimeout = 300 * time.Millisecond
	t.Cleanup(func() { readBackWriteTimeout = old })
	n, _ := readBackNode(t)
	trackWideIngressRuns(t, n, readBackPageBytes/(200<<10), 200<<10)
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
	if _, err := io.WriteString(conn, "GET "+readBackPath+" HTTP/1.1\r\nHost: "+n.m.IngressAddr()+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the read-back to give up on the client", func() bool {
		return n.logs.contains("ingress read-back answered", "cutBy=client")
	})
}

// trackWideIngressRuns puts count ingress runs into n's re-sync set, each
// with a member of size bytes, straight into the set: parsing megabytes
// of frames under the race detector would take seconds.
func trackWideIngressRuns(t *testing.T, n *testNode, count, size int) {
	t.Helper()
	w := leasedInfo("wide", "running", 1)
	w["originatedFrom"], w["blob"] = n.id, strings.Repeat("b", size)
	ev, err := parseLifecycle(methodStarted, json.RawMessage(`{"workloadInfo":`+mustJSON(t, w)+`}`))
	if err != nil {
		t.Fatal(err)
	}
	n.m.activeMu.Lock()
	defer n.m.activeMu.Unlock()
	for i := range count {
		ev.info.ID = "wide-" + itoa(100+i)
		n.m.resync.track(&ev, time.Now(), true)
		n.m.resync.entries[ev.key()].ingress = true
	}
}
