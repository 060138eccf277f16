package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"nvpair-workload-manager/internal/dev/pairbroker"
	"nvpair-workload-manager/internal/dev/pairshadow"
)

// jobKey is a workload as a removal names it: ids are unique per origin
// node only.
type jobKey struct{ origin, id string }

// job is one row of a node's Jobs list: a record of its broker's store
// (internal/dev/pairbroker), as the view shows it.
type job struct {
	Origin    string
	ID        string
	Model     string
	Engine    string
	State     string
	Inferred  bool            // failed by the broker's own inference, not by the origin's word
	CreatedAt int64           // epoch ms from the workload object; 0 when absent
	Info      json.RawMessage // the workload object as the broker holds it
	updated   time.Time       // when the record last changed
}

func jobOf(r pairbroker.Record) job {
	return job{Origin: r.Origin, ID: r.ID, Model: r.Model, Engine: r.Engine, State: r.State, Inferred: r.Inferred,
		CreatedAt: r.CreatedAt, Info: r.Info, updated: r.Updated}
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
func lifecycleMethod(state string) string { return pairbroker.ReplayMethod(state) }

// broker plays one node's broker, the way PAIR's desktop back end does: it
// owns the node's Jobs store (internal/dev/pairbroker, PAIR's merge, judged by
// PAIR's own store through internal/dev/pairshadow when ../shared has it), feeds it
// from the daemon's workloads:upsert and workloads:remove and from the
// local-origin frames it sends the daemon itself, pushes discovery:nodes
// snapshots, fails by inference what a departed node or a silent origin
// left live, and replays its store to a (re)started daemon. It answers
// nothing it need not.
type broker struct {
	nodeID     string
	name       string
	staleAfter time.Duration                    // the staleness budget of the sweep; 0: no sweep
	logf       func(format string, args ...any) // devcluster's own notes; may be nil
	jobs       *pairshadow.Judged               // the Jobs store, and PAIR's beside it
	store      *pairbroker.Store                // jobs.Model(), for reading

	// dmu guards the four fields below it. disagreed lists where PAIR's
	// store and the model disagreed, the first time for each job (the
	// heads disagreedOn holds), in the order found.
	dmu         sync.Mutex
	disagreed   []string
	disagreedOn map[string]bool
	stopped     string // why the reader stopped for good (serve); "" while it reads
	// upserted counts the daemon's workloads:upsert frames per job, so a
	// test can tell one relay from many.
	upserted map[jobKey]int

	// heard, when set (before the daemon starts: the reader calls it
	// unlocked), is told of each workloads:upsert the daemon writes, with
	// the time its line was read: the scale benchmark's receipt clock.
	heard func(info json.RawMessage, at time.Time)

	// wmu serializes writes to the daemon's stdin, and orders the local
	// frames after a replay: a frame applied while no daemon is attached
	// reaches the next one through its replay, one applied after the
	// replay through its own write. It is taken before the store's lock,
	// never under it.
	wmu   sync.Mutex
	w     io.WriteCloser  // the daemon's stdin; nil while none is attached
	live  bool            // the replay is written: lifecycle frames may follow
	subd  bool            // the daemon subscribed to discovery: snapshots may follow
	nodes map[string]bool // the node ids of the last discovery snapshot; nil before the first
}

func newBroker(nodeID, name string, staleAfter time.Duration) *broker {
	return newBrokerAt(nodeID, name, staleAfter, nil, nil)
}

// newBrokerAt is newBroker with the store's clock (time.Now when nil) and
// PAIR's store to judge it (none when nil).
func newBrokerAt(nodeID, name string, staleAfter time.Duration, now func() time.Time, shadow *pairshadow.Shadow) *broker {
	j := pairshadow.NewJudged(now, shadow)
	return &broker{nodeID: nodeID, name: name, staleAfter: staleAfter, jobs: j, store: j.Model(),
		disagreedOn: map[string]bool{}, upserted: map[jobKey]int{}}
}

// judge compares the broker's Jobs list with PAIR's store's now, and
// returns the differences it had not found before: one line each, naming
// the job. Nothing without a shadow.
func (b *broker) judge() []string { return b.noteDisagreements(b.jobs.Disagreements()) }

// noteDisagreements keeps the lines about jobs not named before, and
// returns them.
func (b *broker) noteDisagreements(lines []string) []string {
	b.dmu.Lock()
	defer b.dmu.Unlock()
	var fresh []string
	for _, l := range lines {
		// The line's head names the comparison and the job; the objects
		// after it change as the job moves on.
		head, _, _ := strings.Cut(l, ": the model holds")
		if !b.disagreedOn[head] {
			b.disagreedOn[head] = true
			b.disagreed = append(b.disagreed, l)
			fresh = append(fresh, l)
		}
	}
	return fresh
}

// disagreements returns every difference found so far.
func (b *broker) disagreements() []string {
	b.dmu.Lock()
	defer b.dmu.Unlock()
	return slices.Clone(b.disagreed)
}

func (b *broker) notef(format string, args ...any) {
	if b.logf != nil {
		b.logf(b.name+": "+format, args...)
	}
}

// attach gives the broker a new daemon's stdin and replays the store to
// it at once, before the daemon's ready, as PAIR's broker rehydrates a
// (re)started workload manager: the frames wait in the pipe until the
// daemon reads them. It returns how many frames it replayed.
func (b *broker) attach(stdin io.WriteCloser) (int, error) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.w, b.live, b.subd = stdin, false, false
	frames := b.replayFrames()
	for _, f := range frames {
		if err := b.writeLocked(f.method, f.params); err != nil {
			return 0, err
		}
	}
	b.live = true
	return len(frames), nil
}

