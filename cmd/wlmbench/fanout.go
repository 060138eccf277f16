package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
)

// epoch is the harness's clock origin: a frame's sentAtNs is nanoseconds
// since it (monotonic), so sinks in the same process compute the delivery
// latency without wall-clock steps.
var epoch = time.Now()

func sinceEpoch() int64 { return int64(time.Since(epoch)) }

// sink is a peer stand-in: an HTTPS server presenting its own minted
// certificate (pinned in the daemon's cluster directory under its
// principal), accepting only the daemon's certificate, counting TLS
// handshakes and the frames of the current run.
type sink struct {
	ident      devpki.Identity
	port       int
	srv        *http.Server
	handshakes atomic.Int64
	progress   chan struct{} // poked after each new frame of the run
	// batching makes the sink advertise batches and take them, as this
	// daemon's peer port does (spec 3.3.1); unset, it is a stock peer: no
	// advertisement, one frame per request.
	batching atomic.Bool

	mu     sync.Mutex // guards run, seen, lats, unique
	run    int64
	seen   []bool
	lats   []time.Duration
	unique atomic.Int64 // distinct frames of the run received
	dups   atomic.Int64 // repeats of a frame of the run (retries)
	stale  atomic.Int64 // frames of another run
}

func newSink(clientDER []byte, progress chan struct{}) (*sink, error) {
	s := &sink{progress: progress}
	var err error
	s.ident, s.port, s.srv, err = serveSink(clientDER, http.HandlerFunc(s.serve), func() { s.handshakes.Add(1) })
	if err != nil {
		return nil, err
	}
	return s, nil
}

// serveSink starts a peer stand-in's HTTPS server on a loopback port: its
// own minted certificate, accepting only the client certificate clientDER.
// onHello, when set, is called once per handshake, full or resumed.
func serveSink(clientDER []byte, h http.Handler, onHello func()) (devpki.Identity, int, *http.Server, error) {
	ident, err := devpki.Mint(devpki.NewUUID())
	if err != nil {
		return ident, 0, nil, err
	}
	cert, err := ident.TLSCertificate()
	if err != nil {
		return ident, 0, nil, err
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAnyClientCert,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], clientDER) {
				return errors.New("client certificate is not the pinned one")
			}
			return nil
		},
		// Called once per ClientHello: one per handshake, full or resumed.
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			if onHello != nil {
				onHello()
			}
			return nil, nil
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return ident, 0, nil, err
	}
	srv := &http.Server{TLSConfig: cfg, Handler: h,
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return ident, ln.Addr().(*net.TCPAddr).Port, srv, nil
}

var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (s *sink) serve(w http.ResponseWriter, r *http.Request) {
	serveFrames(w, r, s.batching.Load(), func(frame []byte, now int64) { s.record(frame, now) })
}

// batchAdvert is what a batching sink advertises: this daemon's own bounds.
const batchAdvert = "max-frames=256, max-bytes=1048576"

