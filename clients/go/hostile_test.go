package wlmclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The client against a server that is slow, wrong or hostile (issue 33):
// each case says what the client must do, and bounds the time and the
// memory it may take doing it.

// hostileTimeout is the RequestTimeout of the clients these tests make:
// short, so a case that waits for it ends soon, and far from the bounds
// the tests hold the calls to, so a busy machine does not fail them.
const hostileTimeout = 300 * time.Millisecond

// callBound is how long a call may take against a hostile server: its
// RequestTimeout and a wide margin for a loaded machine. A client without
// the overall deadline takes as long as the server keeps it busy, which in
// these tests is until the test ends.
const callBound = 5 * time.Second

// rawServer serves every connection on a loopback port with h, which is
// handed the connection once the request's headers were read, and returns
// its HOST:PORT. At cleanup the listener and every connection close, which
// ends every handler.
func rawServer(t *testing.T, h func(c net.Conn, r *http.Request)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				h(c, r)
			}()
		}
	}()
	return ln.Addr().String()
}

// dribble writes s to c, one piece every 50 ms, until c fails (the client
// hung up, or cleanup closed it).
func dribble(c net.Conn, first, piece string) {
	if _, err := io.WriteString(c, first); err != nil {
		return
	}
	for {
		time.Sleep(50 * time.Millisecond)
		if _, err := io.WriteString(c, piece); err != nil {
			return
		}
	}
}

// timed runs f and fails the test when it takes longer than callBound; it
// returns how long f took.
func timed(t *testing.T, what string, f func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(callBound + 10*time.Second):
		t.Fatalf("%s did not return", what)
	}
	took := time.Since(start)
	if took > callBound {
		t.Fatalf("%s took %s, over %s", what, took, callBound)
	}
	t.Logf("%s returned after %s", what, took.Round(time.Millisecond))
	return took
}

// hostileClient is a client of addr with the short request timeout and one
// try per frame, so a frame's fate is known after one request.
func hostileClient(t *testing.T, addr string) *Client {
	t.Helper()
	return newClient(t, Config{Addr: addr, RequestTimeout: hostileTimeout, MaxAttempts: 1, Workers: 1})
}

// submitAndSettle submits one job against c and waits, within callBound,
// until its frame left the queue; it returns the job.
func submitAndSettle(t *testing.T, c *Client) *Job {
	t.Helper()
	var j *Job
	timed(t, "a frame against a hostile server", func() {
		var err error
		if j, err = c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"}); err != nil {
			t.Error(err)
			return
		}
		for c.Stats().Queued > 0 {
			time.Sleep(5 * time.Millisecond)
		}
	})
	return j
}

func TestHostileSlowHeadersAreCutOffAtTheRequestTimeout(t *testing.T) {
	addr := rawServer(t, func(c net.Conn, _ *http.Request) {
		dribble(c, "HTTP/1.1 200 OK\r\n", "X-Slow: a\r\n")
	})
	c := hostileClient(t, addr)
	var err error
	timed(t, "Node against headers a line at a time", func() { _, err = c.Node(context.Background()) })
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Node: %v, want the request timeout", err)
	}
	j := submitAndSettle(t, c)
	if s := c.Stats(); s.Sent != 0 || s.Dropped != 1 || j.Err() == nil {
		t.Errorf("a frame whose answer's headers never end: %+v, err %v; want not sent, dropped", s, j.Err())
	}
}

func TestHostileSlowBodyIsCutOffAtTheRequestTimeout(t *testing.T) {
	addr := rawServer(t, func(c net.Conn, _ *http.Request) {
		dribble(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", " ")
	})
	c := hostileClient(t, addr)
	var err error
	timed(t, "Node against a body a byte at a time", func() { _, err = c.Node(context.Background()) })
	if err == nil || !strings.Contains(err.Error(), "RequestTimeout") {
		t.Errorf("Node: %v, want the request timeout named", err)
	}
	// A frame answered 200 was taken, however slowly the rest comes: the
	// status is the answer, and the reason is read within the same deadline.
	submitAndSettle(t, c)
	if s := c.Stats(); s.Sent != 1 {
		t.Errorf("a frame answered 200 with a slow body: %+v, want it sent", s)
	}
}

func TestHostileHugeBodyIsReadNoFurtherThanItsBound(t *testing.T) {
	const huge = 64 << 20
	chunk := []byte(strings.Repeat(" ", 64<<10))
	addr := rawServer(t, func(c net.Conn, _ *http.Request) {
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", huge); err != nil {
			return
		}
		for sent := 0; sent < huge; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	// The huge answer must be refused well before it could all arrive, so
	// the deadline here is long: only the bound on what is read ends it.
	c := newClient(t, Config{Addr: addr, RequestTimeout: time.Minute, MaxAttempts: 1, Workers: 1})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var err error
	timed(t, "Node against a 64 MiB answer", func() { _, err = c.Node(context.Background()) })
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "over 4194304 bytes") {
		t.Errorf("Node: %v, want the answer refused as too long", err)
	}
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("Node allocated %d KiB reading a 64 MiB answer", allocated>>10)
	if allocated > 32<<20 {
		t.Errorf("Node allocated %d MiB for a 64 MiB answer; want it bounded by what it reads (4 MiB)", allocated>>20)
	}
	submitAndSettle(t, c)
	if s := c.Stats(); s.Sent != 1 {
		t.Errorf("a frame answered 200 with a huge body: %+v, want it sent", s)
	}
}

// nodeServer answers GET /v1/node with status, Content-Type ctype and body.
func nodeServer(t *testing.T, status int, ctype, body string) string {
	return serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", ctype)
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
}

func TestHostileNodeAnswerThatIsNotTheNodesDocumentIsRefused(t *testing.T) {
	doc := `{"nodeId":"` + testNodeID + `","members":[],"limits":{"bodyMaxBytes":1}}`
	for _, tc := range []struct{ name, ctype, body, want string }{
		{"a page", "text/html", doc, "not application/json"},
		{"no type", "", doc, "not application/json"},
		{"an empty object", "application/json", `{}`, "names no node id"},
		{"a node id that is no UUID", "application/json", `{"nodeId":"x","members":[],"limits":{}}`, "names no node id"},
		{"no members", "application/json", `{"nodeId":"` + testNodeID + `","limits":{}}`, "no members list"},
		{"no limits", "application/json", `{"nodeId":"` + testNodeID + `","members":[]}`, "no limits object"},
		{"not an object", "application/json", `[1]`, "not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := hostileClient(t, nodeServer(t, http.StatusOK, tc.ctype, tc.body))
			n, err := c.Node(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Node: %+v, %v; want an error saying %q", n, err, tc.want)
			}
		})
	}
	c := hostileClient(t, nodeServer(t, http.StatusOK, "application/json; charset=utf-8", doc))
	if n, err := c.Node(context.Background()); err != nil || n.NodeID != testNodeID {
		t.Errorf("the node's own document: %+v, %v", n, err)
	}
}

