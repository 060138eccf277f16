package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/wireframe"
)

func TestEveryAnswerOfThePeerPortAdvertisesBatches(t *testing.T) {
	h := newNetPeerHarness(t)
	origin := h.client.Principal
	unpinned := testkit.Mint(t, devpki.NewUUID())
	stranger := testkit.PeerClient(t, &unpinned, h.n.ident.DER)
	valid := testframe.Lifecycle(testframe.Workload("job-advert", "running", origin), nil)
	cases := []struct {
		name   string
		status int
		do     func() netAnswer
	}{
		{"single frame written", 200, func() netAnswer {
			return netSend(t, h.c, h.addr, "POST", wireframe.EventsPath, "application/json", valid)
		}},
		{"single frame invalid", 400, func() netAnswer {
			return netSend(t, h.c, h.addr, "POST", wireframe.EventsPath, "application/json", []byte("{"))
		}},
		{"single frame from an unpinned client", 403, func() netAnswer {
			return netSend(t, stranger, h.addr, "POST", wireframe.EventsPath, "application/json", valid)
		}},
		{"batch from an unpinned client", 403, func() netAnswer {
			return netSend(t, stranger, h.addr, "POST", wireframe.EventsPath, peerwire.BatchContentType, valid)
		}},
		{"another path", 404, func() netAnswer { return netSend(t, h.c, h.addr, "POST", "/v1/other", "application/json", valid) }},
		{"another method", 405, func() netAnswer { return netSend(t, h.c, h.addr, "GET", wireframe.EventsPath, "", nil) }},
		{"single frame over 1 MiB", 413, func() netAnswer {
			return netSend(t, h.c, h.addr, "POST", wireframe.EventsPath, "application/json", make([]byte, wireframe.MaxBytes+1))
		}},
		{"batch over its byte bound", 413, func() netAnswer {
			return netSend(t, h.c, h.addr, "POST", wireframe.EventsPath, peerwire.BatchContentType, make([]byte, peerwire.BatchMaxBytes+1))
		}},
		{"batch answer", 200, func() netAnswer { return netPostBatch(t, h.c, h.addr, valid, []byte("{")) }},
		{"single frame the broker could not take", 500, func() netAnswer {
			// A node of its own: a failed broker write shuts it down.
			f := newNetPeerHarness(t, netFailOn("job-advert-fails"))
			body := testframe.Lifecycle(testframe.Workload("job-advert-fails", "running", f.client.Principal), nil)
			return netSend(t, f.c, f.addr, "POST", wireframe.EventsPath, "application/json", body)
		}},
	}
	for _, c := range cases {
		a := c.do()
		if a.status != c.status {
			t.Fatalf("%s: status %d, want %d (%q)", c.name, a.status, c.status, a.text)
		}
		if got := a.header.Values(peerwire.BatchHeader); len(got) != 1 || got[0] != "max-frames=256, max-bytes=1048576" {
			t.Fatalf("%s: %s = %q, want one advertisement \"max-frames=256, max-bytes=1048576\"", c.name, peerwire.BatchHeader, got)
		}
		if frames, bytes, ok := peerwire.ParseBatchAdvert(a.header.Get(peerwire.BatchHeader)); !ok || frames != peerwire.BatchMaxFrames || bytes != peerwire.BatchMaxBytes {
			t.Fatalf("%s: the advertisement parses as %d, %d, %v", c.name, frames, bytes, ok)
		}
	}
}