// detach forgets the daemon and closes its stdin, which is the daemon's
// shutdown signal. The store is kept: it is the broker's, not the daemon's.
func (b *broker) detach() {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.w != nil {
		b.w.Close()
	}
	b.w, b.live, b.subd = nil, false, false
}

// subscribed answers the daemon's discovery:subscribe with the directory
// snapshot, and lets later snapshots through.
func (b *broker) subscribed(discovery json.RawMessage) error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.w == nil {
		return errors.New("no daemon attached")
	}
	if err := b.writeLocked("discovery:nodes", discovery); err != nil {
		return err
	}
	b.subd = true
	return nil
}

type frame struct {
	method string
	params json.RawMessage
}

// replayFrames is the replay the broker owes a restarted daemon
// (pairbroker.Store.Replay, after PAIR's ReplayForNode(self, 60000) on
// every (re)start of its workload manager): a lifecycle frame for each live
// workload this node originated, those that reached it through the ingress
// included, and for each it finished within the last minute, oldest first.
// With a shadow, a replay PAIR's store would make otherwise is a
// disagreement.
func (b *broker) replayFrames() []frame {
	recs, diff := b.jobs.Replay(b.nodeID, pairbroker.ReplayWindow)
	for _, l := range b.noteDisagreements(diff) {
		b.notef("PAIR's store disagrees: %s", l)
	}
	out := make([]frame, 0, len(recs))
	for _, r := range recs {
		out = append(out, frame{pairbroker.ReplayMethod(r.State), workloadParams(r.Info)})
	}
	return out
}

func workloadParams(info json.RawMessage) json.RawMessage {
	p := make([]byte, 0, len(info)+20)
	return append(append(append(p, `{"workloadInfo":`...), info...), '}')
}

