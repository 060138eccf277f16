package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
)

// jobKey identifies a workload in a broker's store: ids are unique per
// origin node only.
type jobKey struct{ origin, id string }

// job is one entry of a node's Jobs store.
type job struct {
	Origin    string
	ID        string
	Model     string
	Engine    string
	State     string
	CreatedAt int64           // epoch ms from the workload object; 0 when absent
	Info      json.RawMessage // the workload object exactly as the broker got it
	heard     time.Time       // when the broker last got an event for it
	updated   time.Time       // when the workload object last changed
}

func (j job) terminal() bool {
	switch j.State {
	case "completed", "failed", "cancelled":
		return true
	}
	return false
}

// lifecycleMethod is the method a workload in state travels as: what a
// broker replays it with.
func lifecycleMethod(state string) string {
	switch state {
	case "queued":
		return "workload:submitted"
	case "running":
		return "workload:started"
	case "completed":
		return "workload:completed"
	default: // failed, cancelled, or a state the broker does not know
		return "workload:errored"
	}
}

// parseJob reads the fields of a workload object the store shows.
func parseJob(info json.RawMessage, now time.Time) (job, error) {
	var w struct {
		ID             string `json:"id"`
		Model          string `json:"model"`
		Engine         string `json:"engine"`
		State          string `json:"state"`
		OriginatedFrom string `json:"originatedFrom"`
		CreatedAt      *int64 `json:"createdAt"`
	}
	if err := json.Unmarshal(info, &w); err != nil {
		return job{}, fmt.Errorf("workloadInfo: %w", err)
	}
	if w.ID == "" || w.OriginatedFrom == "" || w.State == "" {
		return job{}, errors.New("workloadInfo: id, state and originatedFrom are required")
	}
	j := job{Origin: w.OriginatedFrom, ID: w.ID, Model: w.Model, Engine: w.Engine, State: w.State,
		Info: slices.Clone(info), heard: now}
	if w.CreatedAt != nil {
		j.CreatedAt = *w.CreatedAt
	}
	return j, nil
}

// broker plays one node's broker, the way the desktop back end does: it
// owns the node's Jobs store, feeds it from the daemon's workloads:upsert and
// workloads:remove and from the local-origin frames it sends the daemon
// itself, pushes discovery:nodes snapshots, and replays its store to a
// (re)started daemon. It answers nothing it need not.
type broker struct {
	nodeID      string
	name        string
	retireAfter time.Duration // a remote live workload not heard about this long is retired
	now         func() time.Time
	logf        func(format string, args ...any) // devcluster's own notes; may be nil

	// wmu serializes writes to the daemon's stdin, and orders the local
	// frames after a replay: a frame applied while the daemon is not
	// attached reaches it through the replay, one applied after through
	// its own write. It is taken before mu, never under it.
	wmu  sync.Mutex
	w    io.WriteCloser // the daemon's stdin; nil while none is attached
	live bool           // the attached daemon subscribed: frames may be written

	mu      sync.Mutex // guards jobs and changes; a leaf lock
	jobs    map[jobKey]job
	changes uint64
}

func newBroker(nodeID, name string, retireAfter time.Duration) *broker {
	return &broker{nodeID: nodeID, name: name, retireAfter: retireAfter, now: time.Now, jobs: map[jobKey]job{}}
}

func (b *broker) notef(format string, args ...any) {
	if b.logf != nil {
		b.logf(b.name+": "+format, args...)
	}
}

// attach gives the broker a new daemon's stdin. Nothing is written to it
// until the daemon subscribes (subscribed).
func (b *broker) attach(stdin io.WriteCloser) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.w, b.live = stdin, false
}

// detach forgets the daemon and closes its stdin, which is the daemon's
// shutdown signal. The store is kept: it is the broker's, not the daemon's.
func (b *broker) detach() {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.w != nil {
		b.w.Close()
	}
	b.w, b.live = nil, false
}

