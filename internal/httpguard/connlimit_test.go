package httpguard

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// limitedServer is a plaintext HTTP server behind a ConnLimiter whose
// handler holds each request until release is closed, so a test controls
// which connections have a request in progress.
type limitedServer struct {
	lim      *ConnLimiter
	addr     string
	release  chan struct{}
	inFlight sync.WaitGroup
}

func startLimitedServer(t *testing.T, max, perSource int, firstRequest time.Duration) *limitedServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	netMust(t, err)
	s := &limitedServer{lim: newConnLimiter("test", max, perSource), addr: ln.Addr().String(), release: make(chan struct{})}
	s.lim.FirstRequest = firstRequest
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				<-s.release
			}
			io.WriteString(w, "ok\n")
		}),
		ConnState: s.lim.ConnState,
		ErrorLog:  netDiscardLog(),
	}
	go srv.Serve(s.lim.Listen(ln))
	t.Cleanup(func() {
		select {
		case <-s.release:
		default:
			close(s.release)
		}
		srv.Close()
	})
	return s
}

// rawConn dials the server from local (nil: the default source address).
func (s *limitedServer) rawConn(t *testing.T, local net.Addr) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: local, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", s.addr)
	netMust(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends one GET on c and returns the status line, or the read error.
func get(c net.Conn, path string) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// closedByServer reports whether the server closed c, waiting up to the
// deadline for the close to arrive.
func closedByServer(c net.Conn, within time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(within))
	_, err := c.Read(make([]byte, 1))
	return err == io.EOF || (err != nil && !isTimeout(err))
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestConnectionOverTheCapIsClosedAtOnceWhenEveryConnectionIsBusy(t *testing.T) {
	s := startLimitedServer(t, 3, 0, time.Minute)
	for range 3 {
		c := s.rawConn(t, nil)
		go get(c, "/hold")
	}
	eventually(t, "three requests in progress", func() bool {
		s.lim.mu.Lock()
		defer s.lim.mu.Unlock()
		return s.lim.open == 3 && s.lim.waiting.Len() == 0
	})
	extra := s.rawConn(t, nil)
	if !closedByServer(extra, 2*time.Second) {
		t.Fatal("the connection over the cap was not closed")
	}
	if got := s.lim.refusedFull.Load(); got != 1 {
		t.Fatalf("refused (full) = %d, want 1", got)
	}
	if n := s.lim.OpenConns(); n != 3 {
		t.Fatalf("%d connections open, want the cap, 3", n)
	}
}

func TestAtTheCapTheLongestWaitingIdleConnectionMakesRoomForANewClient(t *testing.T) {
	// A flood of connections that send nothing fills the listener: a real
	// client still gets its answer, and the oldest of the flood goes.
	s := startLimitedServer(t, 4, 0, time.Minute)
	var flood []net.Conn
	for range 4 {
		flood = append(flood, s.rawConn(t, nil))
	}
	eventually(t, "the flood admitted", func() bool { return s.lim.OpenConns() == 4 })
	status, err := get(s.rawConn(t, nil), "/")
	if err != nil || status != "HTTP/1.1 200 OK" {
		t.Fatalf("the client at the cap got %q, %v; want 200", status, err)
	}
	if !closedByServer(flood[0], 2*time.Second) {
		t.Fatal("the longest-waiting connection of the flood was not closed for room")
	}
	if got := s.lim.evicted.Load(); got != 1 {
		t.Fatalf("closed for room = %d, want 1", got)
	}
	if n := s.lim.OpenConns(); n > 4 {
		t.Fatalf("%d connections open, over the cap of 4", n)
	}
}

// Room is taken from the source that holds the most connections, oldest
// first: a source with one waiting connection keeps it while a flood from
// another source holds more, however recent the flood's connections are.
func TestAtTheCapRoomIsTakenFromTheSourceHoldingTheMostConnections(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs a second loopback address (127.0.0.2), which only Linux routes by default")
	}
	s := startLimitedServer(t, 4, 0, time.Minute)
	peer := s.rawConn(t, nil) // the oldest, from 127.0.0.1
	eventually(t, "the peer's connection admitted", func() bool { return s.lim.OpenConns() == 1 })
	flooder := &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}
	var flood []net.Conn
	for range 3 {
		flood = append(flood, s.rawConn(t, flooder))
	}
	eventually(t, "the flood admitted", func() bool { return s.lim.OpenConns() == 4 })
	for i := range 3 {
		s.rawConn(t, flooder) // at the cap: each closes one of the flood's
		if !closedByServer(flood[i], 2*time.Second) {
			t.Fatalf("new connection %d from the flooding source did not close the flood's oldest", i+1)
		}
	}
	if status, err := get(peer, "/"); err != nil || status != "HTTP/1.1 200 OK" {
		t.Fatalf("the one connection of the other source got %q, %v; want it kept and answered", status, err)
	}
}