// Apart from the advertisement, a single-frame request is answered as it
// was before batches: a stock sender sees nothing new.
func TestASingleFramePostIsAnsweredAsBeforeApartFromTheAdvertisement(t *testing.T) {
	h := newNetPeerHarness(t)
	origin := h.client.Principal
	valid := testframe.Lifecycle(testframe.Workload("job-single", "running", origin), nil)
	cases := []struct {
		name, method, path, contentType string
		body                            []byte
		status                          int
		text                            string
		extraHeader                     string // besides the common ones
	}{
		{"written", "POST", wireframe.EventsPath, "application/json", valid, 200, "ok\n", ""},
		{"already seen", "POST", wireframe.EventsPath, "application/json", valid, 200, "ok\n", ""},
		{"without a Content-Type", "POST", wireframe.EventsPath, "", testframe.Removal("job-single", origin), 200, "ok\n", ""},
		{"unknown method", "POST", wireframe.EventsPath, "application/json",
			bytes.Replace(valid, []byte(wireframe.MethodStarted), []byte("workload:paused"), 1), 400, "unknown method \"workload:paused\"\n", ""},
		{"bad jsonrpc", "POST", wireframe.EventsPath, "application/json",
			bytes.Replace(valid, []byte(`"2.0"`), []byte(`"1.0"`), 1), 400, "jsonrpc must be \"2.0\"\n", ""},
		{"over 1 MiB", "POST", wireframe.EventsPath, "application/json", make([]byte, wireframe.MaxBytes+1), 413, "body larger than 1048576 bytes\n", ""},
		{"another path", "POST", "/v1/other", "application/json", valid, 404, "no such endpoint\n", ""},
		{"another method", "PUT", wireframe.EventsPath, "application/json", valid, 405, "method must be POST\n", "Allow"},
	}
	for _, c := range cases {
		a := netSend(t, h.c, h.addr, c.method, c.path, c.contentType, c.body)
		if a.status != c.status || a.text != c.text {
			t.Fatalf("%s: %d %q, want %d %q", c.name, a.status, a.text, c.status, c.text)
		}
		if ct := a.header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
			t.Fatalf("%s: Content-Type %q, want text/plain; charset=utf-8", c.name, ct)
		}
		want := []string{"Content-Length", "Content-Type", "Date", peerwire.BatchHeader, "X-Content-Type-Options"}
		if c.extraHeader != "" {
			want = append(want, c.extraHeader)
		}
		var got []string
		for k := range a.header {
			if k != "Connection" { // net/http closes after an unread body
				got = append(got, k)
			}
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: answer headers %v, want %v", c.name, got, want)
		}
	}
	h.barrier(t)
	if got := netRelayed(h); strings.Join(got, " ") != "upsert:job-single remove:job-single" {
		t.Fatalf("relayed to the broker: %v", got)
	}
}

func TestABatchOfValidFramesIsAppliedOnceEachInBatchOrder(t *testing.T) {
	h := newNetPeerHarness(t)
	origin := h.client.Principal
	var elems [][]byte
	var want []string
	for i := range 40 {
		id := "job-b" + itoa(i)
		switch i % 4 {
		case 0:
			elems = append(elems, testframe.Lifecycle(testframe.Workload(id, "queued", origin), nil))
			want = append(want, "upsert:"+id)
		case 1:
			elems = append(elems, testframe.Lifecycle(testframe.Workload(id, "running", origin), nil))
			want = append(want, "upsert:"+id)
		case 2:
			elems = append(elems, testframe.Lifecycle(testframe.Workload(id, "completed", origin), nil))
			want = append(want, "upsert:"+id)
		case 3:
			elems = append(elems, testframe.Removal("job-b"+itoa(i-3), origin))
			want = append(want, "remove:job-b"+itoa(i-3))
		}
	}
	before := h.n.m.framesReceived.Get("peer", wireframe.MethodStarted)
	a := netPostBatch(t, h.c, h.addr, elems...)
	if a.status != http.StatusOK || a.header.Get("Content-Type") != "application/json" {
		t.Fatalf("batch = %d %q (%s), want 200 application/json", a.status, a.header.Get("Content-Type"), a.text)
	}
	if len(a.results) != len(elems) {
		t.Fatalf("%d results for %d elements", len(a.results), len(elems))
	}
	for i, r := range a.results {
		if r != (peerwire.BatchResult{Status: 200}) {
			t.Fatalf("element %d: %+v, want 200 without a reason", i, r)
		}
	}
	// Counted as single frames are; the answer came after every element
	// was handled.
	if n := h.n.m.framesReceived.Get("peer", wireframe.MethodStarted) - before; n != 10 {
		t.Fatalf("frames received (peer, %s) went up by %d, want 10", wireframe.MethodStarted, n)
	}
	h.barrier(t)
	if got := netRelayed(h); !slices.Equal(got, want) {
		t.Fatalf("relayed to the broker\n got %v\nwant %v", got, want)
	}
}

