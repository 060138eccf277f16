package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ingressPath is the daemon's ingress endpoint; the ceiling serves the same.
const ingressPath = "/v1/workloads/events"

// bodyFunc returns the request body for a producer's n-th frame.
type bodyFunc func(buf []byte, worker, n int) []byte

// loadResult is what one load run measured.
type loadResult struct {
	ok, failed int64
	elapsed    time.Duration
	lats       latencySummary
	firstError string
}

func (r loadResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ok) / r.elapsed.Seconds()
}

// producerClient is a keep-alive HTTP client with at most c connections.
func producerClient(c int) (*http.Client, func()) {
	tr := &http.Transport{
		MaxIdleConns:        c,
		MaxIdleConnsPerHost: c,
		MaxConnsPerHost:     c,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, tr.CloseIdleConnections
}

// post sends one frame and reports whether it was accepted (200).
func post(client *http.Client, url string, body []byte) (bool, string) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return false, err.Error()
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return true, ""
}

// closedLoop runs c producers, each posting its next frame as soon as the
// previous one is answered, for d.
func closedLoop(client *http.Client, url string, c int, d time.Duration, body bodyFunc) loadResult {
	return closedLoopEach(slices.Repeat([]*http.Client{client}, c), url, d, body)
}

// closedLoopEach is closedLoop with one producer per client: the inbound
// section's peers each post over a client of their own, with their own
// certificate.
func closedLoopEach(clients []*http.Client, url string, d time.Duration, body bodyFunc) loadResult {
	var (
		ok, failed atomic.Int64
		errOnce    sync.Once
		firstErr   string
		wg         sync.WaitGroup
	)
	lats := make([][]time.Duration, len(clients))
	start := time.Now()
	stopAt := start.Add(d)
	for w, client := range clients {
		wg.Go(func() {
			var buf []byte
			for n := 0; time.Now().Before(stopAt); n++ {
				buf = body(buf[:0], w, n)
				t0 := time.Now()
				accepted, why := post(client, url, buf)
				lat := time.Since(t0)
				if !accepted {
					failed.Add(1)
					errOnce.Do(func() { firstErr = why })
					continue
				}
				ok.Add(1)
				lats[w] = append(lats[w], lat)
			}
		})
	}
	wg.Wait()
	return loadResult{ok: ok.Load(), failed: failed.Load(), elapsed: time.Since(start),
		lats: summarize(flatten(lats)), firstError: firstErr}
}

// openLoop posts at a fixed rate for d, from a pool of c producers, and
// measures each frame's latency from the moment it was scheduled, so a
// stall shows up in the figures instead of slowing the schedule (no
// coordinated omission).
func openLoop(client *http.Client, url string, c int, rate float64, d time.Duration, body bodyFunc) loadResult {
	total := int(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	var (
		next       atomic.Int64
		ok, failed atomic.Int64
		errOnce    sync.Once
		firstErr   string
		wg         sync.WaitGroup
	)
	lats := make([][]time.Duration, c)
	start := time.Now()
	for w := range c {
		wg.Go(func() {
			var buf []byte
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				due := start.Add(time.Duration(i) * interval)
				buf = body(buf[:0], w, i)
				if wait := time.Until(due); wait > 0 {
					time.Sleep(wait)
				}
				accepted, why := post(client, url, buf)
				lat := time.Since(due)
				if !accepted {
					failed.Add(1)
					errOnce.Do(func() { firstErr = why })
					continue
				}
				ok.Add(1)
				lats[w] = append(lats[w], lat)
			}
		})
	}
	wg.Wait()
	return loadResult{ok: ok.Load(), failed: failed.Load(), elapsed: time.Since(start),
		lats: summarize(flatten(lats)), firstError: firstErr}
}

