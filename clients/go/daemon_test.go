package wlmclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// daemonBin is the daemon built from the repository's root by TestMain, so
// the client is tested against the real thing.
var daemonBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "wlmclient-daemon-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		daemonBin = filepath.Join(dir, "nvpair-workload-manager")
		if runtime.GOOS == "windows" {
			daemonBin += ".exe"
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		build := exec.Command(goBin, "build", "-o", daemonBin, ".")
		build.Dir = filepath.Join("..", "..") // the daemon's module root
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building the daemon: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}())
}

// lockedBuffer is the daemon's log, written by its process and read by the
// test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// daemon is one running daemon with its ingress on a port the kernel chose,
// and the broker's end of its pipes: what it wrote up to the broker is
// kept as lines.
type daemon struct {
	addr   string // the ingress's HOST:PORT
	log    *lockedBuffer
	mu     sync.Mutex
	frames []brokerFrame
}

// brokerFrame is one line the daemon wrote to its broker.
type brokerFrame struct {
	Method string `json:"method"`
	Params struct {
		NodeID       string         `json:"nodeId"`
		WorkloadID   string         `json:"workloadId"`
		WorkloadInfo map[string]any `json:"workloadInfo"`
	} `json:"params"`
}

// startDaemon starts the daemon with a fresh app dir, its peer port and its
// ingress on port 0, and returns once it has logged the ingress's address.
func startDaemon(t *testing.T, extra ...string) *daemon {
	t.Helper()
	d := &daemon{log: &lockedBuffer{}}
	args := append([]string{"--app-dir", t.TempDir(), "--port", "0", "--local-ingress", "127.0.0.1:0", "--log-level", "debug"}, extra...)
	cmd := exec.Command(daemonBin, args...)
	stdin, err := cmd.StdinPipe() // held open: the broker's channel
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = d.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var f brokerFrame
			if json.Unmarshal(sc.Bytes(), &f) == nil {
				d.mu.Lock()
				d.frames = append(d.frames, f)
				d.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
		<-read
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	eventually(t, "the daemon's ingress address in its log", func() bool {
		for _, line := range strings.Split(d.log.String(), "\n") {
			if _, rest, ok := strings.Cut(line, `msg="local ingress listening" addr=`); ok {
				d.addr, _, _ = strings.Cut(rest, " ")
				return true
			}
		}
		return false
	})
	return d
}

// brokerFrames returns what the daemon wrote to its broker so far.
func (d *daemon) brokerFrames() []brokerFrame {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]brokerFrame(nil), d.frames...)
}

// nodeID is the id the daemon announced to its broker.
func (d *daemon) nodeID(t *testing.T) string {
	var id string
	eventually(t, "the ready line", func() bool {
		for _, f := range d.brokerFrames() {
			if f.Method == "ready" {
				id = f.Params.NodeID
				return true
			}
		}
		return false
	})
	return id
}

// upserts returns the workloads the daemon wrote to its broker for id.
func (d *daemon) upserts(id string) []map[string]any {
	var out []map[string]any
	for _, f := range d.brokerFrames() {
		if f.Method == "workloads:upsert" && f.Params.WorkloadInfo["id"] == id {
			out = append(out, f.Params.WorkloadInfo)
		}
	}
	return out
}

func TestAgainstTheDaemonManyJobsFromManyGoroutinesReachTheBrokerInOrderStampedWithTheNodesID(t *testing.T) {
	d := startDaemon(t)
	c := newClient(t, Config{Addr: d.addr, Producer: "itest"})
	n, err := c.Node(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := d.nodeID(t); n.NodeID != want || n.NodeIDSource != "node-id.json" || n.Limits.LeaseMinSeconds != 5 {
		t.Fatalf("GET /v1/node: %+v, want node id %s", n, want)
	}
	const jobs, callers = 12, 4
	var wg sync.WaitGroup
	ids := make([]string, jobs)
	for i := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			job, err := c.Submit(context.Background(), JobSpec{Model: "qwen3-8b", Engine: "vllm"})
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = job.ID()
			var starts sync.WaitGroup
			for range callers {
				starts.Add(1)
				go func() { defer starts.Done(); job.Start() }()
			}
			starts.Wait()
			if i%3 == 0 {
				job.Fail("CUDA out of memory")
			} else {
				job.Complete()
			}
		}()
	}
	wg.Wait()
	closeWithin(t, c, 30*time.Second)
	if s := c.Stats(); s.Sent != jobs*(callers+2) || s.Refused != 0 || s.Dropped != 0 {
		t.Fatalf("stats %+v, want %d sent and nothing refused or dropped", s, jobs*(callers+2))
	}
	// The daemon writes a frame to its broker before it answers 200, but
	// the test's reader of that pipe may not have read it yet: wait for
	// every frame to be read, then look at them.
	eventually(t, "every job's frames read from the broker pipe", func() bool {
		for _, id := range ids {
			if len(d.upserts(id)) < callers+2 {
				return false
			}
		}
		return true
	})
	for i, id := range ids {
		ups := d.upserts(id)
		if len(ups) != callers+2 {
			t.Errorf("%s: %d upserts at the broker, want %d", id, len(ups), callers+2)
			continue
		}
		for k, w := range ups {
			if w["seq"] != float64(k+1) || w["originatedFrom"] != n.NodeID {
				t.Errorf("%s: upsert %d has seq %v origin %v", id, k, w["seq"], w["originatedFrom"])
			}
		}
		want := "completed"
		if i%3 == 0 {
			want = "failed"
		}
		if last := ups[len(ups)-1]; last["state"] != want {
			t.Errorf("%s ends %v at the broker, want %s", id, last["state"], want)
		}
	}
}