func TestABatchElementThatFailsValidationIsAnswered400AndTheOthersAreApplied(t *testing.T) {
	h := newNetPeerHarness(t)
	origin := h.client.Principal
	ok := func(id string) []byte { return testframe.Lifecycle(testframe.Workload(id, "running", origin), nil) }
	body := bytes.Join([][]byte{
		ok("job-v1"),
		bytes.Replace(ok("job-bad"), []byte(wireframe.MethodStarted), []byte("workload:paused"), 1),
		ok("job-v2"),
		nil, // an empty line
		testframe.Lifecycle(testframe.Workload("job-no-model", "running", origin, map[string]any{"model": nil}), nil),
		append(ok("job-v3"), '\r'), // a CRLF line
		ok("job-v4"),               // the last line, without its newline
	}, []byte("\n"))
	a := netSend(t, h.c, h.addr, "POST", wireframe.EventsPath, peerwire.BatchContentType, body)
	if a.status != http.StatusOK {
		t.Fatalf("batch = %d %q, want 200", a.status, a.text)
	}
	want := []struct {
		status int
		reason string
	}{{200, ""}, {400, `unknown method "workload:paused"`}, {200, ""}, {400, "empty element"}, {400, "model"}, {200, ""}, {200, ""}}
	if len(a.results) != len(want) {
		t.Fatalf("%d results, want %d: %s", len(a.results), len(want), a.text)
	}
	for i, w := range want {
		r := a.results[i]
		if r.Status != w.status || (w.reason == "") != (r.Reason == "") || !strings.Contains(r.Reason, w.reason) {
			t.Fatalf("element %d: %+v, want %d with a reason containing %q", i, r, w.status, w.reason)
		}
	}
	h.barrier(t)
	if got := netRelayed(h); strings.Join(got, " ") != "upsert:job-v1 upsert:job-v2 upsert:job-v3 upsert:job-v4" {
		t.Fatalf("relayed to the broker: %v", got)
	}
	// One warning for the batch, never one per element.
	logs := h.n.logs.String()
	if strings.Count(logs, "level=WARN") != 1 || !h.n.logs.Contains("level=WARN", `msg="peer batch elements rejected"`,
		"elements=7", "rejected=3", "firstIndex=1", "status=400", "workload:paused") {
		t.Fatalf("want one warning summarising the batch; logs:\n%s", logs)
	}
}

// A failed broker write stops the batch: what came before it is written,
// it is answered 500, and nothing after it is attempted, so the sender can
// retry from it, in order.
func TestABatchStopsAtTheFirstFailedBrokerWrite(t *testing.T) {
	h := newNetPeerHarness(t, netFailOn(`"job-fail"`))
	origin := h.client.Principal
	h.barrier(t)
	ok := func(id string) []byte { return testframe.Lifecycle(testframe.Workload(id, "running", origin), nil) }
	elems := [][]byte{
		ok("job-s1"),
		[]byte("{"), // rejected before the failure: the batch goes on
		ok("job-s2"),
		ok("job-fail"),
		ok("job-s3"),
		[]byte("{"), // after the failure: not even looked at
		testframe.Removal("job-s1", origin),
		ok("job-s1"), // already seen, but after the failure
	}
	writes := h.n.m.out.Counts().Writes
	a := netPostBatch(t, h.c, h.addr, elems...)
	if a.status != http.StatusOK {
		t.Fatalf("batch = %d %q, want 200", a.status, a.text)
	}
	wantStatus := []int{200, 400, 200, 500, 503, 503, 503, 503}
	if len(a.results) != len(wantStatus) {
		t.Fatalf("%d results, want %d: %s", len(a.results), len(wantStatus), a.text)
	}
	for i, st := range wantStatus {
		r := a.results[i]
		if r.Status != st || (st == 503 && r.Reason != "not attempted: an earlier element failed") || (st == 500 && r.Reason != "broker unavailable") {
			t.Fatalf("element %d: %+v, want status %d", i, r, st)
		}
	}
	// The answer came after every write was made: the counters are final.
	if n := h.n.m.out.Counts().Writes - writes; n != 2 {
		t.Fatalf("%d lines written to the broker for the batch, want 2 (job-s1, job-s2)", n)
	}
	if n := h.n.m.out.Counts().Failures; n != 1 {
		t.Fatalf("%d failed broker writes, want 1", n)
	}
	testkit.Eventually(t, "job-s1 and job-s2 at the broker", func() bool {
		return strings.Join(netRelayed(h), " ") == "upsert:job-s1 upsert:job-s2"
	})
	if !h.n.logs.Contains("level=ERROR", "broker write failed", "status=500") ||
		!h.n.logs.Contains("level=WARN", "peer batch elements rejected", "rejected=1", "notAttempted=4", "firstIndex=1") {
		t.Fatalf("want the failed write at error and one batch summary; logs:\n%s", h.n.logs)
	}
}

