package testkit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"nvpair-workload-manager/internal/dev/pairbroker"
	"nvpair-workload-manager/internal/dev/pairshadow"
	"nvpair-workload-manager/internal/wireframe"
)

// FrameLog records every line a daemon writes to its broker, in order, and
// answers the questions the tests ask of them. The root's in-process
// testBroker and e2e's daemonProc embed it; set T before it records.
type FrameLog struct {
	T      testing.TB // the test the log fails
	mu     sync.Mutex // guards lines and frames
	lines  []string
	frames []wireframe.RPC
	// LineMax is the longest line the broker reads, newline included:
	// PAIR's (pairbroker.LineMax) when 0; a node given a longer
	// --broker-line-max sets it.
	LineMax atomic.Int64
}

// Record records lines from r until it ends. A line that is not a JSON
// frame fails the test: stdout carries only frames.
//
// A line longer than PAIR's broker reads (pairbroker.LineMax, unless the
// node was given a longer limit) fails the test, and nothing after it is
// recorded: PAIR's reader has stopped for good by then. The rest is
// drained, so that the daemon does not block on a test already failed.
func (l *FrameLog) Record(r io.Reader) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if max := l.MaxLine(); len(line) > max {
			l.T.Errorf("daemon wrote a line of %d bytes, over the %d its broker reads: PAIR's broker stops reading for good there", len(line), max)
			io.Copy(io.Discard, br)
			return
		}
		if errors.Is(err, os.ErrClosed) {
			// The test closed the pipe at its cleanup, after the daemon
			// was stopped, while this reader was still behind (a broker
			// that did not read leaves a backlog, read late on a loaded
			// machine): the line it was in was cut by that close, not
			// written short by the daemon.
			return
		}
		if len(line) > 0 {
			line = bytes.TrimSuffix(line, []byte("\n"))
			var f wireframe.RPC
			if jerr := json.Unmarshal(line, &f); jerr != nil {
				l.T.Errorf("daemon wrote a line that is not a JSON frame: %q", line)
			}
			l.mu.Lock()
			l.lines = append(l.lines, string(line))
			l.frames = append(l.frames, f)
			l.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// MaxLine is the longest line the broker reads, newline included.
func (l *FrameLog) MaxLine() int {
	if n := l.LineMax.Load(); n > 0 {
		return int(n)
	}
	return pairbroker.LineMax
}

// All returns a copy of every frame received so far.
func (l *FrameLog) All() []wireframe.RPC {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]wireframe.RPC(nil), l.frames...)
}

// FramesFrom returns a copy of the frames received from the i-th on.
func (l *FrameLog) FramesFrom(i int) []wireframe.RPC {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.frames[i:])
}

// Line returns the raw text of the i-th frame.
func (l *FrameLog) Line(i int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines[i]
}

// Text returns everything received, one frame per line.
func (l *FrameLog) Text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// WaitFrames waits until n frames have arrived and returns all of them.
func (l *FrameLog) WaitFrames(n int) []wireframe.RPC {
	l.T.Helper()
	Eventually(l.T, fmt.Sprintf("%d frame(s) from the daemon", n), func() bool { return len(l.All()) >= n })
	return l.All()
}

// WithMethod returns the frames received so far with the given method.
func (l *FrameLog) WithMethod(method string) []wireframe.RPC {
	var out []wireframe.RPC
	for _, f := range l.All() {
		if f.Method == method {
			out = append(out, f)
		}
	}
	return out
}

// WaitMethod waits until n frames with method have arrived and returns them.
func (l *FrameLog) WaitMethod(method string, n int) []wireframe.RPC {
	l.T.Helper()
	Eventually(l.T, fmt.Sprintf("%d %s frame(s) from the daemon", n, method), func() bool {
		return len(l.WithMethod(method)) >= n
	})
	return l.WithMethod(method)
}

// WaitResponseLine waits for the answer to request id (its JSON text) and
// returns it as written.
func (l *FrameLog) WaitResponseLine(id string) string {
	l.T.Helper()
	var raw string
	Eventually(l.T, "the answer to request "+id, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, f := range l.frames {
			if f.IsResponse() && string(f.ID) == id {
				raw = l.lines[i]
				return true
			}
		}
		return false
	})
	return raw
}