func TestAgainstTheDaemonAFrameOverTheWorkloadBoundIsRefusedOnceNotRetried(t *testing.T) {
	d := startDaemon(t, "--workload-max-bytes", "4096")
	c := newClient(t, Config{Addr: d.addr})
	waits := recordWaits(c)
	job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e", Extra: map[string]any{"notes": strings.Repeat("x", 5000)}})
	if err != nil {
		t.Fatal(err)
	}
	closeWithin(t, c, 10*time.Second)
	var se *StatusError
	if !errors.As(job.Err(), &se) || se.Status != 413 || !strings.Contains(se.Reason, "4096") {
		t.Fatalf("job.Err() = %v, want the daemon's 413 naming its bound", job.Err())
	}
	if s := c.Stats(); s.Refused != 1 || s.Retried != 0 || len(waits()) != 0 {
		t.Errorf("stats %+v, waits %v: want one refusal and no retry", s, waits())
	}
}

func TestAgainstTheDaemonAnAbandonedLeasedJobIsRetiredAsFailed(t *testing.T) {
	d := startDaemon(t)
	c := newClient(t, Config{Addr: d.addr, Lease: 5 * time.Second})
	job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	job.Start()
	closeWithin(t, c, 10*time.Second) // the producer ends without closing its job
	eventually(t, "the lease to retire the job", func() bool {
		ups := d.upserts(job.ID())
		return len(ups) == 3 && ups[2]["state"] == "failed" && strings.Contains(fmt.Sprint(ups[2]["error"]), "lease of 5 s expired")
	})
}

func TestAgainstTheDaemonTheOutboxDeliversATerminalFrameAfterAProducerRestart(t *testing.T) {
	// The first process reports to an address nothing listens on any more:
	// its failed frame waits in the outbox when it is stopped.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	path := filepath.Join(t.TempDir(), "outbox.jsonl")
	c1 := newClient(t, Config{Addr: gone, OutboxPath: path, Lease: -1})
	recordWaits(c1)
	job, err := c1.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	job.Fail("the GPU fell off the bus")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c1.Close(ctx); err == nil {
		t.Fatal("Close returned nil with both frames unsent")
	}

	d := startDaemon(t)
	c2 := newClient(t, Config{Addr: d.addr, OutboxPath: path})
	closeWithin(t, c2, 10*time.Second)
	eventually(t, "the outbox's frame read from the broker pipe", func() bool { return len(d.upserts(job.ID())) > 0 })
	ups := d.upserts(job.ID())
	if len(ups) != 1 || ups[0]["state"] != "failed" || ups[0]["seq"] != 2.0 || ups[0]["error"] != "the GPU fell off the bus" {
		t.Fatalf("the broker got %v, want the failed frame (seq 2) from the outbox", ups)
	}
}

// TestAgainstTheDaemonAJobWaitingForRoomDoesNotHoldBackTheJobThatWouldMakeIt
// is the live-workload bound's livelock: a new job refused 503 with
// Retry-After while the node's set is full must wait without holding the
// client's only worker, or the frame that would free a slot (the admitted
// job's Complete) is never sent.
func TestAgainstTheDaemonAJobWaitingForRoomDoesNotHoldBackTheJobThatWouldMakeIt(t *testing.T) {
	d := startDaemon(t, "--max-live-workloads", "1", "--resync-interval", "1s")
	clientLog := &lockedBuffer{}
	c := newClient(t, Config{Addr: d.addr, Workers: 1, Lease: -1,
		Logger: slog.New(slog.NewTextHandler(clientLog, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	a, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "job A's queued frame at the broker", func() bool { return len(d.upserts(a.ID())) == 1 })
	b, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "e"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "job B's queued frame refused 503 with Retry-After", func() bool {
		for _, line := range strings.Split(clientLog.String(), "\n") {
			if strings.Contains(line, `msg="wlmclient: retrying"`) && strings.Contains(line, "id="+b.ID()) &&
				strings.Contains(line, "503") && strings.Contains(line, "--max-live-workloads") {
				return true
			}
		}
		return false
	})
	if err := a.Complete(); err != nil {
		t.Fatal(err)
	}
	// index is where the broker got id's frame in state, or -1.
	index := func(id, state string) int {
		for i, f := range d.brokerFrames() {
			if f.Method == "workloads:upsert" && f.Params.WorkloadInfo["id"] == id && f.Params.WorkloadInfo["state"] == state {
				return i
			}
		}
		return -1
	}
	eventually(t, "job A's completed frame at the broker while job B waits for room", func() bool { return index(a.ID(), "completed") >= 0 })
	// B is admitted once A's terminal entry has left the set's retention
	// (two heartbeats, 2 s), after one or two more refusals.
	eventually(t, "job B's queued frame at the broker", func() bool { return index(b.ID(), "queued") >= 0 })
	if ac, bq := index(a.ID(), "completed"), index(b.ID(), "queued"); bq < ac {
		t.Errorf("job B's queued frame reached the broker (line %d) before job A's completed one (line %d)", bq, ac)
	}
	closeWithin(t, c, 10*time.Second)
	if s := c.Stats(); s.Sent != 3 || s.Retried < 1 || s.Dropped != 0 || s.Refused != 0 {
		t.Errorf("stats %+v, want 3 sent, at least one retried, nothing dropped or refused", s)
	}
}