// redirector answers every request with status and a Location of to.
func redirector(t *testing.T, status int, to string) string {
	return serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, to, status)
	}))
}

// elsewhere is a second server on loopback that counts what reaches it
// and answers as the node would, so a client that followed a redirect to
// it would take the answer.
func elsewhere(t *testing.T) (addr string, hits *atomic.Int64) {
	hits = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"nodeId":"`+testNodeID+`","members":[],"limits":{}}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, hits
}

func TestHostileRedirectsAreAnswersNeverFollowed(t *testing.T) {
	target, hits := elsewhere(t)
	for _, tc := range []struct {
		name   string
		status int
		to     string
	}{
		{"302 on loopback", http.StatusFound, target + "/stolen"},
		{"307 on loopback", http.StatusTemporaryRedirect, target + "/stolen"},
		{"308 on loopback", http.StatusPermanentRedirect, target + "/stolen"},
		// 192.0.2.1 is TEST-NET-1: a client that followed would dial it
		// and wait out its deadline, and the status would not be 307.
		{"307 off loopback", http.StatusTemporaryRedirect, "http://192.0.2.1/v1/workloads/events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := hostileClient(t, redirector(t, tc.status, tc.to))
			j := submitAndSettle(t, c)
			var serr *StatusError
			if !errors.As(j.Err(), &serr) || serr.Status != tc.status || !strings.Contains(serr.Reason, "not followed") {
				t.Errorf("the frame's error: %v; want a StatusError %d naming the redirect not followed", j.Err(), tc.status)
			}
			if s := c.Stats(); s.Sent != 0 || s.Refused != 1 {
				t.Errorf("stats %+v: want the frame refused, not sent", s)
			}
			var err error
			timed(t, "Node answered "+tc.name, func() { _, err = c.Node(context.Background()) })
			if !errors.As(err, &serr) || serr.Status != tc.status {
				t.Errorf("Node: %v; want a StatusError %d", err, tc.status)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the redirects' target got %d requests; want none", n)
	}
}

// A caller's own http.Client, with Go's default redirect policy, is used
// without it: the client never follows a redirect, whoever made its
// http.Client.
func TestHostileRedirectIsNotFollowedWithTheCallersHTTPClient(t *testing.T) {
	target, hits := elsewhere(t)
	c := newClient(t, Config{Addr: redirector(t, http.StatusTemporaryRedirect, target), HTTPClient: &http.Client{},
		RequestTimeout: hostileTimeout, MaxAttempts: 1})
	if _, err := c.Node(context.Background()); err == nil {
		t.Error("Node followed a redirect and took what was there")
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the redirect's target got %d requests; want none", n)
	}
}

func TestHostileConnectionThatNeverAnswersHoldsNoCallPastItsDeadline(t *testing.T) {
	addr := rawServer(t, func(c net.Conn, _ *http.Request) {
		io.Copy(io.Discard, c) // reads on, answers nothing, until cleanup
	})
	c := hostileClient(t, addr)
	var err error
	timed(t, "Node against a silent server", func() { _, err = c.Node(context.Background()) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Node: %v, want the request timeout", err)
	}
	c2 := newClient(t, Config{Addr: addr, RequestTimeout: time.Minute})
	if _, err := c2.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	took := timed(t, "Close with a frame in flight to a silent server", func() { err = c2.Close(ctx) })
	if err == nil || took > 500*time.Millisecond+2*time.Second {
		t.Errorf("Close: %v after %s; want it to give up at its deadline", err, took)
	}
}

// A request that never gets an answer holds the frames behind it no longer
// than its own deadline: the first connection is never answered, every
// later one is, and with one worker both jobs' frames arrive.
func TestHostileStuckRequestHoldsTheFramesBehindItNoLongerThanItsDeadline(t *testing.T) {
	var conns atomic.Int64
	addr := rawServer(t, func(c net.Conn, r *http.Request) {
		if conns.Add(1) == 1 {
			io.Copy(io.Discard, c)
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	})
	c := newClient(t, Config{Addr: addr, RequestTimeout: hostileTimeout, Workers: 1, BackoffMin: 10 * time.Millisecond})
	timed(t, "two jobs behind a stuck request", func() {
		for range 2 {
			if _, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"}); err != nil {
				t.Error(err)
				return
			}
		}
		for c.Stats().Sent < 2 {
			time.Sleep(5 * time.Millisecond)
		}
	})
}