// The stop does not rest on the broker writer refusing everything after a
// failure: no element after a 5xx is handed to the per-frame handler at
// all.
func TestRunPeerBatchHandsNothingOnAfterAFailure(t *testing.T) {
	var handled []string
	handle := func(b []byte) (int, string) {
		handled = append(handled, string(b))
		switch string(b) {
		case "fail":
			return 500, "broker unavailable"
		case "bad":
			return 400, strings.Repeat("x", 2*httpguard.MaxReasonBytes)
		}
		return 200, ""
	}
	elems := [][]byte{[]byte("a"), []byte("bad"), []byte(" \t"), []byte("fail"), []byte("b"), []byte("")}
	results := peerwire.RunBatch(elems, handle)
	if strings.Join(handled, ",") != "a,bad,fail" {
		t.Fatalf("handled %q, want a, bad, fail", handled)
	}
	want := []int{200, 400, 400, 500, 503, 503}
	for i, r := range results {
		if r.Status != want[i] {
			t.Fatalf("element %d: %+v, want %d", i, r, want[i])
		}
	}
	if results[1].Reason != httpguard.ClipReason(strings.Repeat("x", 2*httpguard.MaxReasonBytes)) || results[2].Reason != "empty element" {
		t.Fatalf("reasons %q, %q: want the first clipped, the second \"empty element\"", results[1].Reason, results[2].Reason)
	}
}

func TestADuplicateInsideOneBatchIsAnsweredAlreadySeenAndWrittenOnce(t *testing.T) {
	h := newNetPeerHarness(t)
	origin := h.client.Principal
	life := testframe.Lifecycle(testframe.Workload("job-dup", "running", origin), nil)
	resync := testframe.Lifecycle(testframe.Workload("job-resync", "running", origin), map[string]any{"resync": true})
	removal := testframe.Removal("job-gone", origin)
	a := netPostBatch(t, h.c, h.addr, life, life, resync, resync, removal, removal)
	want := []peerwire.BatchResult{{Status: 200, Reason: ""}, {Status: 200, Reason: "already seen"}, {Status: 200, Reason: ""}, {Status: 200, Reason: ""}, {Status: 200, Reason: ""}, {Status: 200, Reason: "already seen"}}
	if a.status != http.StatusOK || !slices.Equal(a.results, want) {
		t.Fatalf("batch = %d %+v, want 200 %+v", a.status, a.results, want)
	}
	h.barrier(t)
	if got := netRelayed(h); strings.Join(got, " ") != "upsert:job-dup upsert:job-resync upsert:job-resync remove:job-gone" {
		t.Fatalf("relayed to the broker: %v", got)
	}
}