// discovery takes a directory snapshot: it fails by inference the live
// workloads of every node that left it (PAIR's node-loss sweep), and pushes
// it to a subscribed daemon. It returns the workloads it failed.
func (b *broker) discovery(params json.RawMessage) []job {
	var snap struct {
		Nodes []struct {
			HostUUID string `json:"hostUuid"`
		} `json:"nodes"`
	}
	json.Unmarshal(params, &snap)
	now := map[string]bool{}
	for _, n := range snap.Nodes {
		now[n.HostUUID] = true
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	var failed []job
	for id := range b.nodes {
		if !now[id] && id != b.nodeID {
			for _, r := range b.jobs.FailNode(id, "node left discovery") {
				failed = append(failed, jobOf(r))
			}
		}
	}
	b.nodes = now
	if b.subd {
		b.writeLocked("discovery:nodes", params) // a failure detaches; the next start resends
	}
	return failed
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
// one is attached, whatever the merge said, as PAIR's broker forwards every
// frame its proxies emit; otherwise the next replay carries it.
func (b *broker) local(method string, info json.RawMessage) error {
	in, err := pairbroker.Parse(info)
	if err != nil {
		return err
	}
	if in.Origin != b.nodeID {
		return fmt.Errorf("%s: local workload %q names origin %s", b.name, in.ID, in.Origin)
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.jobs.Upsert(in.Info)
	if b.live {
		b.writeLocked(method, workloadParams(in.Info))
	}
	return nil
}

// localRemove removes a local-origin workload from the store and tells the
// daemon. A removal made while no daemon runs reaches no peer: removals are
// never replayed (spec.md 5: a removal leaves the re-sync set).
func (b *broker) localRemove(id string) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.jobs.Remove(b.nodeID, id)
	if b.live {
		p, _ := json.Marshal(map[string]string{"workloadId": id, "originatedFrom": b.nodeID})
		b.writeLocked("workloads:remove", p)
	}
}

// serve reads the daemon's frames until its stdout ends. onReady is called
// with the daemon's node id when it announces itself, onSubscribe when it
// subscribes to discovery.
//
// It reads as PAIR's broker does (pairbroker.ReadLines): a line over
// pairbroker.LineMax stops the reading for good, the daemon's later frames
// unread, and is a problem of the run (stopReason says it).
func (b *broker) serve(stdout io.Reader, onReady func(nodeID string), onSubscribe func()) error {
	err := pairbroker.ReadLines(stdout, func(line []byte) {
		if len(bytes.TrimSpace(line)) > 0 {
			b.handle(line, onReady, onSubscribe)
		}
	})
	if errors.Is(err, pairbroker.ErrLineTooLong) {
		b.dmu.Lock()
		b.stopped = fmt.Sprintf("%s's daemon wrote %v", b.name, err)
		b.dmu.Unlock()
	}
	return err
}

// countUpsert counts a workloads:upsert of the job info names.
func (b *broker) countUpsert(info json.RawMessage) {
	var w struct {
		ID             string `json:"id"`
		OriginatedFrom string `json:"originatedFrom"`
	}
	json.Unmarshal(info, &w)
	b.dmu.Lock()
	b.upserted[jobKey{w.OriginatedFrom, w.ID}]++
	b.dmu.Unlock()
}

// upserts returns how many workloads:upsert of (origin, id) the daemon
// wrote to this broker.
func (b *broker) upserts(origin, id string) int {
	b.dmu.Lock()
	defer b.dmu.Unlock()
	return b.upserted[jobKey{origin, id}]
}

// stopReason says why the broker's reader stopped for good, or "".
func (b *broker) stopReason() string {
	b.dmu.Lock()
	defer b.dmu.Unlock()
	return b.stopped
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
		// The stock workload manager's ready carries only its version.
		if p.NodeID != "" && p.NodeID != b.nodeID {
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
		at := time.Now() // before the store's merge: the receipt, not the merge, is timed
		var p struct {
			WorkloadInfo json.RawMessage `json:"workloadInfo"`
		}
		if err := json.Unmarshal(f.Params, &p); err != nil {
			b.notef("workloads:upsert: %v", err)
			return
		}
		// PAIR's broker: ParseIncoming(params.workloadInfo), then Apply.
		if _, err := b.jobs.Upsert(p.WorkloadInfo); err != nil {
			b.notef("workloads:upsert: %v", err)
		}
		b.countUpsert(p.WorkloadInfo)
		if b.heard != nil {
			b.heard(p.WorkloadInfo, at)
		}
	case "workloads:remove":
		var p struct {
			WorkloadID     string `json:"workloadId"`
			OriginatedFrom string `json:"originatedFrom"`
		}
		if err := json.Unmarshal(f.Params, &p); err != nil || p.WorkloadID == "" {
			b.notef("workloads:remove: malformed params %s", f.Params)
			return
		}
		b.jobs.Remove(p.OriginatedFrom, p.WorkloadID)
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

// sweep fails by inference the other nodes' live workloads whose origin
// has not re-asserted them for the staleness budget (PAIR's staleness
// sweep: the absence-based half of convergence, which the daemons'
// heartbeat feeds), and returns them.
func (b *broker) sweep() []job {
	if b.staleAfter <= 0 {
		return nil
	}
	var out []job
	for _, r := range b.jobs.SweepStale(b.nodeID, b.staleAfter, fmt.Sprintf("origin silent for %s", b.staleAfter)) {
		out = append(out, jobOf(r))
	}
	return out
}

// snapshot returns the Jobs list, the latest changed first.
func (b *broker) snapshot() []job {
	recs := b.store.Snapshot()
	out := make([]job, 0, len(recs))
	for _, r := range recs {
		out = append(out, jobOf(r))
	}
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
		if c := cmp.Compare(y.CreatedAt, x.CreatedAt); c != 0 {
			return c
		}
		if c := strings.Compare(x.Origin, y.Origin); c != 0 {
			return c
		}
		return strings.Compare(x.ID, y.ID)
	})
}

func (b *broker) get(origin, id string) (job, bool) {
	r, ok := b.store.Get(origin, id)
	return jobOf(r), ok
}
