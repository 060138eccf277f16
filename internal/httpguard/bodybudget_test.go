package httpguard

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRequestBodiesOverTheBudgetWaitBrieflyThenGet503WithRetryAfter(t *testing.T) {
	b := newBodyBudget("test", 100, 0)
	hold := make(chan struct{})
	entered := make(chan struct{}, 4)
	srv := httptest.NewServer(budgetHandler(b, 100, func(r *http.Request) {
		entered <- struct{}{}
		if r.URL.Path == "/hold" {
			<-hold
		}
	}))
	var once sync.Once
	unhold := func() { once.Do(func() { close(hold) }) }
	defer srv.Close()
	defer unhold() // before the server closes: it waits for the held request
	post := func(path string, size int) *http.Response {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(strings.Repeat("x", size)))
		netMust(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	held := make(chan *http.Response, 1)
	go func() { held <- post("/hold", 80) }()
	<-entered
	if got := b.inUse(); got != 80 {
		t.Fatalf("%d bytes reserved for an 80-byte body in progress, want 80", got)
	}
	resp := post("/", 80)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a body with no room = %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp := post("/", 20); resp.StatusCode != http.StatusOK {
		t.Fatalf("a body that fits beside the one in progress = %d, want 200", resp.StatusCode)
	}
	unhold()
	if resp := <-held; resp.StatusCode != http.StatusOK {
		t.Fatalf("the held request = %d", resp.StatusCode)
	}
	if resp := post("/", 80); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the room was given back = %d, want 200", resp.StatusCode)
	}
	if got := b.inUse(); got != 0 {
		t.Fatalf("%d bytes still reserved with no request in progress", got)
	}
	if got := b.refused.Load(); got != 1 {
		t.Fatalf("refused = %d, want 1", got)
	}
}

func TestAChunkedBodyReservesTheWholeCap(t *testing.T) {
	b := newBodyBudget("test", 150, 0)
	var during int64
	srv := httptest.NewServer(budgetHandler(b, 100, func(*http.Request) { during = b.inUse() }))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(strings.NewReader("abc"))) // no length: chunked
	netMust(t, err)
	resp, err := http.DefaultClient.Do(req)
	netMust(t, err)
	resp.Body.Close()
	if during != 100 {
		t.Fatalf("a chunked body reserved %d bytes, want the cap, 100", during)
	}
}

// TestABodyWaitingForRoomIsWokenWhenBytesAreGivenBack: a request waiting
// for room gets it as soon as another gives its bytes back, not at the end
// of its wait.
func TestABodyWaitingForRoomIsWokenWhenBytesAreGivenBack(t *testing.T) {
	b := newBodyBudget("test", 100, 0)
	if !b.acquire(100, time.Millisecond, context.Background()) {
		t.Fatal("an empty budget had no room")
	}
	got := make(chan bool, 1)
	go func() { got <- b.acquire(50, time.Hour, context.Background()) }()
	eventually(t, "the second request waiting for room", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.waiting == 1
	})
	b.release(100)
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("the waiting request was refused although room was given back")
		}
	case <-time.After(waitTimeout):
		t.Fatal("the waiting request was not woken when room was given back")
	}
	if b.inUse() != 50 {
		t.Fatalf("%d bytes in use, want 50", b.inUse())
	}
}

// TestABodyWaitingForRoomStopsWhenItsClientIsGone: a request waiting for
// room whose context ends (its client went away) gives up at once, not at
// the end of its wait, and takes no room.
func TestABodyWaitingForRoomStopsWhenItsClientIsGone(t *testing.T) {
	b := newBodyBudget("test", 100, 0)
	if !b.acquire(100, time.Millisecond, context.Background()) {
		t.Fatal("an empty budget had no room")
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan bool, 1)
	go func() { got <- b.acquire(50, time.Hour, ctx) }()
	eventually(t, "the second request waiting for room", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.waiting == 1
	})
	cancel()
	select {
	case ok := <-got:
		if ok {
			t.Fatal("a request whose client is gone was given room")
		}
	case <-time.After(waitTimeout):
		t.Fatal("the waiting request did not give up when its client went away")
	}
	if b.inUse() != 100 {
		t.Fatalf("%d bytes in use, want 100", b.inUse())
	}
}

