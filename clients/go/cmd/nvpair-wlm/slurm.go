package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

// The Slurm bridge (nvpair-wlm slurm): every --interval it reads Slurm's
// own view of its jobs (squeue --json), picks this node's, and reports
// each as a workload through the client, which orders, leases, retries
// and parks the frames. See docs/producer-guide.md ("nvpair-wlm slurm")
// for the mapping, the ids, which node reports which job, and what a
// restart of the bridge, of Slurm's controller or of the daemon does.

// bridgeConfig is what the flags give the bridge.
type bridgeConfig struct {
	interval  time.Duration // between polls
	node      string        // this node's Slurm node name: the jobs whose batch host it is are this node's
	pending   bool          // this node also reports the jobs no node runs yet
	squeue    string        // the squeue command
	cluster   string        // the cluster's name in ids; "" takes the job's
	statePath string        // the state file
	maxJobs   int           // the jobs tracked at once
	maxBytes  int64         // the squeue output read
}

// bridge follows Slurm's jobs. Its methods run on one goroutine.
type bridge struct {
	cfg     bridgeConfig
	c       *wlmclient.Client
	log     *slog.Logger
	jobs    map[string]*tracked       // by key
	handles map[string]*wlmclient.Job // the client's job of each tracked key that has one
	now     func() time.Time
	squeue  func(ctx context.Context) (squeueView, error)

	actions []func() // this poll's frames, handed to the client once the state file holds them
	dirty   bool     // the state file is behind

	// Conditions logged once when they start and once when they end.
	squeueErr    string // the last poll's failure, "" when it answered
	overJobs     int    // jobs not tracked in the latest poll for --max-jobs
	unknownState map[string]bool
}

// engine is the workload's engine for every Slurm job.
const engine = "slurm"

// keyField is the workload's own field that names the Slurm job, so that a
// bridge that lost its state file knows its jobs in the read-back.
const keyField = "slurmJob"

func newBridge(cfg bridgeConfig, c *wlmclient.Client, log *slog.Logger) *bridge {
	b := &bridge{cfg: cfg, c: c, log: log, jobs: map[string]*tracked{}, handles: map[string]*wlmclient.Job{},
		now: time.Now, unknownState: map[string]bool{}}
	b.squeue = b.runSqueue
	return b
}

// ---- recovery ------------------------------------------------------------