// A batch over its bounds is refused whole, before any element is looked
// at; so is an empty one.
func TestABatchOverItsBoundsIsAnswered413AndNothingIsWritten(t *testing.T) {
	h := newNetPeerHarness(t)
	origin := h.client.Principal
	frame := func(id string) []byte { return testframe.Lifecycle(testframe.Workload(id, "running", origin), nil) }
	// Two valid elements, the second padded with trailing spaces (JSON
	// whitespace) so that the body, newline included, has size bytes.
	sized := func(prefix string, size int) []byte {
		first := append(frame(prefix+"-1"), '\n')
		second := frame(prefix + "-2")
		pad := size - len(first) - len(second) - 1
		return append(append(append(first, second...), bytes.Repeat([]byte(" "), pad)...), '\n')
	}
	many := func(prefix string, n int) []byte {
		var b []byte
		for i := range n {
			b = append(append(b, frame(prefix+itoa(i))...), '\n')
		}
		return b
	}
	cases := []struct {
		name    string
		body    []byte
		chunked bool
		status  int
		reason  string
	}{
		{"over the byte bound", sized("job-over", peerwire.BatchMaxBytes+1), false, 413, "batch body larger than 1048576 bytes\n"},
		{"over the byte bound, chunked", sized("job-chunked", peerwire.BatchMaxBytes+1), true, 413, "batch body larger than 1048576 bytes\n"},
		{"over the frame bound", many("job-many", peerwire.BatchMaxFrames+1), false, 413, "batch of more than 256 frames\n"},
		{"over the frame bound in empty lines", append(frame("job-blank"), bytes.Repeat([]byte("\n"), peerwire.BatchMaxFrames+1)...), false, 413, "batch of more than 256 frames\n"},
		{"empty", nil, false, 400, "empty batch\n"},
		{"at the byte bound", sized("job-at", peerwire.BatchMaxBytes), false, 200, ""},
		{"at the frame bound", many("job-all", peerwire.BatchMaxFrames), false, 200, ""},
	}
	for _, c := range cases {
		a := netSendBody(t, h.c, h.addr, peerwire.BatchContentType, c.body, c.chunked)
		if a.status != c.status || (c.status != 200 && a.text != c.reason) {
			t.Fatalf("%s: %d %.200q, want %d %q", c.name, a.status, a.text, c.status, c.reason)
		}
		if c.status == 200 {
			for i, r := range a.results {
				if r.Status != 200 {
					t.Fatalf("%s: element %d = %+v", c.name, i, r)
				}
			}
		}
	}
	h.barrier(t)
	ids := netUpsertIDs(h.n)
	for id := range ids {
		if strings.HasPrefix(id, "job-over") || strings.HasPrefix(id, "job-chunked") || strings.HasPrefix(id, "job-many") || id == "job-blank" {
			t.Fatalf("%s, from a batch refused whole, reached the broker", id)
		}
	}
	if ids["job-at-1"] != 1 || ids["job-at-2"] != 1 || ids["job-all0"] != 1 || ids["job-all"+itoa(peerwire.BatchMaxFrames-1)] != 1 {
		t.Fatalf("the batches at the bounds were not written: %v", ids)
	}
}

func TestABatchFromAClientWithoutItsPinnedCertificateIsAnswered403(t *testing.T) {
	h := newNetPeerHarness(t)
	unpinned := testkit.Mint(t, devpki.NewUUID())
	impostor := testkit.Mint(t, h.client.Principal)
	for name, c := range map[string]*http.Client{
		"no certificate":        testkit.PeerClient(t, nil, h.n.ident.DER),
		"unpinned certificate":  testkit.PeerClient(t, &unpinned, h.n.ident.DER),
		"another pinned UUID's": testkit.PeerClient(t, &impostor, h.n.ident.DER),
	} {
		a := netPostBatch(t, c, h.addr,
			testframe.Lifecycle(testframe.Workload("job-intruder", "running", h.client.Principal), nil),
			testframe.Removal("job-intruder", h.client.Principal))
		if a.status != http.StatusForbidden || a.results != nil {
			t.Fatalf("%s: batch = %d %q, want a plain 403", name, a.status, a.text)
		}
	}
	h.barrier(t)
	if ids := netUpsertIDs(h.n); ids["job-intruder"] != 0 || len(h.n.broker.WithMethod(wireframe.MethodRemove)) != 0 {
		t.Fatalf("a refused batch reached the broker: %v", h.n.broker.All())
	}
}

func TestParseBatchAdvert(t *testing.T) {
	cases := []struct {
		h             string
		frames, bytes int
		ok            bool
	}{
		{"max-frames=256, max-bytes=1048576", 256, 1048576, true},
		{peerwire.FormatBatchAdvert(7, 9), 7, 9, true},
		{"max-bytes=1048576,max-frames=256", 256, 1048576, true},
		{" \tmax-frames = 16 ,\tmax-bytes= 4096\t ", 16, 4096, true},
		{"Max-Frames=16, MAX-BYTES=4096", 16, 4096, true},
		{"max-frames=16, codec=zstd, max-bytes=4096, future", 16, 4096, true},
		{"max-frames=16,, max-bytes=4096,", 16, 4096, true},
		{"", 0, 0, false},
		{"max-frames=16", 0, 0, false},
		{"max-bytes=4096", 0, 0, false},
		{"max-frames=0, max-bytes=4096", 0, 0, false},
		{"max-frames=-1, max-bytes=4096", 0, 0, false},
		{"max-frames=+16, max-bytes=4096", 0, 0, false},
		{"max-frames=16, max-bytes=", 0, 0, false},
		{"max-frames=16, max-bytes", 0, 0, false},
		{"max-frames=16, max-bytes=4k", 0, 0, false},
		{"max-frames=1 6, max-bytes=4096", 0, 0, false},
		{`max-frames="16", max-bytes=4096`, 0, 0, false},
		{"max-frames=16, max-bytes=99999999999999999999999", 0, 0, false},
		{"max-frames=16, max-frames=32, max-bytes=4096", 0, 0, false},
		{"max-frames=16; max-bytes=4096", 0, 0, false},
	}
	for _, c := range cases {
		frames, bytes, ok := peerwire.ParseBatchAdvert(c.h)
		if frames != c.frames || bytes != c.bytes || ok != c.ok {
			t.Errorf("peerwire.ParseBatchAdvert(%q) = %d, %d, %v; want %d, %d, %v", c.h, frames, bytes, ok, c.frames, c.bytes, c.ok)
		}
	}
}

