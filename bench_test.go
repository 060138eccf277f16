package main

// Benchmarks of the daemon's hot path, for `go test -bench` and profiling:
//
//	go test -run '^$' -bench . -benchmem .
//	go test -run '^$' -bench 'IngressEndToEnd' -cpuprofile cpu.out -memprofile mem.out .
//
// The micro benchmarks measure one function each on the seed's curl frame
// (the frame format's live beside it, in internal/wireframe); the
// end-to-end ones run a real Manager in process (loopback HTTP ingress
// with a drained broker pipe; broker pipe to K pinned-mTLS sinks) so a
// profile shows where the daemon's own time goes. The harness that drives
// the real binary is cmd/wlmbench.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// benchNodeID is the node id of the benchmarked daemon.
const benchNodeID = "6f1c2a4e-8b7d-4c3e-9a5f-0d1e2f3a4b5c"

// benchSeedFrame is the seed document's curl example, byte for byte.
const benchSeedFrame = `{
  "jsonrpc": "2.0", "method": "workload:started",
  "params": {"workloadInfo": {"id": "job-42", "runId": "job-42", "seq": 1, "model": "qwen3.5-9b", "engine": "llamacpp",
             "state": "running", "createdAt": 1789661457000, "startedAt": 1789661457000,
             "completedAt": null, "error": null, "requesterId": "my-scheduler"}}}`

// benchSeedParams are the seed frame's params as the broker would send them,
// with the origin stamped.
const benchSeedParams = `{"workloadInfo":{"id":"job-42","runId":"job-42","seq":1,"model":"qwen3.5-9b","engine":"llamacpp",` +
	`"state":"running","createdAt":1789661457000,"startedAt":1789661457000,"completedAt":null,"error":null,` +
	`"requesterId":"my-scheduler","originatedFrom":"` + benchNodeID + `"}}`