func TestOneSourceIsCappedAndOtherSourcesAreNot(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs a second loopback address (127.0.0.2), which only Linux routes by default")
	}
	s := startLimitedServer(t, 10, 2, time.Minute)
	s.rawConn(t, nil)
	s.rawConn(t, nil)
	eventually(t, "two connections from 127.0.0.1", func() bool { return s.lim.OpenConns() == 2 })
	if !closedByServer(s.rawConn(t, nil), 2*time.Second) {
		t.Fatal("a third connection from one source was not closed")
	}
	if got := s.lim.refusedSource.Load(); got != 1 {
		t.Fatalf("refused (per source) = %d, want 1", got)
	}
	other := &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}
	if status, err := get(s.rawConn(t, other), "/"); err != nil || status != "HTTP/1.1 200 OK" {
		t.Fatalf("another source got %q, %v; want 200", status, err)
	}
}

func TestAConnectionThatStartsNoRequestIsClosedAtTheFirstRequestDeadline(t *testing.T) {
	s := startLimitedServer(t, 10, 0, 200*time.Millisecond)
	silent := s.rawConn(t, nil)
	busy := s.rawConn(t, nil)
	if status, err := get(busy, "/"); err != nil || status != "HTTP/1.1 200 OK" {
		t.Fatalf("GET = %q, %v", status, err)
	}
	if !closedByServer(silent, 3*time.Second) {
		t.Fatal("a connection that sent nothing was kept past its first-request deadline")
	}
	if got := s.lim.unstarted.Load(); got != 1 {
		t.Fatalf("unstarted = %d, want 1 (the busy connection started its request in time)", got)
	}
	eventually(t, "the silent connection's slot given back", func() bool { return s.lim.OpenConns() == 1 })
}

func TestConnectionSlotsAreGivenBackWhenConnectionsClose(t *testing.T) {
	s := startLimitedServer(t, 2, 0, time.Minute)
	for range 20 {
		c := s.rawConn(t, nil)
		if status, err := get(c, "/"); err != nil || status != "HTTP/1.1 200 OK" {
			t.Fatalf("GET = %q, %v", status, err)
		}
		c.Close()
		eventually(t, "the slot given back", func() bool { return s.lim.OpenConns() == 0 })
	}
	if got := s.lim.refusedFull.Load() + s.lim.evicted.Load(); got != 0 {
		t.Fatalf("%d connections refused or closed for room, want none: each closed before the next", got)
	}
}

// Every peer of a cluster on one machine connects from one address: the
// members discovered behind it may each hold the per-source cap, while a
// source that fronts no member is held to the flag, and so is a flood
// past the members' share.
func TestPinnedMembersBehindOneSourceAllConnectAndAFloodIsStillCapped(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs a second loopback address (127.0.0.2), which only Linux routes by default")
	}
	var logged strings.Builder
	var logMu sync.Mutex
	s := startLimitedServer(t, 100, 2, time.Minute)
	s.lim.logTo(slog.New(slog.NewTextHandler(&lockedWriter{mu: &logMu, w: &logged}, nil)))
	s.lim.SetSourceMembers(map[string]int{"127.0.0.1": 3})
	for range 6 { // three members, two connections each
		s.rawConn(t, nil)
	}
	eventually(t, "six connections from the three members' address", func() bool { return s.lim.OpenConns() == 6 })
	if got := s.lim.refusedSource.Load(); got != 0 {
		t.Fatalf("refused (per source) = %d for three members' connections, want 0", got)
	}
	if !closedByServer(s.rawConn(t, nil), 2*time.Second) {
		t.Fatal("a seventh connection from three members' address (cap 2 each) was not closed")
	}
	unknown := &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}
	s.rawConn(t, unknown)
	s.rawConn(t, unknown)
	eventually(t, "two connections from an address with no member", func() bool { return s.lim.OpenConns() == 8 })
	for range 2 {
		if !closedByServer(s.rawConn(t, unknown), 2*time.Second) {
			t.Fatal("a third connection from an address with no member was not closed")
		}
	}
	if got := s.lim.refusedSource.Load(); got != 3 {
		t.Fatalf("refused (per source) = %d, want 3", got)
	}
	if got := s.lim.maxSourceCap(); got != 6 {
		t.Fatalf("highest per-source cap %d, want 6", got)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if n := strings.Count(logged.String(), "connection refused over its source's cap"); n != 2 {
		t.Fatalf("%d refusal lines for 3 refusals from 2 sources, want one per source:\n%s", n, logged.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
