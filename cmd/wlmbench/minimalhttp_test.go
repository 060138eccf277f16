package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func startMinimalForTest(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serveMinimal(ln)
	return ln.Addr().String()
}

// The minimal server answers a net/http client's posts over one keep-alive
// connection, as the ceilings do.
func TestTheMinimalServerAnswersKeepAlivePosts(t *testing.T) {
	addr := startMinimalForTest(t)
	conns := 0
	tr := &http.Transport{DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		conns++
		return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, a)
	}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	for i := 0; i < 3; i++ {
		resp, err := client.Post("http://"+addr+ingressPath, "application/json", strings.NewReader(`{"jsonrpc":"2.0"}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != "ok\n" {
			t.Fatalf("post %d: %d %q", i, resp.StatusCode, b)
		}
	}
	if conns != 1 {
		t.Fatalf("%d connections for 3 posts, want 1 (keep-alive)", conns)
	}
}

// What it does not parse (a chunked body, a request that is not a POST)
// gets a 400 and the connection's end, never a hang.
func TestTheMinimalServerRefusesWhatItDoesNotParse(t *testing.T) {
	addr := startMinimalForTest(t)
	for _, req := range []string{
		"POST /v1/workloads/events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/workloads/events HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 400 ") {
			t.Fatalf("%q: got %q, %v; want a 400", req, line, err)
		}
	}
}
