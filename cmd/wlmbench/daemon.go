package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/procstat"
)

// daemonOpts configures one daemon process.
type daemonOpts struct {
	name           string // names its directory and log file
	ident          devpki.Identity
	pins           []devpki.Identity // written to trusted/ before the start
	ingress        bool              // --local-ingress 127.0.0.1:0
	metrics        bool              // --metrics on a free loopback port
	resyncInterval time.Duration     // 0: the daemon's default
	maxLive        int               // --max-live-workloads; 0: the daemon's default
	// known holds the optional flags the build accepts (see contestant);
	// nil means all of them. A flag it lacks is left out, since a daemon
	// exits 2 on an unknown flag; a section needing one checks first.
	known    map[string]bool
	logLevel string // --log-level; "" is info
	// fsync is its --journal-fsync ("": the build's default), passed only
	// to a build that takes the flag; extra are further flags
	// (-daemon-args), this build's alone.
	fsync string
	extra []string
}

// has reports whether the build takes the optional flag name.
func (o daemonOpts) has(name string) bool { return o.known == nil || o.known[name] }

// daemon is the real binary, its broker side played by the harness: stdin
// is written by the harness, stdout is read and drained, stderr is parsed
// for the figures the table needs and kept in a log file.
type daemon struct {
	name        string
	cmd         *exec.Cmd
	nodeID      string
	ingressAddr string
	metricsAddr string

	inMu  sync.Mutex // serializes writes to stdin: one line per Write
	stdin io.WriteCloser

	ready   chan struct{}
	ingress chan string  // the ingress address, from its log line
	metrics chan string  // the metrics endpoint's address, from its log line
	peer    chan string  // the peer port's address, from the "started" line
	pings   *pingTracker // the answers to the harness's stdin requests
	exited  chan struct{}
	waitErr error

	upserts, removes, otherOut atomic.Int64 // frames the daemon wrote to the broker
	outboundDrops              atomic.Int64 // "outbound queue full": dropped=N, summed (a lower bound)
	peerDrops                  atomic.Int64 // "peer queue full": dropped=N, summed (a lower bound)
	peerFailures               atomic.Int64 // "peer delivery failed" lines
	targets                    atomic.Int64 // total= of the last "broadcast targets changed"
	errorLines                 atomic.Int64 // level=ERROR lines
}

// startDaemon writes the daemon's app directory (node-id.json, identity, pins)
// under root and starts bin, then waits for its ready frame.
func startDaemon(bin, root string, o daemonOpts) (*daemon, error) {
	appDir := filepath.Join(root, o.name)
	clusterDir := filepath.Join(appDir, "cluster")
	if err := devpki.WriteIdentity(clusterDir, o.ident); err != nil {
		return nil, err
	}
	if err := devpki.WriteNodeID(appDir, o.ident.Principal); err != nil {
		return nil, err
	}
	for _, p := range o.pins {
		if err := devpki.PinIdentity(clusterDir, p); err != nil {
			return nil, err
		}
	}
	level := o.logLevel
	if level == "" {
		level = "info"
	}
	// A build without --app-dir (the stock daemon) takes the parent of
	// --cluster-dir as its app dir, which is appDir.
	args := []string{"--port", "0", "--cluster-dir", clusterDir, "--log-level", level}
	if o.has("--app-dir") {
		args = append(args, "--app-dir", appDir)
	}
	if o.resyncInterval > 0 && o.has("--resync-interval") {
		args = append(args, "--resync-interval", o.resyncInterval.String())
	}
	if o.maxLive > 0 && o.has("--max-live-workloads") {
		args = append(args, "--max-live-workloads", strconv.Itoa(o.maxLive))
	}
	if o.fsync != "" && o.has("--journal-fsync") {
		args = append(args, "--journal-fsync", o.fsync)
	}
	args = append(args, o.extra...)
	// Below info a daemon does not log the addresses it listens on, so
	// the harness picks them (free a moment ago) instead of reading them.
	quiet := level != "info" && level != "debug"
	var fixedIngress, fixedPeer string
	if quiet {
		peerPort, err := freeLoopbackPort()
		if err != nil {
			return nil, err
		}
		args[1] = strconv.Itoa(peerPort)
		fixedPeer = net.JoinHostPort("127.0.0.1", args[1])
	}
	if o.ingress {
		addr := "127.0.0.1:0"
		if quiet {
			port, err := freeLoopbackPort()
			if err != nil {
				return nil, err
			}
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			fixedIngress = addr
		}
		args = append(args, "--local-ingress", addr)
	}
	d := &daemon{name: o.name, nodeID: o.ident.Principal, ready: make(chan struct{}),
		ingress: make(chan string, 1), metrics: make(chan string, 1), peer: make(chan string, 1), pings: newPingTracker(), exited: make(chan struct{})}
	wantMetrics := o.metrics && o.has("--metrics")
	if wantMetrics {
		addr := "127.0.0.1:0"
		if quiet {
			port, err := freeLoopbackPort()
			if err != nil {
				return nil, err
			}
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			d.metricsAddr = addr
		}
		args = append(args, "--metrics", addr)
	}
	logFile, err := os.Create(filepath.Join(root, o.name+".log"))
	if err != nil {
		return nil, err
	}
	d.cmd = exec.Command(bin, args...)
	if d.stdin, err = d.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	if fixedIngress != "" {
		d.ingress <- fixedIngress
	}
	if fixedPeer != "" {
		d.peer <- fixedPeer
	}
	var readers sync.WaitGroup
	readers.Go(func() { d.drainStdout(stdout) })
	readers.Go(func() { d.parseStderr(stderr, logFile) })
	go func() {
		readers.Wait() // Wait must not run before the pipes are read to EOF
		d.waitErr = d.cmd.Wait()
		logFile.Close()
		close(d.exited)
	}()
	select {
	case <-d.ready:
	case <-d.exited:
		return nil, fmt.Errorf("%s exited before ready (%v); see %s.log", o.name, d.waitErr, filepath.Join(root, o.name))
	case <-time.After(30 * time.Second):
		d.stop()
		return nil, fmt.Errorf("%s sent no ready frame within 30s", o.name)
	}
	if fixedIngress != "" {
		// The harness picked the address, so nothing says when it is
		// served: wait until it takes a connection.
		waitListening(fixedIngress, 5*time.Second)
	}
	if wantMetrics && d.metricsAddr == "" {
		select {
		case d.metricsAddr = <-d.metrics:
		case <-time.After(10 * time.Second):
			d.stop()
			return nil, fmt.Errorf("%s logged no metrics address", o.name)
		}
	}
	if o.ingress {
		select {
		case d.ingressAddr = <-d.ingress:
		case <-time.After(10 * time.Second):
			d.stop()
			return nil, fmt.Errorf("%s logged no ingress address", o.name)
		}
	}
	return d, nil
}