// WaitResponse waits for the answer to request id (its JSON text).
func (l *FrameLog) WaitResponse(id string) wireframe.RPC {
	l.T.Helper()
	var f wireframe.RPC
	if err := json.Unmarshal([]byte(l.WaitResponseLine(id)), &f); err != nil {
		l.T.Fatal(err)
	}
	return f
}

// Upserts returns the workload objects of the workloads:upsert frames.
func (l *FrameLog) Upserts() []map[string]any {
	var out []map[string]any
	for _, f := range l.WithMethod(wireframe.MethodUpsert) {
		var p struct {
			WorkloadInfo map[string]any `json:"workloadInfo"`
		}
		if err := json.Unmarshal(f.Params, &p); err != nil {
			l.T.Fatalf("upsert params: %v", err)
		}
		out = append(out, p.WorkloadInfo)
	}
	return out
}

// UpsertCount counts the workloads:upsert frames for workload id so far.
func (l *FrameLog) UpsertCount(id string) int {
	n := 0
	for _, w := range l.Upserts() {
		if w["id"] == id {
			n++
		}
	}
	return n
}

// WaitUpserts waits until n workloads:upsert frames for id have arrived.
func (l *FrameLog) WaitUpserts(id string, n int) {
	l.T.Helper()
	Eventually(l.T, fmt.Sprintf("%d workloads:upsert of %s", n, id), func() bool { return l.UpsertCount(id) >= n })
}

// JobsList folds every workloads:upsert and workloads:remove the daemon
// wrote to its broker, in order, through PAIR's broker's merge
// (internal/dev/pairbroker, the model the dev cluster's brokers use): what the
// Jobs list of a PAIR broker fed by this daemon shows. A test asserting
// what a user would see uses it, not the last upsert, which is what a
// last-write store would show. When ../shared holds PAIR's own store, the
// same frames go to it too (internal/dev/pairshadow), and a Jobs list that is
// not the model's fails the test, naming the job.
func (l *FrameLog) JobsList() *pairbroker.Store {
	j := pairshadow.NewJudged(nil, StartShadow(l.T))
	defer j.Close()
	EachJobsFrame(l.All(), func(info json.RawMessage) { _, _ = j.Upsert(info) }, func(origin, id string) { j.Remove(origin, id) })
	for _, d := range j.Disagreements() {
		l.T.Errorf("PAIR's store disagrees with the model: %s", d)
	}
	return j.Model()
}

// EachJobsFrame hands what reaches PAIR's Jobs store of a daemon's frames
// to its broker, in order: each workloads:upsert's workloadInfo, each
// workloads:remove's origin and id. Other frames are not the store's.
func EachJobsFrame(frames []wireframe.RPC, upsert func(json.RawMessage), remove func(origin, id string)) {
	for _, f := range frames {
		switch f.Method {
		case wireframe.MethodUpsert:
			var p struct {
				WorkloadInfo json.RawMessage `json:"workloadInfo"`
			}
			if json.Unmarshal(f.Params, &p) == nil {
				upsert(p.WorkloadInfo)
			}
		case wireframe.MethodRemove:
			var p struct {
				WorkloadID     string `json:"workloadId"`
				OriginatedFrom string `json:"originatedFrom"`
			}
			if json.Unmarshal(f.Params, &p) == nil {
				remove(p.OriginatedFrom, p.WorkloadID)
			}
		}
	}
}

// StartShadow starts PAIR's store, or returns nil, saying so in the test's
// log, when ../shared has none.
func StartShadow(t testing.TB) *pairshadow.Shadow {
	bin, err := pairshadow.Program(".")
	if errors.Is(err, pairshadow.ErrNotFound) {
		t.Logf("no shadow of PAIR's store: %v", err)
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	sh, err := pairshadow.Start(bin)
	if err != nil {
		t.Fatal(err)
	}
	return sh
}