// ---- helpers (net helper) ----

// netAnswer is an answer of the peer port; results is the decoded batch
// answer when it is one.
type netAnswer struct {
	status  int
	header  http.Header
	text    string
	results []peerwire.BatchResult
}

// netSend sends one request to the peer port and reads its answer.
func netSend(t testing.TB, c *http.Client, addr, method, path, contentType string, body []byte) netAnswer {
	t.Helper()
	return netDo(t, c, addr, method, path, contentType, body, false)
}

// netSendBody posts body to the peer endpoint, chunked (no declared
// length) when asked.
func netSendBody(t testing.TB, c *http.Client, addr, contentType string, body []byte, chunked bool) netAnswer {
	t.Helper()
	return netDo(t, c, addr, http.MethodPost, wireframe.EventsPath, contentType, body, chunked)
}

func netDo(t testing.TB, c *http.Client, addr, method, path, contentType string, body []byte, chunked bool) netAnswer {
	t.Helper()
	req, err := http.NewRequest(method, "https://"+addr+path, bytes.NewReader(body))
	testkit.Must(t, err)
	if chunked {
		req.ContentLength = -1
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	testkit.Must(t, err)
	a := netAnswer{status: resp.StatusCode, header: resp.Header, text: string(text)}
	if resp.StatusCode == http.StatusOK && resp.Header.Get("Content-Type") == "application/json" {
		var ans peerwire.BatchAnswer
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ans); err != nil {
			t.Fatalf("batch answer %q: %v", text, err)
		}
		a.results = ans.Results
	}
	return a
}

// netPostBatch posts elems as one batch, each on its own line.
func netPostBatch(t testing.TB, c *http.Client, addr string, elems ...[]byte) netAnswer {
	t.Helper()
	var body []byte
	for _, e := range elems {
		body = append(append(body, e...), '\n')
	}
	return netSend(t, c, addr, http.MethodPost, wireframe.EventsPath, peerwire.BatchContentType, body)
}

// netRelayed lists what h's broker got from peers, in order, as
// "upsert:<id>" and "remove:<id>", leaving out the harness's barriers.
func netRelayed(h *netPeerHarness) []string {
	var out []string
	for _, f := range h.n.broker.All() {
		switch f.Method {
		case wireframe.MethodUpsert:
			var p struct{ WorkloadInfo struct{ ID string } }
			if json.Unmarshal(f.Params, &p) == nil && !strings.HasPrefix(p.WorkloadInfo.ID, "barrier-") {
				out = append(out, "upsert:"+p.WorkloadInfo.ID)
			}
		case wireframe.MethodRemove:
			var p struct{ WorkloadID string }
			if json.Unmarshal(f.Params, &p) == nil {
				out = append(out, "remove:"+p.WorkloadID)
			}
		}
	}
	return out
}

// netFailOn makes the node's broker channel fail the first write of a line
// containing marker, as a closed pipe would.
func netFailOn(marker string) nodeOption {
	return func(c *Config) { c.Out = &netMarkerFailingWriter{w: c.Out, marker: []byte(marker)} }
}

type netMarkerFailingWriter struct {
	w      io.Writer
	marker []byte
}

func (f *netMarkerFailingWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, f.marker) {
		return 0, errors.New("broker pipe closed")
	}
	return f.w.Write(p)
}

// The advert is set straight into the header map, so its name must be in
// the canonical form net/http looks names up by.
func TestPeerBatchHeaderNameIsCanonical(t *testing.T) {
	if c := http.CanonicalHeaderKey(peerwire.BatchHeader); c != peerwire.BatchHeader {
		t.Fatalf("%q is not canonical: %q", peerwire.BatchHeader, c)
	}
}