func BenchmarkBrokerWriterNotify(b *testing.B) {
	w := brokerio.NewWriter(io.Discard, wireframe.DefaultBrokerLineMax)
	params := json.RawMessage(benchSeedParams)
	b.ReportAllocs()
	for b.Loop() {
		if err := w.Notify(wireframe.MethodUpsert, params); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommitLocal tracks and queues broker frames for a rotating set
// of workloads, with no broadcast target (the dispatcher discards).
func BenchmarkCommitLocal(b *testing.B) {
	for _, src := range []struct {
		name string
		src  frameSource
	}{{"broker", fromBroker}, {"ingress", fromIngress}} {
		b.Run(src.name, func(b *testing.B) {
			m := benchManager(b, io.Discard)
			const pool = 4096
			frames := make([]localFrame, pool)
			for i := range frames {
				p := fmt.Sprintf(`{"workloadInfo":{"id":"job-%d","runId":"job-%d","seq":%d,"model":"m","engine":"llamacpp","state":"running","originatedFrom":%q}}`,
					i, i, i, benchNodeID)
				f, err := parseLocalFrame(wireframe.MethodStarted, json.RawMessage(p))
				if err != nil {
					b.Fatal(err)
				}
				frames[i] = f
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				m.commitLocal(frames[i%pool], src.src)
				i++
			}
		})
	}
}

// BenchmarkIngestLocal is the ingress handler minus HTTP: parse, broker
// write, commit.
func BenchmarkIngestLocal(b *testing.B) {
	m := benchManager(b, io.Discard)
	body := []byte(benchSeedFrame)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.ingestLocal(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkServeIngress runs the ingress handler in process (no sockets)
// on distinct workloads: the checks, parse, broker write, commit and
// answer, at the info log level.
func BenchmarkServeIngress(b *testing.B) {
	m := benchManager(b, io.Discard)
	li, err := newLocalIngress(m, "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ln, err := li.Listen()
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	host := li.BoundAddr()
	var buf []byte
	var n int64
	b.ReportAllocs()
	for b.Loop() {
		n++
		buf = benchIngressBody(buf[:0], n/3, n%3+1)
		req := httptest.NewRequest(http.MethodPost, wireframe.EventsPath, bytes.NewReader(buf))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		li.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body.String())
		}
	}
}

// BenchmarkIngressEndToEnd posts valid lifecycle frames (distinct
// workloads, rising seq) from 8 x GOMAXPROCS keep-alive clients to a
// running Manager's loopback ingress, with the broker side drained.
// The client runs in the same process: focus a profile on
// localIngress.ServeHTTP to see the daemon's share.
func BenchmarkIngressEndToEnd(b *testing.B) {
	r := benchRunManager(b, true)
	url := "http://" + r.m.IngressAddr() + wireframe.EventsPath
	tr := &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var next atomic.Int64
	b.SetParallelism(8)
	benchPostInParallel(b, client, url, func(buf []byte) []byte {
		n := next.Add(1)
		return benchIngressBody(buf, n/3, n%3+1)
	})
}

// benchPostInParallel posts the frames frame appends, from RunParallel's
// goroutines over client, each answered 200, and reports frames/s.
func benchPostInParallel(b *testing.B, client *http.Client, url string, frame func(buf []byte) []byte) {
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var buf []byte
		for pb.Next() {
			buf = frame(buf[:0])
			resp, err := client.Post(url, "application/json", bytes.NewReader(buf))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
}

// benchIngressBody appends a producer's frame for workload n at seq.
func benchIngressBody(buf []byte, n, seq int64) []byte {
	state, method := "running", wireframe.MethodStarted
	if seq == 1 {
		state, method = "queued", wireframe.MethodSubmitted
	} else if seq == 3 {
		state, method = "completed", wireframe.MethodCompleted
	}
	buf = append(buf, `{"jsonrpc":"2.0","method":"`...)
	buf = append(buf, method...)
	buf = append(buf, `","params":{"workloadInfo":{"id":"bench-`...)
	buf = strconv.AppendInt(buf, n, 10)
	buf = append(buf, `","runId":"bench-`...)
	buf = strconv.AppendInt(buf, n, 10)
	buf = append(buf, `","seq":`...)
	buf = strconv.AppendInt(buf, seq, 10)
	buf = append(buf, `,"model":"qwen3.5-9b","engine":"llamacpp","state":"`...)
	buf = append(buf, state...)
	buf = append(buf, `","createdAt":1789661457000,"startedAt":1789661457000,"completedAt":null,"error":null,"requesterId":"bench"}}}`...)
	return buf
}

// BenchmarkFanOutEndToEnd feeds workload:started frames through the broker
// pipe of a running Manager broadcasting to 8 pinned-mTLS sinks, and
// measures until every sink holds every frame. The feed keeps at most 256
// frames ahead of the slowest sink, well inside the 1024-frame queues, so
// nothing is dropped. Focus a profile on peerSender.run and readLoop.
func BenchmarkFanOutEndToEnd(b *testing.B) {
	const k, window = 8, 256
	r := benchRunManager(b, false)
	sinks := make([]*benchSink, k)
	var nodes []map[string]any
	for i := range sinks {
		sinks[i] = newBenchSink(b, r.clusterDir, r.ident.DER)
		nodes = append(nodes, map[string]any{
			"hostUuid": sinks[i].ident.Principal, "name": "sink" + strconv.Itoa(i), "ip": "127.0.0.1",
			"clusterUuid": sinks[i].ident.Principal,
			"services":    map[string]any{"wl": map[string]any{"port": sinks[i].port}},
		})
	}
	r.m.trust.Reload()
	p, _ := json.Marshal(map[string]any{"nodes": nodes})
	r.send(b, wireframe.EncodeNotification("discovery:nodes", p))
	testkit.Eventually(b, "8 targets", func() bool { return r.m.bcast.TargetCount() == k })

	minDelivered := func() int64 {
		lo := int64(-1)
		for _, s := range sinks {
			if n := s.frames.Load(); lo < 0 || n < lo {
				lo = n
			}
		}
		return lo
	}
	var base int64
	for _, s := range sinks {
		s.frames.Store(0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var line []byte
	for i := 0; i < b.N; i++ {
		for int64(i)-minDelivered() >= window {
			time.Sleep(50 * time.Microsecond)
		}
		line = append(line[:0], `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"fan-`...)
		line = strconv.AppendInt(line, base+int64(i), 10)
		line = append(line, `","runId":"r","seq":1,"model":"qwen3.5-9b","engine":"llamacpp","state":"running","originatedFrom":"`+benchNodeID+`"}}}`...)
		r.send(b, line)
	}
	deadline := time.Now().Add(30 * time.Second)
	for minDelivered() < int64(b.N) {
		if time.Now().After(deadline) {
			b.Fatalf("sinks hold %d of %d frames", minDelivered(), b.N)
		}
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
	var hs int64
	for _, s := range sinks {
		hs += s.handshakes.Load()
	}
	b.ReportMetric(float64(hs)/k, "handshakes/peer")
}

// benchRun is a Manager running in process on a drained broker pipe.
type benchRun struct {
	m          *Manager
	ident      devpki.Identity
	clusterDir string
	toD        *io.PipeWriter
	mu         sync.Mutex // serializes writes to toD
}

func (r *benchRun) send(b *testing.B, line []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.toD.Write(append(line, '\n')); err != nil {
		b.Fatalf("write to daemon: %v", err)
	}
}

// benchRunManager starts a Manager (with its identity, a long heartbeat so
// re-assertions do not mix into the figures, and optionally the ingress)
// whose broker output is read and discarded. It stops at cleanup.
func benchRunManager(b *testing.B, ingress bool) *benchRun {
	b.Helper()
	ident, err := devpki.Mint(benchNodeID)
	if err != nil {
		b.Fatal(err)
	}
	clusterDir := filepath.Join(b.TempDir(), "cluster")
	if err := devpki.WriteIdentity(clusterDir, ident); err != nil {
		b.Fatal(err)
	}
	dIn, toD := io.Pipe()
	fromD, dOut := io.Pipe()
	go func() { _, _ = io.Copy(io.Discard, fromD) }()
	m, err := NewManager(Config{
		NodeID: benchNodeID, Version: "bench", PeerAddr: "127.0.0.1:0", ClusterDir: clusterDir,
		ResyncInterval: time.Hour, In: dIn, Out: dOut,
		// Durability on, as in a real app dir: an ingress 200 waits for
		// its journal record.
		JournalPath: filepath.Join(filepath.Dir(clusterDir), journalFileName),
		Logger:      slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		b.Fatal(err)
	}
	if ingress {
		if err := m.EnableLocalIngress("127.0.0.1:0"); err != nil {
			b.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	b.Cleanup(func() {
		cancel()
		toD.Close()
		<-done
		fromD.Close()
	})
	testkit.Eventually(b, "the manager to bind", func() bool { return m.PeerAddr() != nil && (!ingress || m.IngressAddr() != "") })
	return &benchRun{m: m, ident: ident, clusterDir: clusterDir, toD: toD}
}

// benchManager returns a Manager that is not running, writing to out.
func benchManager(b *testing.B, out io.Writer) *Manager {
	b.Helper()
	m, err := NewManager(Config{NodeID: benchNodeID, Version: "bench", ClusterDir: b.TempDir(),
		In: bytes.NewReader(nil), Out: out,
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.bcast.Close(time.Second) })
	return m
}

// benchSink is a peer stand-in: an HTTPS server presenting its own minted
// certificate, pinned in the daemon's cluster directory, that accepts only
// the daemon's certificate and counts TLS handshakes and frames.
type benchSink struct {
	ident      devpki.Identity
	port       int
	frames     atomic.Int64
	handshakes atomic.Int64
}

func newBenchSink(b *testing.B, daemonClusterDir string, daemonDER []byte) *benchSink {
	b.Helper()
	ident, err := devpki.Mint(devpki.NewUUID())
	if err != nil {
		b.Fatal(err)
	}
	if err := devpki.PinIdentity(daemonClusterDir, ident); err != nil {
		b.Fatal(err)
	}
	cert, err := ident.TLSCertificate()
	if err != nil {
		b.Fatal(err)
	}
	s := &benchSink{ident: ident}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAnyClientCert,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], daemonDER) {
				return errors.New("client certificate is not the daemon's")
			}
			return nil
		},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			s.handshakes.Add(1)
			return nil, nil
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{
		TLSConfig: cfg,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			s.frames.Add(1)
		}),
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	b.Cleanup(func() { srv.Close() })
	return s
}

// The heartbeat's hot pieces (issue 11): tracking into a large re-sync
// set, a pass's take of one batch, and how long a local frame waits on the
// set's lock while peer senders take passes from it.

// benchSetSize is the re-sync set the heartbeat benchmarks hold: the
// default --max-live-workloads.
const benchSetSize = defaultMaxLiveWorkloads

var benchResyncNow = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

// benchResyncEvents returns n running workloads shaped like the seed frame,
// each its own run.
func benchResyncEvents(b *testing.B, n int) []wireframe.Lifecycle {
	b.Helper()
	evs := make([]wireframe.Lifecycle, n)
	for i := range evs {
		id := strconv.Itoa(i)
		p := `{"workloadInfo":{"id":"job-` + id + `","runId":"job-` + id + `","seq":1,"model":"qwen3.5-9b","engine":"llamacpp",` +
			`"state":"running","createdAt":1789661457000,"startedAt":1789661457000,"completedAt":null,"error":null,` +
			`"requesterId":"my-scheduler","originatedFrom":"` + benchNodeID + `"}}`
		ev, err := wireframe.ParseLifecycle(wireframe.MethodStarted, json.RawMessage(p))
		if err != nil {
			b.Fatal(err)
		}
		evs[i] = ev
	}
	return evs
}