// subscribed answers the daemon's discovery:subscribe: it pushes the
// directory snapshot, then replays the store's own-origin workloads, then
// lets the local frames through. It returns how many frames it replayed.
func (b *broker) subscribed(discovery json.RawMessage) (int, error) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.w == nil {
		return 0, errors.New("no daemon attached")
	}
	if err := b.writeLocked("discovery:nodes", discovery); err != nil {
		return 0, err
	}
	frames := b.replayFrames()
	for _, f := range frames {
		if err := b.writeLocked(f.method, f.params); err != nil {
			return 0, err
		}
	}
	b.live = true
	return len(frames), nil
}

type frame struct {
	method string
	params json.RawMessage
}

// replayFrames is the replay the broker owes a restarted daemon: a
// lifecycle frame for each workload it holds whose origin is this node,
// those that reached it through the ingress included, oldest first.
func (b *broker) replayFrames() []frame {
	b.mu.Lock()
	own := make([]job, 0, len(b.jobs))
	for _, j := range b.jobs {
		if j.Origin == b.nodeID {
			own = append(own, j)
		}
	}
	b.mu.Unlock()
	slices.SortFunc(own, func(x, y job) int {
		if c := cmpInt(x.CreatedAt, y.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(x.ID, y.ID)
	})
	out := make([]frame, 0, len(own))
	for _, j := range own {
		out = append(out, frame{lifecycleMethod(j.State), workloadParams(j.Info)})
	}
	return out
}

func workloadParams(info json.RawMessage) json.RawMessage {
	p := make([]byte, 0, len(info)+20)
	return append(append(append(p, `{"workloadInfo":`...), info...), '}')
}

// discovery pushes a directory snapshot to a subscribed daemon.
func (b *broker) discovery(params json.RawMessage) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.live {
		b.writeLocked("discovery:nodes", params) // a failure detaches; the next start resends
	}
}

// writeLocked writes one notification; called with wmu held. A failed write
// means the daemon is gone: the broker stops writing until the next attach.
func (b *broker) writeLocked(method string, params json.RawMessage) error {
	line, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
	}{"2.0", method, params})
	if err != nil {
		return err
	}
	if _, err := b.w.Write(append(line, '\n')); err != nil {
		b.live = false
		return fmt.Errorf("write to %s's daemon: %w", b.name, err)
	}
	return nil
}

// local applies a local-origin lifecycle event to the store, as the desktop
// back end does for its own proxies' work, and sends it to the daemon when
// one is running; otherwise the next replay carries it.
func (b *broker) local(method string, info json.RawMessage) error {
	j, err := parseJob(info, b.now())
	if err != nil {
		return err
	}
	if j.Origin != b.nodeID {
		return fmt.Errorf("%s: local workload %q names origin %s", b.name, j.ID, j.Origin)
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.put(j)
	if b.live {
		b.writeLocked(method, workloadParams(j.Info))
	}
	return nil
}

// localRemove removes a local-origin workload from the store and tells the
// daemon. A removal made while no daemon runs reaches no peer: removals are
// never replayed (spec.md 5: a removal leaves the re-sync set).
func (b *broker) localRemove(id string) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.drop(jobKey{b.nodeID, id})
	if b.live {
		p, _ := json.Marshal(map[string]string{"workloadId": id, "originatedFrom": b.nodeID})
		b.writeLocked("workloads:remove", p)
	}
}