// drainStdout reads the daemon's frames to the broker and counts them.
func (d *daemon) drainStdout(r io.Reader) {
	br := bufio.NewReaderSize(r, 256<<10)
	readyPrefix := []byte(`{"jsonrpc":"2.0","method":"ready"`)
	responsePrefix := []byte(`{"jsonrpc":"2.0","id":`)
	readyOnce := sync.Once{}
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case bytes.HasPrefix(line, responsePrefix):
			d.pings.answeredLine(line, time.Now())
		case bytes.Contains(line, []byte(`"method":"workloads:upsert"`)):
			d.upserts.Add(1)
		case bytes.Contains(line, []byte(`"method":"workloads:remove"`)):
			d.removes.Add(1)
		case bytes.HasPrefix(line, readyPrefix):
			readyOnce.Do(func() { close(d.ready) })
		case len(line) > 0:
			d.otherOut.Add(1)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// parseStderr copies the daemon's log to w and counts what the table needs.
func (d *daemon) parseStderr(r io.Reader, w io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(w, line)
		switch {
		case strings.Contains(line, "outbound queue full"):
			d.outboundDrops.Add(logInt(line, "dropped"))
		case strings.Contains(line, "peer queue full"):
			d.peerDrops.Add(logInt(line, "dropped"))
		case strings.Contains(line, "peer delivery failed"):
			d.peerFailures.Add(1)
		case strings.Contains(line, "broadcast targets changed"), strings.Contains(line, "peer set changed"):
			// The second is the stock daemon's line for the same.
			d.targets.Store(logInt(line, "total"))
		case strings.Contains(line, "metrics endpoint listening"):
			select {
			case d.metrics <- logValue(line, "addr"):
			default:
			}
		case strings.Contains(line, "ingress listening"):
			// "local ingress listening" here, "local workload ingress
			// listening" in the stock daemon.
			select {
			case d.ingress <- logValue(line, "addr"):
			default:
			}
		case strings.Contains(line, "msg=started "):
			select {
			case d.peer <- logValue(line, "peerAddr"):
			default:
			}
		case strings.Contains(line, "inter-node server listening"):
			// The stock daemon's peer listener, on every interface.
			select {
			case d.peer <- logValue(line, "addr"):
			default:
			}
		}
		if strings.Contains(line, "level=ERROR") {
			d.errorLines.Add(1)
		}
	}
}

