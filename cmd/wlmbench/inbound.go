package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
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

	"nvpair-workload-manager/internal/dev/devpki"
)

// The inbound section (issue 14): P pinned peers post single lifecycle
// frames to the daemon's peer port, each over one keep-alive mTLS
// connection of its own, posting its next frame when the last is answered,
// as a member's sender does (one stream per peer). The harness is the
// daemon's broker and drains its stdout. The ceiling is a bare mTLS server
// in a process of its own that does what the daemon must at the least:
// check the client certificate against the pins, read the body, decode it
// into a map with encoding/json and write it as one line to its stdout
// under a mutex, which the harness drains alike.

// peerFramePrefix names the workloads of the inbound section.
const peerFramePrefix = "in"

// appendPeerFrame appends a peer's n-th frame of a trial: a
// workload:started for a workload of its own (prefix-peer-n), so no two
// frames share a dedup key and none is short-circuited as already seen,
// with originatedFrom the peer's own node id, as a member relays its own
// workloads.
func appendPeerFrame(buf []byte, nodeID, prefix string, peer, n int) []byte {
	buf = append(buf, `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"`...)
	buf = appendID(buf, prefix, peer, n)
	buf = append(buf, `","runId":"`...)
	buf = appendID(buf, prefix, peer, n)
	buf = append(buf, `","seq":1,"model":"qwen3.5-9b","engine":"llamacpp","state":"running","originatedFrom":"`...)
	buf = append(buf, nodeID...)
	buf = append(buf, `","createdAt":1789661457000,"startedAt":1789661457000,"completedAt":null,"error":null,"requesterId":"wlmbench"}}}`...)
	return buf
}

// peerBody returns the frames of peers posting for trial prefix: the
// worker number is the peer's index into ids.
func peerBody(ids []devpki.Identity, prefix string) bodyFunc {
	return func(buf []byte, peer, n int) []byte {
		return appendPeerFrame(buf, ids[peer].Principal, prefix, peer, n)
	}
}

// pinnedTLS is a TLS client configuration presenting id and accepting only
// a server whose certificate is serverDER, byte for byte: a member's view
// of another, pinned rather than verified against a CA.
func pinnedTLS(id devpki.Identity, serverDER []byte) (*tls.Config, error) {
	cert, err := id.TLSCertificate()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		Certificates:       []tls.Certificate{cert},
		InsecureSkipVerify: true, // replaced by the pin comparison below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, serverDER) {
				return errors.New("server certificate does not match its pin")
			}
			return nil
		},
	}, nil
}