// budgetHandler reads each request's body through b, calls then with the
// body's room still held, and answers as the daemon's handlers do.
func budgetHandler(b *BodyBudget, limit int64, then func(*http.Request)) http.Handler {
	return HTTP1Answers(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, hold, err := b.ReadBody(w, r, limit)
		if err != nil {
			status, reason := BodyRefusal(w, err)
			Answer(w, status, reason)
			return
		}
		defer hold.Release()
		then(r)
		Answer(w, http.StatusOK, "ok")
	}))
}

// A client that declares a body and never sends it gives its room back at
// the body deadline with a 408, long before the server's read timeout.
func TestABodyDeclaredAndNotSentGivesItsRoomBackAtTheBodyDeadline(t *testing.T) {
	b := newBodyBudget("test", 1000, 0)
	srv := httptest.NewServer(budgetHandler(b, 1000, func(*http.Request) {}))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	netMust(t, err)
	defer c.Close()
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n{")
	eventually(t, "the body's room reserved", func() bool { return b.inUse() == 900 })
	c.SetReadDeadline(time.Now().Add(bodyReadTimeout + waitTimeout))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	netMust(t, err)
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
		t.Fatalf("a body never sent got %d (close %v), want 408 and the connection closed", resp.StatusCode, resp.Close)
	}
	if b.inUse() != 0 || b.timedOut.Load() != 1 {
		t.Fatalf("after the 408: %d bytes reserved, %d timeouts counted; want 0 and 1", b.inUse(), b.timedOut.Load())
	}
}

// One channel's budget full leaves the other's untouched.
func TestEachChannelHasABodyBudgetOfItsOwn(t *testing.T) {
	bs := NewRequestBodies()
	if !bs.Ingress.acquire(bs.Ingress.capacity, time.Millisecond, context.Background()) {
		t.Fatal("an empty ingress budget had no room")
	}
	if !bs.Peer.acquire(1<<20, time.Millisecond, context.Background()) {
		t.Fatal("the peer port had no room while only the ingress's budget was full")
	}
}

// A source at its bound of unfinished bodies has its oldest cut off for the
// newest, so a producer sharing 127.0.0.1 with a client that never finishes
// its bodies is still served.
func TestASourceAtItsBoundOfUnfinishedBodiesLosesItsOldestForTheNewest(t *testing.T) {
	const perSource = 4
	b := newBodyBudget("ingress", 1<<20, perSource)
	srv := httptest.NewServer(budgetHandler(b, 1000, func(*http.Request) {}))
	defer srv.Close()
	var stalled []*bufio.Reader
	for i := range perSource {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		netMust(t, err)
		defer c.Close()
		io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n{")
		c.SetReadDeadline(time.Now().Add(waitTimeout))
		stalled = append(stalled, bufio.NewReader(c))
		eventually(t, "unfinished body "+strconv.Itoa(i+1), func() bool { return b.unfinished.count() == i+1 })
	}
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader("{}"))
	netMust(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a finished body from a source at its bound got %d, want 200", resp.StatusCode)
	}
	old, err := http.ReadResponse(stalled[0], nil)
	netMust(t, err)
	if old.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("the source's oldest unfinished body got %d, want 408", old.StatusCode)
	}
	if got := b.unfinished.cut.Load(); got != 1 {
		t.Fatalf("%d bodies cut for room, want 1", got)
	}
	if got := b.unfinished.count(); got != perSource-1 {
		t.Fatalf("%d unfinished bodies, want the %d left stalled", got, perSource-1)
	}
}

// TestUnfinishedBodiesForgetTheSourcesWithNoneInFlight: the per-source
// queues are bounded by the bodies being read, not by the sources ever
// seen: a source's queue goes when its last body leaves or is cut.
func TestUnfinishedBodiesForgetTheSourcesWithNoneInFlight(t *testing.T) {
	u := newUnfinishedBodies(2)
	for i := range 1000 {
		addr := net.JoinHostPort("127.0.0."+strconv.Itoa(i%250+1), strconv.Itoa(40000+i))
		a, b, c := u.enter(addr, nil), u.enter(addr, nil), u.enter(addr, nil) // c cuts a
		for _, x := range []*unfinishedBody{b, c} {
			if u.leave(x) {
				t.Fatal("a body within the bound was reported cut")
			}
		}
		if !u.leave(a) {
			t.Fatal("the oldest body over the bound was not reported cut")
		}
	}
	if len(u.bySource) != 0 || u.count() != 0 {
		t.Fatalf("%d sources and %d bodies kept after every body left", len(u.bySource), u.count())
	}
}
