package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRequestBodiesOverTheBudgetWaitBrieflyThenGet503WithRetryAfter(t *testing.T) {
	b := newBodyBudget(100)
	hold := make(chan struct{})
	entered := make(chan struct{}, 4)
	srv := httptest.NewServer(b.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		entered <- struct{}{}
		if r.URL.Path == "/hold" {
			<-hold
		}
		io.WriteString(w, "ok")
	}), 100))
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
	b := newBodyBudget(150)
	var during int64
	srv := httptest.NewServer(b.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		during = b.inUse()
		io.ReadAll(r.Body)
	}), 100))
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
	b := newBodyBudget(100)
	if !b.acquire(100, time.Millisecond, nil) {
		t.Fatal("an empty budget had no room")
	}
	got := make(chan bool, 1)
	go func() { got <- b.acquire(50, time.Hour, nil) }()
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
