package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
)

// The minimal HTTP/1.1 server (-minimal-http): a reference, not a
// ceiling the daemon is held to. It answers the ingress's frames as the
// bare ceiling does (read the body, decode it into a map, 200 "ok") over
// keep-alive HTTP/1.1 it parses itself: a request line, headers up to
// minimalHeadMax bytes, a Content-Length body, nothing else (no chunked
// bodies, no Expect, no timeouts, no context, no per-request goroutine).
// Side by side with the bare net/http ceiling in one run, the two say what
// net/http's server costs a frame on this machine, which no change inside
// the daemon's handler can take off (issue 39; decision 0059).

// minimalHeadMax bounds a request's line and headers: the producers' heads
// are some 150 bytes.
const minimalHeadMax = 8 << 10

// minimalOK is the whole 200, as the bare ceiling's reads on the wire
// (less its Date header).
var minimalOK = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 3\r\n\r\nok\n")

// minimalBad is the answer to a request the server does not parse; it
// closes the connection after it.
var minimalBad = []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

// serveMinimal accepts connections on ln until it is closed, one goroutine
// each.
func serveMinimal(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go serveMinimalConn(c)
	}
}

var minimalReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}

// serveMinimalConn serves one keep-alive connection until the client
// closes it, asks to, or sends what the server does not parse.
func serveMinimalConn(c net.Conn) {
	defer c.Close()
	br := minimalReaders.Get().(*bufio.Reader)
	br.Reset(c)
	defer func() { br.Reset(nil); minimalReaders.Put(br) }()
	var body []byte
	for {
		n, keep, err := readMinimalHead(br)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			_, _ = c.Write(minimalBad)
			return
		}
		if cap(body) < n {
			body = make([]byte, n)
		}
		body = body[:n]
		if _, err := io.ReadFull(br, body); err != nil {
			return
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			_, _ = c.Write(minimalBad)
			return
		}
		if _, err := c.Write(minimalOK); err != nil || !keep {
			return
		}
	}
}

// readMinimalHead reads a request's line and headers and returns its body's
// length and whether the connection stays open after it; io.EOF when the
// client closed it between requests.
func readMinimalHead(br *bufio.Reader) (n int, keep bool, err error) {
	n, keep = -1, true
	seen := 0
	for first := true; ; first = false {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if first && len(line) == 0 && errors.Is(err, io.EOF) {
				return 0, false, io.EOF
			}
			return 0, false, fmt.Errorf("request head: %w", err)
		}
		if seen += len(line); seen > minimalHeadMax {
			return 0, false, errors.New("request head too large")
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case first:
			if !bytes.HasPrefix(line, []byte("POST ")) || !bytes.HasSuffix(line, []byte(" HTTP/1.1")) {
				return 0, false, errors.New("not an HTTP/1.1 POST")
			}
		case len(line) == 0:
			if n < 0 {
				return 0, false, errors.New("no Content-Length")
			}
			return n, keep, nil
		default:
			name, value, ok := bytes.Cut(line, []byte(":"))
			if !ok {
				return 0, false, errors.New("malformed header")
			}
			value = bytes.TrimSpace(value)
			switch {
			case bytes.EqualFold(name, []byte("Content-Length")):
				if n, err = strconv.Atoi(string(value)); err != nil || n < 0 || n > 1<<20 {
					return 0, false, errors.New("bad Content-Length")
				}
			case bytes.EqualFold(name, []byte("Connection")):
				keep = !bytes.EqualFold(value, []byte("close"))
			case bytes.EqualFold(name, []byte("Transfer-Encoding")):
				return 0, false, errors.New("Transfer-Encoding not served")
			}
		}
	}
}

// serveMinimalMain is the minimal server's process (wlmbench
// ceiling-minimal): it serves on a loopback port, prints the address and
// stops at stdin EOF, as the bare ceiling's process does.
func serveMinimalMain() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go serveMinimal(ln)
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return ln.Close()
}

// startMinimalCeiling starts the minimal server's process.
func startMinimalCeiling() (*ceilingServer, error) {
	return startCeilingRole("ceiling-minimal")
}

// minimalRole is the minimal server's role in the figures.
const minimalRole = "minimal HTTP/1.1 server"

// minimalRows adds a point's rows of the minimal server, when it ran: the
// bare net/http ceiling and this build against it, throughput and CPU per
// frame. all are runFigure's series: this build first, then the bare
// ceiling, then the others by role.
func (b *bench) minimalRows(point string, all []*series) {
	minimal := seriesOf(all, minimalRole)
	if minimal == nil {
		return
	}
	for _, s := range []struct {
		who  string
		this *series
	}{{"bare net/http", all[1]}, {"this build", all[0]}} {
		r := rateRow(fmt.Sprintf("  %s against the %s, at %s", s.who, minimalRole, point), s.this, minimal)
		cr := cpuOverRow(fmt.Sprintf("  %s: CPU per frame over the %s's, at %s (ratio: server/minimal)", s.who, minimalRole, point), s.this, minimal)
		b.tbl.add(r.row)
		b.tbl.add(cr.row)
	}
}