// peerClient is one peer's client: its own certificate, one keep-alive
// connection per server (the daemon's and the ceiling's), HTTP/1.1 as a
// member's sender speaks.
func peerClient(id devpki.Identity, serverDER []byte) (*http.Client, *http.Transport, error) {
	cfg, err := pinnedTLS(id, serverDER)
	if err != nil {
		return nil, nil, err
	}
	tr := &http.Transport{
		TLSClientConfig:     cfg,
		MaxIdleConnsPerHost: 1,
		MaxConnsPerHost:     1,
		IdleConnTimeout:     60 * time.Second,
		DisableCompression:  true,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, tr, nil
}

// inbound is the inbound section.
func (b *bench) inbound() error {
	cfg := b.cfg
	ids := make([]devpki.Identity, slices.Max(cfg.inPeers))
	for i := range ids {
		var err error
		if ids[i], err = devpki.Mint(devpki.NewUUID()); err != nil {
			return err
		}
	}
	var builds []*contestant
	var ds []*daemon
	for _, bc := range b.contestants(nil) {
		d, err := startDaemon(bc.bin, b.root, bc.opts(daemonOpts{name: "inbound", ident: b.node, pins: ids,
			metrics: bc.role == roleThis && b.hasMetrics, resyncInterval: time.Hour}))
		if err != nil {
			if err := b.buildFailed("inbound", bc, err); err != nil {
				return err
			}
			continue
		}
		defer b.stopDaemon(d)
		// The directory binds each peer's principal to its node id, as in
		// a cluster, so the daemon checks every frame's origin against it.
		// The peers serve nothing: the daemon has nothing of its own to
		// send them. A build that logs below info does not say when it
		// took the set; the stock daemon checks only the pins.
		if err := b.bindPeers(d, ids, bc.logLevel == "info"); err != nil {
			if err := b.buildFailed("inbound", bc, err); err != nil {
				return err
			}
			continue
		}
		builds, ds = append(builds, bc), append(ds, d)
	}
	ceil, err := startCeilingInbound(b.node, ids)
	if err != nil {
		return err
	}
	defer ceil.close()

	clients := make([]*http.Client, len(ids))
	for i, id := range ids {
		c, tr, err := peerClient(id, b.node.DER)
		if err != nil {
			return err
		}
		defer tr.CloseIdleConnections()
		clients[i] = c
	}
	// The peer port serves the same path as the ingress.
	urls := make([]string, len(ds))
	for i, d := range ds {
		port, err := d.peerPort(10 * time.Second)
		if err != nil {
			return err
		}
		urls[i] = "https://127.0.0.1:" + strconv.Itoa(port) + ingressPath
	}
	cURL := "https://" + ceil.addr + ingressPath
	var dOK, cOK int64
	for _, p := range cfg.inPeers {
		do, co := b.inboundAt(ds, builds, ceil, clients[:p], ids[:p], urls, cURL, p)
		dOK, cOK = dOK+do, cOK+co
	}
	b.checkLines("inbound daemon", dOK, ds[0].upserts.Load)
	b.checkLines("inbound ceiling", cOK, ceil.lines.Load)
	b.tbl.note("inbound: each peer has its own certificate, pinned in the daemon's cluster directory and in the ceiling's pin set, and posts over one keep-alive connection, its next frame when the last is answered; every frame is a workload of its own (no dedup hits), its originatedFrom the peer's node id, which the daemon's last discovery:nodes binds to the peer's principal")
	b.tbl.note("inbound: the ceiling is a process of its own, a bare net/http mTLS server that checks the client certificate against the pins on every request, decodes the body into a map and writes it as one line to its stdout under a mutex; the harness drains both stdouts; trials interleave")
	for i, d := range ds {
		if n := d.errorLines.Load(); n > 0 {
			b.tbl.note("inbound: the %s daemon logged %d errors", builds[i].role, n)
		}
	}
	return nil
}

// checkLines notes a server whose stdout did not carry one line per frame
// it accepted: a frame answered 200 must have been written.
func (b *bench) checkLines(who string, want int64, lines func() int64) {
	deadline := time.Now().Add(5 * time.Second)
	for lines() < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := lines(); got != want {
		b.tbl.note("%s: %d lines on stdout for %d frames accepted (warm-ups included)", who, got, want)
	}
}

// bindPeers sends the daemon a discovery:nodes snapshot listing each peer
// with its principal as both its clusterUuid and its hostUuid, at a port
// nothing listens on.
func (b *bench) bindPeers(d *daemon, ids []devpki.Identity, wait bool) error {
	closed, err := freeLoopbackPort()
	if err != nil {
		return err
	}
	ports := make([]int, len(ids))
	for i := range ports {
		ports[i] = closed
	}
	if err := d.send(discoveryLine(ids, ports)); err != nil {
		return err
	}
	if !wait {
		return nil
	}
	return d.waitTargets(len(ids), 10*time.Second)
}

// inboundAt is one peer count: p peers against each build's peer port and
// against the ceiling, cfg.trials times each, interleaved; it adds the
// rows and the target, and returns the frames this build's daemon and the
// ceiling accepted, their warm-ups included, for the line check.
func (b *bench) inboundAt(ds []*daemon, builds []*contestant, ceil *ceilingInbound, clients []*http.Client, ids []devpki.Identity, urls []string, cURL string, p int) (dOK, cOK int64) {
	cfg := b.cfg
	prefix := peerFramePrefix + strconv.Itoa(p) + "-"
	warm := min(cfg.t/5, 500*time.Millisecond)
	for i := range ds {
		// Each build has a directory of its own, so the same ids are new
		// workloads to each.
		n := closedLoopEach(clients, urls[i], warm, peerBody(ids, prefix+"warm")).ok
		if i == 0 {
			dOK += n
		}
	}
	cOK += closedLoopEach(clients, cURL, warm, peerBody(ids, prefix+"warm")).ok
	load := func(url string, i int) loadResult {
		return closedLoopEach(clients, url, cfg.t, peerBody(ids, prefix+strconv.Itoa(i)))
	}
	trialOn := func(pid int, url string) trialFunc {
		return func(i int) (loadResult, time.Duration) {
			return withCPU(pid, func() loadResult { return load(url, i) })
		}
	}
	var others []other
	for i, bc := range builds[1:] {
		others = append(others, other{role: bc.role, trial: trialOn(ds[i+1].cmd.Process.Pid, urls[i+1])})
	}
	pr, all := runFigure(cfg.trials, fmt.Sprintf("inbound P=%d", p), trialOn(ds[0].cmd.Process.Pid, urls[0]),
		trialOn(ceil.cmd.Process.Pid, cURL), others)
	ratio, ok := ratioOf(pr.ratio)
	r := row{section: "inbound",
		figure:   fmt.Sprintf("peer frames/s, P=%d pinned peers, closed loop, median of %d x %s", p, cfg.trials, cfg.t),
		measured: fmtRate(median(pr.dRate)), baseline: fmtRate(median(pr.cRate)), ratio: fmtX(ratio),
		target: ">= " + fmtX(inboundRatio), result: atLeast(ratio, ok, inboundRatio)}
	if !ok {
		r.ratio = "-"
	}
	cr := cpuRow("inbound", fmt.Sprintf("  server CPU per frame at P=%d (ratio: ceiling/daemon)", p), pr.dCPU, pr.cCPU)
	stock := compareRows(fmt.Sprintf("inbound P=%d", p), all, &r, &cr)
	b.stockGoals(stock)
	if p == issue30InboundPeers {
		b.goals30.set(inboundGoalName(p), ">= "+fmtX(issue30InboundRatio), ratioCell(r, ok, pr), atLeast(ratio, ok, issue30InboundRatio))
	}
	b.tbl.add(r)
	b.goals.set(inboundGoalName(p), r.target, ratioCell(r, ok, pr), r.result)
	b.tbl.add(cr)
	b.tbl.add(row{section: "inbound", figure: fmt.Sprintf("  latency p50 / p99 / max at P=%d (medians)", p),
		measured: medianLats(pr.dLats).String(), baseline: medianLats(pr.cLats).String()})
	for _, sr := range stock {
		b.tbl.add(sr)
	}
	for _, f := range pr.failures {
		b.tbl.note("inbound P=%d: %s", p, f)
	}
	for _, s := range all[2:] {
		for _, f := range s.failures {
			b.tbl.note("inbound P=%d: %s", p, f)
		}
	}
	return dOK + pr.dOK, cOK + pr.cOK
}

// ceilingInboundSpec is what the inbound ceiling's process needs: the
// server identity to present (the daemon's, so the peers' clients pin the
// same certificate for both) and the pinned client certificates. The
// harness sends it as the first line of the process's stdin.
type ceilingInboundSpec struct {
	CertPEM, KeyPEM []byte
	Pins            [][]byte // DER
}

// ceilingInboundMain is the inbound ceiling's process (wlmbench
// ceiling-inbound): it serves on a loopback port, prints the address, then
// writes every frame it accepts as one line to its stdout, and stops at
// stdin EOF.
func ceilingInboundMain() error {
	in := bufio.NewReader(os.Stdin)
	var spec ceilingInboundSpec
	if err := readSpecLine(in, &spec); err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(spec.CertPEM, spec.KeyPEM)
	if err != nil {
		return err
	}
	pins := make(map[string]bool, len(spec.Pins))
	for _, p := range spec.Pins {
		pins[string(p)] = true
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	h := &inboundCeiling{pins: pins, out: os.Stdout}
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAnyClientCert, // checked against the pins per request, as the daemon does
	}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	h.writeLine([]byte(ln.Addr().String()))
	return shutdownAtEOF(in, srv)
}

// inboundCeiling is the bare mTLS server's handler.
type inboundCeiling struct {
	pins map[string]bool // client certificates (DER) it accepts; read-only

	mu  sync.Mutex // guards out: one frame's line per write, as the daemon's broker writer
	out io.Writer
}

func (h *inboundCeiling) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 || !h.pins[string(r.TLS.PeerCertificates[0].Raw)] {
		http.Error(w, "not a pinned peer", http.StatusForbidden)
		return
	}
	body, err := io.ReadAll(r.Body)
	var m map[string]any
	if err == nil {
		err = json.Unmarshal(body, &m)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := h.writeLine(body); err != nil {
		http.Error(w, "stdout: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok\n")
}

// writeLine writes b and a newline in one write call.
func (h *inboundCeiling) writeLine(b []byte) error {
	line := append(b, '\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.out.Write(line)
	return err
}

// ceilingInbound is the inbound ceiling's process, seen from the harness:
// after the address, its stdout is drained and its lines counted.
type ceilingInbound struct {
	*childProc
	addr  string
	lines atomic.Int64
}

func startCeilingInbound(server devpki.Identity, peers []devpki.Identity) (*ceilingInbound, error) {
	spec := ceilingInboundSpec{CertPEM: server.CertPEM, KeyPEM: server.KeyPEM}
	for _, p := range peers {
		spec.Pins = append(spec.Pins, p.DER)
	}
	p, err := startSelfWithSpec("ceiling-inbound", spec)
	if err != nil {
		return nil, err
	}
	addr, err := p.out.ReadString('\n')
	if err != nil {
		p.close()
		return nil, fmt.Errorf("inbound ceiling: %w", err)
	}
	c := &ceilingInbound{childProc: p, addr: strings.TrimSpace(addr)}
	go c.drain()
	return c, nil
}

// drain reads the ceiling's stdout to EOF, counting its lines.
func (c *ceilingInbound) drain() {
	buf := make([]byte, 256<<10)
	for {
		n, err := c.out.Read(buf)
		c.lines.Add(int64(bytes.Count(buf[:n], []byte{'\n'})))
		if err != nil {
			return
		}
	}
}