// send writes one frame line to the daemon's stdin.
func (d *daemon) send(line []byte) error {
	d.inMu.Lock()
	defer d.inMu.Unlock()
	_, err := d.stdin.Write(line)
	return err
}

// peerPort returns the port of the daemon's peer listener, from the
// "started" line it logs before its ready frame.
func (d *daemon) peerPort(timeout time.Duration) (int, error) {
	select {
	case addr := <-d.peer:
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return 0, fmt.Errorf("%s: peer address %q: %w", d.name, addr, err)
		}
		return strconv.Atoi(port)
	case <-time.After(timeout):
		return 0, fmt.Errorf("%s logged no peer address within %s", d.name, timeout)
	}
}

// waitTargets waits until the daemon logged a target set of n.
func (d *daemon) waitTargets(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for d.targets.Load() != int64(n) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d broadcast targets after %s, want %d", d.name, d.targets.Load(), timeout, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// stop closes stdin (the broker going away: a clean shutdown with the peer
// queues' drain time) and waits; a daemon still running after 15 s is
// killed. It returns the exit error, if any.
func (d *daemon) stop() error {
	d.inMu.Lock()
	d.stdin.Close()
	d.inMu.Unlock()
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		return fmt.Errorf("%s did not exit within 15s of stdin EOF; killed", d.name)
	}
	return d.waitErr
}

// procStatus returns the kB figures of /proc/<pid>/status (VmHWM, VmRSS).
func (d *daemon) procStatus() (map[string]int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return nil, err
	}
	return parseProcStatus(b), nil
}

// parseProcStatus reads the "Name:   N kB" lines of a /proc status file.
func parseProcStatus(b []byte) map[string]int64 {
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 2 && f[1] == "kB" {
			if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				out[name] = n
			}
		}
	}
	return out
}

// scrape fetches the daemon's metrics endpoint.
func (d *daemon) scrape(path string) ([]byte, error) {
	if d.metricsAddr == "" {
		return nil, errors.New("no metrics endpoint")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.metricsAddr+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", path, resp.StatusCode)
	}
	return b, nil
}

// goroutines scrapes the daemon's metrics endpoint for go_goroutines.
func (d *daemon) goroutines(path string) (int, error) {
	b, err := d.scrape(path)
	if err != nil {
		return 0, err
	}
	return promGauge(b, "go_goroutines")
}

// promGauge returns the value of an unlabelled metric in Prometheus text.
func promGauge(text []byte, name string) (int, error) {
	v, n := promSum(text, name)
	if n == 0 {
		return 0, fmt.Errorf("no %s in the metrics", name)
	}
	return int(v), nil
}

// promSum adds up every sample of a metric (all label sets) in Prometheus
// text and returns the sum and the number of samples.
func promSum(text []byte, name string) (float64, int) {
	var sum float64
	var n int
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, "#") || !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		switch {
		case strings.HasPrefix(rest, "{"):
			i := strings.LastIndexByte(rest, '}')
			if i < 0 {
				continue
			}
			rest = rest[i+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // another metric with this prefix
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum += v
			n++
		}
	}
	return sum, n
}

// logValue returns key's value in a log/slog text line, unquoted, or "".
func logValue(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		if s, err := strconv.QuotedPrefix(v); err == nil {
			u, _ := strconv.Unquote(s)
			return u
		}
		return ""
	}
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}

// logInt is logValue as an integer, 0 when absent or not a number.
func logInt(line, key string) int64 {
	n, _ := strconv.ParseInt(logValue(line, key), 10, 64)
	return n
}

// waitListening waits until addr takes a TCP connection, or for timeout.
func waitListening(addr string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freeLoopbackPort returns a loopback port that was free a moment ago.
func freeLoopbackPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// supportsFlag reports whether bin accepts flag with value: the daemon
// parses every flag before --version, and an unknown flag exits 2.
func supportsFlag(bin, flag, value string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, bin, flag, value, "--version").Run() == nil
}

// cpuMeter measures the CPU a process uses over a stretch of work.
type cpuMeter struct {
	pid   int
	start time.Duration
	ok    bool
}

func startCPU(pid int) cpuMeter {
	c, err := procstat.CPU(pid)
	return cpuMeter{pid: pid, start: c, ok: err == nil}
}

// perFrame returns the CPU used since start divided by frames, or 0 when
// it cannot be measured.
func (m cpuMeter) perFrame(frames int64) time.Duration {
	if !m.ok || frames <= 0 {
		return 0
	}
	c, err := procstat.CPU(m.pid)
	if err != nil {
		return 0
	}
	return (c - m.start) / time.Duration(frames)
}