// recover takes back what a previous bridge reported: the state file's
// jobs, and what the node's read-back shows of them (the node's word wins
// on the state; the higher seq is kept). A job the node shows that the
// file does not know (a lost file) is taken from the read-back. Without a
// read-back (the daemon is down), each live job's state is sent again on
// the first poll, in case the last frames before the restart were lost.
func (b *bridge) recover(ctx context.Context) {
	jobs, err := loadState(b.cfg.statePath)
	if err != nil {
		b.log.Warn("slurm bridge: state file not read; starting from the node's read-back", "err", err)
	}
	for _, t := range jobs {
		b.jobs[t.Key] = t
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ws, err := b.c.ReadBack(rctx, "")
	if err != nil {
		b.log.Warn("slurm bridge: the node's read-back failed; sending each live job's state again", "err", err, "jobs", len(b.jobs))
	}
	shown := map[string]wlmclient.Workload{}
	for _, w := range ws {
		if key, ok := w.Info[keyField].(string); ok && key != "" && w.Info["engine"] == engine && strings.HasPrefix(w.ID(), "slurm-") {
			shown[w.ID()] = w
		}
	}
	for _, t := range b.jobs {
		w, ok := shown[t.ID]
		delete(shown, t.ID)
		switch {
		case ok:
			b.adopt(t, w)
		case err == nil && !t.live():
			// The node no longer shows it: ended and past its retention.
		default:
			t.Reported = false
			b.resume(t, nil)
		}
	}
	// What the node shows and the file does not know: a lost or older file.
	for _, w := range shown {
		t := trackedFrom(w)
		if old, clash := b.jobs[t.Key]; clash && old.ID != t.ID {
			// The file's job has the key now (Slurm's state was wiped);
			// this one is an older job of the same key, settled as gone.
			t.Key = "gone " + t.ID
		}
		b.jobs[t.Key] = t
		b.adopt(t, w)
	}
	b.dirty = true
	b.log.Info("slurm bridge: recovered", "jobs", len(b.jobs), "readBack", err == nil)
}

// adopt takes the node's word on a job it shows: its state, its run, and
// its seq unless the file's is higher (frames the file recorded that never
// reached the node leave a gap, which is harmless).
func (b *bridge) adopt(t *tracked, w wlmclient.Workload) {
	if isTerminal(t.State) && !isTerminal(w.State()) {
		// The file recorded an end the node never got (the bridge died
		// between the two): it is sent when the job is settled.
		t.LostEnd = t.State
	}
	t.State, t.Reported = w.State(), true
	// A lease that ran out while no bridge reported the job ended it for
	// the bridge (producer stopped reporting): not the job's own end.
	errText, _ := w.Info["error"].(string)
	t.Expired = w.State() == "failed" && strings.HasPrefix(errText, "producer stopped reporting")
	if r, ok := w.Info["runId"].(string); ok && r != "" {
		t.RunID = r
	}
	t.Seq = max(t.Seq, w.Seq())
	b.resume(t, &w)
}

// resume makes the client's job of t, built on the workload the node
// holds (w) or, without one, on what the file says was reported.
func (b *bridge) resume(t *tracked, w *wlmclient.Workload) {
	if t.State == "removed" || t.State == "" {
		return // the node holds none of its runs to go on with
	}
	var info map[string]any
	if w != nil {
		info = w.Info
	} else {
		info = b.infoOf(t)
	}
	info["seq"] = t.Seq
	j, err := b.c.Resume(wlmclient.Workload{Info: info})
	if err != nil {
		b.log.Warn("slurm bridge: cannot take back a job", "job", t.Key, "id", t.ID, "err", err)
		return
	}
	b.handles[t.Key] = j
}

// infoOf is the workload the file says was last reported of t.
func (b *bridge) infoOf(t *tracked) map[string]any {
	info := map[string]any{"id": t.ID, "runId": t.RunID, "model": t.Model, "engine": engine, "state": t.State,
		"createdAt": t.Created, "startedAt": nil, "completedAt": nil, "error": nil, "requesterId": t.Requester, keyField: t.Key}
	if t.Started != 0 {
		info["startedAt"] = t.Started
	}
	if isTerminal(t.State) {
		info["completedAt"], info["error"] = t.Ended, nilIfEmpty(t.Error)
	}
	return info
}

// trackedFrom is the tracked job of a workload the node shows.
func trackedFrom(w wlmclient.Workload) *tracked {
	key, _ := w.Info[keyField].(string)
	t := &tracked{Key: key, ID: w.ID(), State: w.State(), Seq: w.Seq()}
	t.RunID, _ = w.Info["runId"].(string)
	t.Model, _ = w.Info["model"].(string)
	t.Requester, _ = w.Info["requesterId"].(string)
	if i := strings.LastIndexByte(t.ID, '-'); i >= 0 {
		t.Submit, _ = strconv.ParseInt(t.ID[i+1:], 36, 64)
	}
	t.LastSub = t.Submit
	return t
}

// ---- one poll ------------------------------------------------------------

// poll reads Slurm's view once and reports what changed. When squeue
// fails nothing is decided: a job absent from a view that was not read is
// not a job that left it.
func (b *bridge) poll(ctx context.Context) {
	view, err := b.squeue(ctx)
	if err != nil {
		if msg := err.Error(); msg != b.squeueErr {
			b.log.Warn("slurm bridge: squeue failed; every job keeps its last state and its lease", "err", err)
			b.squeueErr = msg
		}
		return
	}
	if b.squeueErr != "" {
		b.log.Info("slurm bridge: squeue answers again")
		b.squeueErr = ""
	}
	jobs := view.Jobs
	if !b.cfg.pending {
		// A pending array not split yet is never this node's.
		jobs = slices.DeleteFunc(slices.Clone(jobs), func(j sjob) bool { return j.Tasks != "" })
	}
	jobs, dropped := expandArrays(jobs, b.cfg.maxJobs)
	for _, t := range b.jobs {
		t.seen = false
	}
	for _, j := range jobs {
		if t := b.jobs[j.Key]; t != nil && !sameJob(t, j) {
			b.settle(t, fmt.Sprintf("Slurm job %s is gone: its job id names another job now (Slurm's state was wiped)", t.Key))
			b.forget(j.Key)
		}
		t := b.jobs[j.Key]
		if !b.mine(j) {
			if t != nil {
				t.seen = true
				b.handOver(t)
			}
			continue
		}
		if t == nil {
			if len(b.jobs) >= b.cfg.maxJobs {
				dropped++
				continue
			}
			t = b.track(j)
		}
		t.seen = true
		t.LastSub, t.Restarts = j.Submit.Unix(), max(t.Restarts, j.Restarts)
		b.follow(t, j)
	}
	for key, t := range b.jobs {
		if !t.seen {
			b.settle(t, fmt.Sprintf("Slurm job %s left Slurm's view unobserved (squeue keeps an ended job for MinJobAge, 300 s by default): its end is unknown", t.Key))
			b.forget(key)
		}
	}
	b.noteDropped(dropped)
	b.flush()
}

// flush writes the state file when it is behind, then hands this poll's
// frames to the client: the file never holds less than the node was sent.
func (b *bridge) flush() {
	if b.dirty {
		list := make([]*tracked, 0, len(b.jobs))
		for _, t := range b.jobs {
			list = append(list, t)
		}
		slices.SortFunc(list, func(x, y *tracked) int { return strings.Compare(x.Key, y.Key) })
		if err := saveState(b.cfg.statePath, list); err != nil {
			b.log.Error("slurm bridge: state file not written; a restart may give jobs new ids", "err", err)
		} else {
			b.dirty = false
		}
	}
	for _, a := range b.actions {
		a()
	}
	b.actions = b.actions[:0]
}

// mine reports whether this node reports j: the node that runs (ran) its
// batch script does; a job no node has run is reported by the node the
// operator named with --pending.
func (b *bridge) mine(j sjob) bool {
	if j.BatchHost != "" {
		return j.BatchHost == b.cfg.node
	}
	return b.cfg.pending
}

// sameJob reports whether j is the job t tracks: the same submit time, or
// a requeue (which moves the submit time and counts a restart). After a
// Slurm state wipe job ids start again at 1: a new job with a tracked key
// has neither.
func sameJob(t *tracked, j sjob) bool {
	s := j.Submit.Unix()
	return s == t.LastSub || s == t.Submit || j.Restarts > t.Restarts
}

// track starts following a job first seen now.
func (b *bridge) track(j sjob) *tracked {
	submit := j.Submit
	if submit.IsZero() {
		submit = b.now()
	}
	cluster := b.cfg.cluster
	if cluster == "" {
		cluster = j.Cluster
	}
	id := fmt.Sprintf("slurm-%s-%s-%s", idPart(cmpStr(cluster, "slurm"), 64), idPart(j.Key, 64), strconv.FormatInt(submit.Unix(), 36))
	t := &tracked{Key: j.Key, ID: id, RunID: id, Submit: submit.Unix(), LastSub: submit.Unix(), Restarts: j.Restarts,
		Model: clipText(cmpStr(j.Name, "slurm-job"), 256), Requester: clipText("slurm/"+cmpStr(j.User, "unknown"), 256),
		Created: submit.UnixMilli(), Reported: true}
	b.jobs[j.Key] = t
	b.dirty = true
	return t
}

// follow reports what changed of t, whose job Slurm shows as j: the
// workload walks its states in order (queued, running, its end), never
// skipping one the job went through, with Slurm's own times.
func (b *bridge) follow(t *tracked, j sjob) {
	want := workloadState(j)
	if want == "" {
		b.noteUnknown(j)
		return
	}
	cur := t.State
	if cur != "" && !t.live() {
		if isTerminal(want) && !t.Expired {
			return // ended; nothing more to say
		}
		// Live again after its run ended (Slurm requeued a finished job),
		// or its run was ended for it by a lease that ran out while no
		// bridge reported it: a new run tells what Slurm says.
		b.rerun(t)
		cur = "queued"
	}
	if cur == "" {
		b.submit(t)
		cur = "queued"
	}
	again := !t.Reported // the node may not hold cur: say it again
	switch {
	case want == "queued":
		if cur == "running" || again {
			b.frame(t, "queued", (*wlmclient.Job).Requeue)
		}
	case want == "running":
		if cur == "queued" || again {
			b.start(t, j)
		}
	default:
		if cur == "queued" && j.BatchHost != "" {
			b.start(t, j) // it ran between two polls
		}
		b.end(t, j, want)
	}
}

// submit reports t queued, created at Slurm's submit time. A submit the
// client refuses (its queue full) forgets the job, which the next poll
// tracks afresh under the same id.
func (b *bridge) submit(t *tracked) {
	t.State, t.Seq, t.Reported, t.submitted, b.dirty = "queued", t.Seq+1, true, true, true
	spec := wlmclient.JobSpec{ID: t.ID, RunID: t.RunID, Model: t.Model, Engine: engine, RequesterID: t.Requester,
		CreatedAt: time.UnixMilli(t.Created), Extra: map[string]any{keyField: t.Key}}
	b.logChange(t, "queued")
	b.actions = append(b.actions, func() {
		t.submitted = false
		j, err := b.c.Submit(context.Background(), spec)
		if err != nil {
			b.log.Warn("slurm bridge: job not reported; tried again on the next poll", "job", t.Key, "id", t.ID, "err", err)
			delete(b.handles, t.Key)
			if b.jobs[t.Key] == t {
				delete(b.jobs, t.Key)
			}
			return
		}
		b.handles[t.Key] = j
	})
}

// start reports t running since Slurm's start time.
func (b *bridge) start(t *tracked, j sjob) {
	started := j.Start
	if started.IsZero() {
		started = b.now()
	}
	t.Started = started.UnixMilli()
	b.frame(t, "running", func(h *wlmclient.Job) error { return h.StartAt(started) })
}

// end reports t's end at Slurm's end time, with Slurm's reason for a
// failed or cancelled job.
func (b *bridge) end(t *tracked, j sjob, state string) {
	ended := j.End
	if ended.IsZero() {
		ended = b.now()
	}
	t.Ended = ended.UnixMilli()
	t.Error = ""
	if state != "completed" {
		t.Error = endReason(j)
	}
	reason := t.Error
	b.frame(t, state, func(h *wlmclient.Job) error { return endAs(h, state, ended, reason) })
}

// settle ends a live job Slurm no longer shows as this node's: failed,
// with why, never a guessed success; or with the end the file recorded
// when the node never got it.
func (b *bridge) settle(t *tracked, why string) {
	if !t.live() {
		return
	}
	state := "failed"
	if t.LostEnd != "" {
		state = t.LostEnd
	} else {
		t.Ended, t.Error = b.now().UnixMilli(), why
	}
	ended, reason := time.UnixMilli(t.Ended), t.Error
	t.LostEnd = ""
	b.frame(t, state, func(h *wlmclient.Job) error { return endAs(h, state, ended, reason) })
}

// endAs queues h's end in state at ended, with reason when it is not
// completed.
func endAs(h *wlmclient.Job, state string, ended time.Time, reason string) error {
	switch state {
	case "completed":
		return h.CompleteAt(ended)
	case "cancelled":
		return h.CancelAt(ended, reason)
	}
	return h.FailAt(ended, reason)
}

// handOver removes the queued workload of a job this node reported as
// pending once another node runs it: that node reports it from there on.
func (b *bridge) handOver(t *tracked) {
	if t.State != "queued" {
		return
	}
	b.frame(t, "removed", (*wlmclient.Job).Remove)
}

// rerun starts a new run of an ended job that is live again; a job the
// node holds nothing of (removed before a restart) is submitted afresh.
func (b *bridge) rerun(t *tracked) {
	t.Runs++
	t.RunID = fmt.Sprintf("%s~%d", t.ID, t.Runs)
	t.Started, t.Ended, t.Error, t.LostEnd, t.Expired = 0, 0, "", "", false
	if b.handles[t.Key] == nil && !b.pendingHandle(t) {
		b.submit(t)
		return
	}
	runID, created := t.RunID, time.UnixMilli(t.Created)
	t.Seq++ // the removal
	b.frame(t, "queued", func(h *wlmclient.Job) error { return h.Rerun(runID, created) })
}

// pendingHandle reports whether an action of this poll makes t's handle.
func (b *bridge) pendingHandle(t *tracked) bool { return t.submitted }

// frame records t's next state, then queues the client's call that sends
// it (flush runs it once the state file holds the state). A call the
// client refuses (its queue full) leaves the state to be sent again on
// the next poll.
func (b *bridge) frame(t *tracked, state string, send func(*wlmclient.Job) error) {
	t.State, t.Seq, t.Reported, b.dirty = state, t.Seq+1, true, true
	b.logChange(t, state)
	b.actions = append(b.actions, func() {
		h := b.handles[t.Key]
		if h == nil {
			return // its submit was refused, and the job is tracked afresh
		}
		if err := send(h); err != nil {
			t.Reported = false
			b.log.Warn("slurm bridge: frame not queued; sent again on the next poll", "job", t.Key, "id", t.ID, "state", state, "err", err)
		}
	})
}

// forget drops a job Slurm no longer shows, once its last frame is queued.
func (b *bridge) forget(key string) {
	delete(b.jobs, key)
	b.dirty = true
	b.actions = append(b.actions, func() { delete(b.handles, key) })
}

// logChange is the one line per state change.
func (b *bridge) logChange(t *tracked, state string) {
	b.log.Info("slurm bridge: job reported", "job", t.Key, "id", t.ID, "state", state)
}

// noteUnknown says once per job and state that the bridge does not know
// what a state means (the job keeps what was reported).
func (b *bridge) noteUnknown(j sjob) {
	k := j.Key + " " + j.State + strings.Join(j.Flags, ",")
	if b.unknownState[k] || len(b.unknownState) >= 1024 {
		return
	}
	b.unknownState[k] = true
	b.log.Warn("slurm bridge: a job state the bridge does not map; the job keeps its last state", "job", j.Key, "state", j.State, "flags", strings.Join(j.Flags, ","))
}

// noteDropped logs the jobs left untracked at --max-jobs, once when it
// starts and once when it stops.
func (b *bridge) noteDropped(n int) {
	switch {
	case n > 0 && b.overJobs == 0:
		b.log.Warn("slurm bridge: jobs not reported: over --max-jobs", "maxJobs", b.cfg.maxJobs, "notReported", n)
	case n == 0 && b.overJobs > 0:
		b.log.Info("slurm bridge: every job is reported again", "maxJobs", b.cfg.maxJobs)
	}
	b.overJobs = n
}

// ---- squeue --------------------------------------------------------------

// squeueTimeout bounds one squeue run: a controller that does not answer
// makes squeue retry for its MessageTimeout (10 s by default) first.
const squeueTimeout = 30 * time.Second

// runSqueue runs squeue --json and reads its output as it comes, at most
// --squeue-max-bytes of it.
func (b *bridge) runSqueue(ctx context.Context) (squeueView, error) {
	ctx, cancel := context.WithTimeout(ctx, squeueTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.cfg.squeue, "--json")
	var stderr bytes.Buffer
	cmd.Stderr = &capped{w: &stderr, n: 4096}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return squeueView{}, err
	}
	if err := cmd.Start(); err != nil {
		return squeueView{}, err
	}
	view, perr := parseSqueue(out, b.cfg.maxBytes)
	if perr != nil {
		cmd.Process.Kill()
	}
	io.Copy(io.Discard, out)
	werr := cmd.Wait()
	if werr != nil {
		first, _, _ := strings.Cut(strings.TrimSpace(stderr.String()), "\n")
		return squeueView{}, fmt.Errorf("%s --json: %v: %s", b.cfg.squeue, werr, clipText(first, 200))
	}
	if perr != nil {
		return squeueView{}, perr
	}
	return view, nil
}

// capped writes at most n bytes to w and drops the rest.
type capped struct {
	w io.Writer
	n int
}

func (c *capped) Write(p []byte) (int, error) {
	if c.n > 0 {
		k := min(len(p), c.n)
		c.w.Write(p[:k])
		c.n -= k
	}
	return len(p), nil
}

// ---- small helpers -------------------------------------------------------

var idUnsafe = regexp.MustCompile(`[^A-Za-z0-9._]`)

// idPart is s as a part of an id: letters, digits, dots and underscores,
// at most n bytes.
func idPart(s string, n int) string { return clipText(idUnsafe.ReplaceAllString(s, "_"), n) }

// cmpStr is s, or def when s is empty.
func cmpStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