// serve reads the daemon's frames until its stdout ends. onReady is called
// with the daemon's node id when it announces itself, onSubscribe when it
// subscribes to discovery.
func (b *broker) serve(stdout io.Reader, onReady func(nodeID string), onSubscribe func()) error {
	r := bufio.NewReaderSize(stdout, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			b.handle(line, onReady, onSubscribe)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func (b *broker) handle(line []byte, onReady func(string), onSubscribe func()) {
	var f struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(line, &f); err != nil || f.JSONRPC != "2.0" {
		b.notef("daemon wrote a line that is not a JSON-RPC 2.0 frame: %.120q", line)
		return
	}
	switch f.Method {
	case "ready":
		var p struct {
			NodeID string `json:"nodeId"`
		}
		json.Unmarshal(f.Params, &p)
		if p.NodeID != b.nodeID {
			b.notef("daemon announced node id %q, want %q", p.NodeID, b.nodeID)
		}
		if onReady != nil {
			onReady(p.NodeID)
		}
	case "discovery:subscribe":
		if onSubscribe != nil {
			onSubscribe()
		}
	case "workloads:upsert":
		var p struct {
			WorkloadInfo json.RawMessage `json:"workloadInfo"`
		}
		if err := json.Unmarshal(f.Params, &p); err != nil {
			b.notef("workloads:upsert: %v", err)
			return
		}
		j, err := parseJob(p.WorkloadInfo, b.now())
		if err != nil {
			b.notef("workloads:upsert: %v", err)
			return
		}
		b.put(j)
	case "workloads:remove":
		var p struct {
			WorkloadID     string `json:"workloadId"`
			OriginatedFrom string `json:"originatedFrom"`
		}
		if err := json.Unmarshal(f.Params, &p); err != nil || p.WorkloadID == "" {
			b.notef("workloads:remove: malformed params %s", f.Params)
			return
		}
		b.drop(jobKey{p.OriginatedFrom, p.WorkloadID})
	case "":
		// a response: the broker sends no requests, so there is nothing to match
	default:
		if f.ID != nil {
			b.answerUnknown(f.ID, f.Method)
		}
	}
}

// answerUnknown answers a request the broker does not serve with -32601, as
// JSON-RPC requires.
func (b *broker) answerUnknown(id json.RawMessage, method string) {
	line, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": -32601, "message": "method not found: " + method}})
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.w != nil {
		b.w.Write(append(line, '\n'))
	}
}

func (b *broker) put(j job) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := jobKey{j.Origin, j.ID}
	j.updated = j.heard
	if old, ok := b.jobs[k]; ok && bytes.Equal(old.Info, j.Info) {
		j.updated = old.updated // a re-assertion: heard, not changed
	}
	b.jobs[k] = j
	b.changes++
}

func (b *broker) drop(k jobKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.jobs[k]; ok {
		delete(b.jobs, k)
		b.changes++
	}
}

// retire drops the workloads of other nodes that are still live but that
// nobody re-asserted for retireAfter, as the desktop back end does: their
// origin's heartbeat stopped, so they are gone. It returns what it dropped.
func (b *broker) retire() []job {
	if b.retireAfter <= 0 {
		return nil
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []job
	for k, j := range b.jobs {
		if j.Origin != b.nodeID && !j.terminal() && now.Sub(j.heard) >= b.retireAfter {
			delete(b.jobs, k)
			b.changes++
			out = append(out, j)
		}
	}
	return out
}

// snapshot returns a copy of the store, the latest changed first.
func (b *broker) snapshot() []job {
	b.mu.Lock()
	out := make([]job, 0, len(b.jobs))
	for _, j := range b.jobs {
		out = append(out, j)
	}
	b.mu.Unlock()
	sortJobs(out)
	return out
}

// sortJobs orders jobs by their last change, the latest first, then the
// newest first, then by origin and id: what just happened is on top.
func sortJobs(js []job) {
	slices.SortFunc(js, func(x, y job) int {
		if c := y.updated.Compare(x.updated); c != 0 {
			return c
		}
		if c := cmpInt(y.CreatedAt, x.CreatedAt); c != 0 {
			return c
		}
		if c := strings.Compare(x.Origin, y.Origin); c != 0 {
			return c
		}
		return strings.Compare(x.ID, y.ID)
	})
}

func (b *broker) get(origin, id string) (job, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	j, ok := b.jobs[jobKey{origin, id}]
	return j, ok
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