func flatten(parts [][]time.Duration) []time.Duration {
	var n int
	for _, p := range parts {
		n += len(p)
	}
	out := make([]time.Duration, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ingressPool is how many workloads each ingress producer keeps open.
const ingressPool = 8

// lifecycleBody returns the frames of the ingress run: each producer keeps
// its own ingressPool workloads (prefix-worker-k) open and reports them in
// turn with a rising seq, submitted first and then running, so every frame
// is a distinct, valid event and the re-sync set stays at the size a node
// really holds. (Workloads created and finished by the thousand per second
// would instead grow the re-sync set for the whole terminal retention
// window; the memory run covers that.)
func lifecycleBody(prefix string) bodyFunc {
	return func(buf []byte, worker, n int) []byte {
		wl, seq := n%ingressPool, n/ingressPool+1
		if seq == 1 {
			return appendLifecycle(buf, "workload:submitted", "queued", prefix, worker, wl, seq)
		}
		return appendLifecycle(buf, "workload:started", "running", prefix, worker, wl, seq)
	}
}

// appendLifecycle appends a producer's frame shaped like the seed's curl
// example: no originatedFrom (the daemon stamps it).
func appendLifecycle(buf []byte, method, state, prefix string, worker, wl, seq int) []byte {
	buf = append(buf, `{"jsonrpc":"2.0","method":"`...)
	buf = append(buf, method...)
	buf = append(buf, `","params":{"workloadInfo":{"id":"`...)
	buf = appendID(buf, prefix, worker, wl)
	buf = append(buf, `","runId":"`...)
	buf = appendID(buf, prefix, worker, wl)
	buf = append(buf, `","seq":`...)
	buf = strconv.AppendInt(buf, int64(seq), 10)
	buf = append(buf, `,"model":"qwen3.5-9b","engine":"llamacpp","state":"`...)
	buf = append(buf, state...)
	buf = append(buf, `","createdAt":1789661457000,"startedAt":1789661457000,"completedAt":null,"error":null,"requesterId":"wlmbench"}}}`...)
	return buf
}

func appendID(buf []byte, prefix string, worker, wl int) []byte {
	buf = append(buf, prefix...)
	buf = append(buf, '-')
	buf = strconv.AppendInt(buf, int64(worker), 10)
	buf = append(buf, '-')
	return strconv.AppendInt(buf, int64(wl), 10)
}

// appendRemove appends a producer's removal of a workload.
func appendRemove(buf []byte, prefix string, worker, wl int) []byte {
	buf = append(buf, `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"`...)
	buf = appendID(buf, prefix, worker, wl)
	return append(buf, `"}}`...)
}

// ceilingHandler is the best this machine does for the same request: a
// bare net/http handler that reads the body, decodes it into a map with
// encoding/json and answers 200.
func ceilingHandler(w http.ResponseWriter, r *http.Request) {
	if _, ok := ceilingRead(w, r); ok {
		ceilingOK(w)
	}
}

// ceilingRead is the ceilings' read of a frame: the body, decoded into a
// map with encoding/json; a 400 answered, and false, when it is not JSON.
func ceilingRead(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(r.Body)
	var m map[string]any
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, false
	}
	return b, true
}

// ceilingOK is the ceilings' 200.
func ceilingOK(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok\n")
}

// serveCeilingMain is the ceiling server's process (wlmbench
// ceiling-ingress): it serves on a loopback port, prints the address and
// stops at stdin EOF. It runs in a process of its own, like the daemon, so
// the two get the same share of a busy machine and neither shares a
// runtime with the producers.
func serveCeilingMain() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(ceilingHandler)}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println(ln.Addr().String())
	return shutdownAtEOF(os.Stdin, srv)
}

// shutdownAtEOF waits until in ends (the harness closed the ceiling
// process's stdin), then shuts srv down, giving its requests 2 s.
func shutdownAtEOF(in io.Reader, srv *http.Server) error {
	_, _ = io.Copy(io.Discard, in)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return srv.Shutdown(ctx)
}

// ceilingServer is the ceiling server's process, seen from the harness.
type ceilingServer struct {
	*childProc
	addr string
}

func startCeiling() (*ceilingServer, error) { return startCeilingRole("ceiling-ingress") }

// startCeilingRole starts one of the ingress's reference servers, a
// process of the harness's own executable in role, and reads the address
// it prints.
func startCeilingRole(role string) (*ceilingServer, error) {
	p, err := startSelf(role)
	if err != nil {
		return nil, err
	}
	line, err := p.out.ReadString('\n')
	if err != nil {
		p.close()
		return nil, fmt.Errorf("%s server: %w", role, err)
	}
	return &ceilingServer{childProc: p, addr: strings.TrimSpace(line)}, nil
}