// serveFrames answers one request to a sink: a single frame, or when the
// sink batches, an NDJSON batch answered with one result per element, as
// the daemon's peer port does (spec 3.3.1). Every frame goes to record with
// the time the body was read. A sink that does not batch advertises
// nothing and refuses a batch with 400, as a stock daemon refuses a body of
// several lines.
func serveFrames(w http.ResponseWriter, r *http.Request, batching bool, record func(frame []byte, now int64)) {
	buf := bodyPool.Get().(*bytes.Buffer)
	defer bodyPool.Put(buf)
	buf.Reset()
	_, err := buf.ReadFrom(io.LimitReader(r.Body, 1<<20))
	now := sinceEpoch()
	if batching {
		w.Header().Set("Nvpair-Wl-Batch", batchAdvert)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !isBatch(r) {
		record(buf.Bytes(), now)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	if !batching {
		http.Error(w, "one frame per request", http.StatusBadRequest)
		return
	}
	n := 0
	for rest := bytes.TrimSuffix(buf.Bytes(), []byte("\n")); ; n++ {
		line, more, found := bytes.Cut(rest, []byte("\n"))
		record(line, now)
		if !found {
			break
		}
		rest = more
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(batchAnswer(n + 1))
}

// isBatch reports whether a request is a batch, by its media type.
func isBatch(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == "application/x-ndjson"
}

// batchAnswers holds the answers that accept every element of a batch of
// n elements, built once per n.
var batchAnswers sync.Map // int -> []byte

func batchAnswer(n int) []byte {
	if b, ok := batchAnswers.Load(n); ok {
		return b.([]byte)
	}
	b := []byte(`{"results":[`)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"status":200}`...)
	}
	b = append(b, "]}\n"...)
	batchAnswers.Store(n, b)
	return b
}

// record counts a frame by its benchRun and benchSeq members and keeps its
// delivery latency from sentAtNs. It scans for the members instead of
// decoding, so the sinks cost the same little for the daemon and the
// ceiling.
func (s *sink) record(body []byte, now int64) {
	run, ok1 := scanInt(body, `"benchRun":`)
	seq, ok2 := scanInt(body, `"benchSeq":`)
	sent, ok3 := scanInt(body, `"sentAtNs":`)
	if !ok1 || !ok2 || !ok3 {
		s.stale.Add(1)
		return
	}
	s.mu.Lock()
	switch {
	case run != s.run || seq < 0 || seq >= int64(len(s.seen)):
		s.stale.Add(1)
	case s.seen[seq]:
		s.dups.Add(1)
	default:
		s.seen[seq] = true
		s.lats = append(s.lats, time.Duration(now-sent))
		s.unique.Add(1)
	}
	s.mu.Unlock()
	select {
	case s.progress <- struct{}{}:
	default:
	}
}

// scanInt returns the integer that follows key in b.
func scanInt(b []byte, key string) (int64, bool) {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0, false
	}
	j := i + len(key)
	for j < len(b) && b[j] == ' ' {
		j++
	}
	k := j
	for k < len(b) && (b[k] == '-' || (b[k] >= '0' && b[k] <= '9')) {
		k++
	}
	n, err := strconv.ParseInt(string(b[j:k]), 10, 64)
	return n, err == nil
}

// reset starts a run of n frames.
func (s *sink) reset(run int64, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.run, s.seen, s.lats = run, make([]bool, n), make([]time.Duration, 0, n)
	s.unique.Store(0)
	s.dups.Store(0)
	s.stale.Store(0)
}

func (s *sink) latencies() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.lats...)
}

func (s *sink) close() { s.srv.Close() }

// blackHole accepts TCP connections and never answers or reads: a peer
// that went to sleep mid-broadcast.
type blackHole struct {
	ident    devpki.Identity
	ln       net.Listener
	port     int
	mu       sync.Mutex
	conns    []net.Conn
	accepted atomic.Int64
}

func newBlackHole() (*blackHole, error) {
	ident, err := devpki.Mint(devpki.NewUUID())
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &blackHole{ident: ident, ln: ln, port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.accepted.Add(1)
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
		}
	}()
	return h, nil
}

func (h *blackHole) close() {
	h.ln.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.Close()
	}
}

// discoveryLine is the broker's discovery:nodes snapshot naming the peers:
// each entry's clusterUuid is the principal its pin is filed under.
func discoveryLine(peers []devpki.Identity, ports []int) []byte {
	nodes := make([]map[string]any, len(peers))
	for i, p := range peers {
		nodes[i] = map[string]any{
			"hostUuid": p.Principal, "name": "sink" + strconv.Itoa(i), "ip": "127.0.0.1",
			"ips": []string{"127.0.0.1"}, "clusterUuid": p.Principal, "trusted": true,
			"services": map[string]any{"wl": map[string]any{"port": ports[i]}},
		}
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "discovery:nodes",
		"params": map[string]any{"nodes": nodes}})
	return append(b, '\n')
}

// appendFanoutFrame appends the i-th workload:started frame of a run, as
// the broker sends it (originatedFrom stamped), with the harness's members
// benchRun, benchSeq and sentAtNs (sinceEpoch when it is sent, or when it
// was due in a paced feed).
func appendFanoutFrame(buf []byte, nodeID string, run int64, i int, sentAt int64) []byte {
	buf = append(buf, `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"fan-`...)
	buf = strconv.AppendInt(buf, run, 10)
	buf = append(buf, '-')
	buf = strconv.AppendInt(buf, int64(i), 10)
	buf = append(buf, `","runId":"fan-`...)
	buf = strconv.AppendInt(buf, run, 10)
	buf = append(buf, '-')
	buf = strconv.AppendInt(buf, int64(i), 10)
	buf = append(buf, `","seq":1,"model":"qwen3.5-9b","engine":"llamacpp","state":"running","originatedFrom":"`...)
	buf = append(buf, nodeID...)
	buf = append(buf, `","createdAt":1789661457000,"startedAt":1789661457000,"requesterId":"wlmbench","benchRun":`...)
	buf = strconv.AppendInt(buf, run, 10)
	buf = append(buf, `,"benchSeq":`...)
	buf = strconv.AppendInt(buf, int64(i), 10)
	buf = append(buf, `,"sentAtNs":`...)
	buf = strconv.AppendInt(buf, sentAt, 10)
	return append(buf, `}}}`...)
}

// fanResult is one fan-out run at the healthy sinks.
type fanResult struct {
	elapsed    time.Duration
	frames     int
	delivered  int64 // least distinct frames held by a healthy sink
	complete   bool
	lats       latencySummary
	handshakes []int64 // per healthy sink, during the run
}

func (r fanResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.delivered) / r.elapsed.Seconds()
}

func (r fanResult) maxHandshakes() int64 {
	var m int64
	for _, h := range r.handshakes {
		m = max(m, h)
	}
	return m
}

func minUnique(sinks []*sink) int64 {
	lo := int64(-1)
	for _, s := range sinks {
		if n := s.unique.Load(); lo < 0 || n < lo {
			lo = n
		}
	}
	return max(lo, 0)
}

// settleTimeout bounds how long a run may go without progress.
const settleTimeout = 30 * time.Second

// feedDaemon writes n frames to the daemon's stdin (the broker path), never
// more than window ahead of the slowest healthy sink, and waits until every
// healthy sink holds all n. The window keeps the feed inside the 1024-frame
// queues, so a run measures delivery, not drops.
func feedDaemon(d *daemon, healthy []*sink, progress chan struct{}, run int64, n, window int) fanResult {
	hs0 := handshakes(healthy)
	for _, s := range healthy {
		s.reset(run, n)
	}
	drain(progress)
	start := time.Now()
	var line []byte
	complete := true
	for i := 0; i < n && complete; i++ {
		if int64(i-window) >= minUnique(healthy) {
			complete = waitFor(healthy, progress, int64(i-window+1))
		}
		line = append(appendFanoutFrame(line[:0], d.nodeID, run, i, sinceEpoch()), '\n')
		if err := d.send(line); err != nil {
			complete = false
		}
	}
	if complete {
		complete = waitFor(healthy, progress, int64(n))
	}
	return finishFan(healthy, start, n, complete, hs0)
}

// feedDaemonPaced writes n frames to the daemon's stdin at rate frames/s
// (open loop: each frame's sentAtNs is when it was due, so a stall of the
// daemon's stdin shows up as latency) and waits until every healthy sink
// holds all n, or progress stops.
func feedDaemonPaced(d *daemon, healthy []*sink, progress chan struct{}, run int64, n int, rate float64) fanResult {
	hs0 := handshakes(healthy)
	for _, s := range healthy {
		s.reset(run, n)
	}
	drain(progress)
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	start0 := sinceEpoch()
	var line []byte
	complete := true
	for i := 0; i < n && complete; i++ {
		due := time.Duration(i) * interval
		if wait := due - time.Since(start); wait > 0 {
			time.Sleep(wait)
		}
		line = append(appendFanoutFrame(line[:0], d.nodeID, run, i, start0+int64(due)), '\n')
		if err := d.send(line); err != nil {
			complete = false
		}
	}
	if complete {
		complete = waitFor(healthy, progress, int64(n))
	}
	return finishFan(healthy, start, n, complete, hs0)
}

// waitFor waits until every sink holds target frames of the run, or no
// sink made progress for settleTimeout.
func waitFor(sinks []*sink, progress chan struct{}, target int64) bool {
	last, lastAt := minUnique(sinks), time.Now()
	for {
		got := minUnique(sinks)
		if got >= target {
			return true
		}
		if got != last {
			last, lastAt = got, time.Now()
		} else if time.Since(lastAt) > settleTimeout {
			return false
		}
		select {
		case <-progress:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func finishFan(sinks []*sink, start time.Time, n int, complete bool, hs0 []int64) fanResult {
	r := fanResult{elapsed: time.Since(start), frames: n, delivered: minUnique(sinks), complete: complete}
	var all []time.Duration
	for i, s := range sinks {
		all = append(all, s.latencies()...)
		r.handshakes = append(r.handshakes, s.handshakes.Load()-hs0[i])
	}
	r.lats = summarize(all)
	return r
}

func handshakes(sinks []*sink) []int64 {
	out := make([]int64, len(sinks))
	for i, s := range sinks {
		out[i] = s.handshakes.Load()
	}
	return out
}

func drain(c chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

func (r fanResult) String() string {
	lat := ""
	if r.lats.n > 0 {
		lat = fmt.Sprintf(", latency %s", r.lats)
	}
	return fmt.Sprintf("%d/%d frames in %s (%s)%s, handshakes %v",
		r.delivered, r.frames, r.elapsed.Round(time.Millisecond), fmtRate(r.rate()), lat, r.handshakes)
}
