package wlmclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// JobSpec describes a job when it is submitted.
type JobSpec struct {
	// ID is the job's id. Leave it empty: the client mints
	// <Producer>-<host>-<pid>-<time>-<64 random bits>, which no other
	// process can mint. A caller that sets it answers for its uniqueness
	// across every producer on the node.
	ID string
	// RunID tells runs of one id apart (the id by default).
	RunID string
	// Model and Engine are required.
	Model, Engine string
	// RequesterID is who asked for the job (Config.Producer by default).
	RequesterID string
	// ScheduledOn is the node id the job runs for, if any.
	ScheduledOn string
	// ScheduledOnMember names a cluster member by its name instead; Submit
	// resolves it with GET /v1/node and fails if the node lists no such
	// member. Set at most one of ScheduledOn and ScheduledOnMember.
	ScheduledOnMember string
	// CreatedAt is when the job was created, when another system says so
	// (a scheduler's submit time); the time of Submit when zero.
	CreatedAt time.Time
	// Extra are fields of the producer's own, relayed as they are. Metadata
	// only: never prompts or responses. A name that folds to a known field
	// or to "resync" is refused, as the daemon would refuse it.
	Extra map[string]any
}

// Job is one submitted job. Its methods queue the job's next frame and
// return at once; the frames are sent in the order they were asked for,
// one at a time, each with the next seq. A Job is safe for concurrent
// use, but a job's frames are in the order its method calls took its lock.
type Job struct {
	c  *Client
	id string

	// mu guards every field below. Lock order: this mu, then the Client's
	// mu, then the outbox's mu. It is held across the outbox's file write
	// of the job's terminal frame (the frame must be durable before it can
	// be sent), never across a request.
	mu      sync.Mutex
	info    map[string]any // the workload as last sent
	method  string         // the method of the last frame
	seq     int64
	ended   bool     // a terminal frame or a removal was queued
	pending []*frame // frames waiting, the first one possibly in flight
	busy    bool     // a worker owns the job
	owned   bool     // a 409: the broker owns the workload; drop the rest
	err     error    // the last frame refused or given up on
	renew   *time.Timer
}

// frame is one request to send.
type frame struct {
	method    string
	body      []byte
	lease     int // Workload-Lease seconds; 0: none
	terminal  bool
	outboxKey string // set when the outbox holds the frame
	// attempts and delay (the next backoff, 0 before the first) are the
	// frame's tries so far; only the sender side that owns the busy job
	// touches them, one holder at a time.
	attempts int
	delay    time.Duration
}

// knownFields are the workload's fields the client sets itself.
var knownFields = []string{"id", "runId", "seq", "model", "engine", "state", "createdAt", "startedAt",
	"completedAt", "error", "requesterId", "scheduledOn", "originatedFrom", "resync"}

// Submit queues the job's submitted frame (state queued) and returns its
// handle. ctx bounds only the GET /v1/node that ScheduledOnMember needs.
func (c *Client) Submit(ctx context.Context, spec JobSpec) (*Job, error) {
	if spec.Model == "" || spec.Engine == "" {
		return nil, fmt.Errorf("wlmclient: JobSpec needs Model and Engine")
	}
	for k := range spec.Extra {
		for _, known := range knownFields {
			if strings.EqualFold(k, known) {
				return nil, fmt.Errorf("wlmclient: Extra field %q is the workload's own field %q", k, known)
			}
		}
	}
	scheduledOn := spec.ScheduledOn
	if spec.ScheduledOnMember != "" {
		if scheduledOn != "" {
			return nil, fmt.Errorf("wlmclient: set ScheduledOn or ScheduledOnMember, not both")
		}
		id, err := c.MemberID(ctx, spec.ScheduledOnMember)
		if err != nil {
			return nil, err
		}
		scheduledOn = id
	}
	id := spec.ID
	if id == "" {
		id = NewID(c.cfg.Producer)
	}
	info := map[string]any{}
	for k, v := range spec.Extra {
		info[k] = v
	}
	info["id"] = id
	info["runId"] = cmp(spec.RunID, id)
	info["model"] = spec.Model
	info["engine"] = spec.Engine
	created := spec.CreatedAt
	if created.IsZero() {
		created = time.Now()
	}
	info["createdAt"] = created.UnixMilli()
	info["startedAt"] = nil
	info["completedAt"] = nil
	info["error"] = nil
	info["requesterId"] = cmp(spec.RequesterID, c.cfg.Producer)
	if scheduledOn != "" {
		info["scheduledOn"] = scheduledOn
	}
	j := &Job{c: c, id: id, info: info}
	if err := j.next("queued", nil); err != nil {
		return nil, err
	}
	return j, nil
}

// cmp is s, or def when s is empty.
func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ID is the job's id.
func (j *Job) ID() string { return j.id }

// Err is why the job's latest failed frame was not taken: a *StatusError
// for a frame the daemon refused for good (a 409 included, after which
// the job's frames are dropped and its methods return ErrOwned), or the
// last answer or transport error of a frame that ran out of attempts. It
// is nil while every frame went through.
func (j *Job) Err() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.err
}

// Start queues the started frame (state running, startedAt now).
func (j *Job) Start() error { return j.StartAt(time.Now()) }

// Complete queues the completed frame, the job's last.
func (j *Job) Complete() error { return j.CompleteAt(time.Now()) }

// Fail queues the errored frame with state failed and reason, the job's last.
func (j *Job) Fail(reason string) error { return j.FailAt(time.Now(), reason) }

// Cancel queues the errored frame with state cancelled, the job's last.
func (j *Job) Cancel(reason string) error { return j.CancelAt(time.Now(), reason) }

// Remove queues the job's removal (workloads:remove), its last frame: the
// job leaves every member's list instead of showing its final state.
func (j *Job) Remove() error {
	return j.next("", nil)
}

// methodFor is the only place a method is chosen: from the state, so a
// frame's method always carries its state.
func methodFor(state string) string {
	switch state {
	case "queued":
		return "workload:submitted"
	case "running":
		return "workload:started"
	case "completed":
		return "workload:completed"
	default: // failed, cancelled
		return "workload:errored"
	}
}

// next queues the job's frame for state after apply changed the workload.
func (j *Job) next(state string, apply func(map[string]any)) error {
	c := j.c
	terminal := state != "queued" && state != "running"
	j.mu.Lock()
	if j.ended {
		j.mu.Unlock()
		return ErrJobEnded
	}
	if j.owned {
		j.mu.Unlock()
		return ErrOwned
	}
	// The next workload is built on a copy, so a frame that is not queued
	// (a full queue, a closed client) leaves the job as it was: its seq
	// free again, its lease renewals sending its last queued frame.
	seq := j.seq + 1
	info := make(map[string]any, len(j.info)+2)
	for k, v := range j.info {
		info[k] = v
	}
	var method string
	var params map[string]any
	if state == "" { // a removal
		method, params = "workloads:remove", map[string]any{"workloadId": j.id}
	} else {
		if apply != nil {
			apply(info)
		}
		info["seq"], info["state"] = seq, state
		method, params = methodFor(state), map[string]any{"workloadInfo": info}
	}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
	if err != nil {
		j.mu.Unlock()
		return fmt.Errorf("wlmclient: %w", err)
	}
	f := &frame{method: method, body: body, terminal: terminal}
	if !terminal && c.cfg.Lease > 0 {
		f.lease = int(c.cfg.Lease / time.Second)
	}
	if err := c.reserve(); err != nil {
		j.mu.Unlock()
		return err
	}
	// The frame is queued under the job's lock, so two goroutines' frames
	// of one job enter the queue in the order of their seq. The outbox
	// write (terminal frames only) happens here too: the frame is durable
	// before it can be sent, and a job has one terminal frame.
	if terminal && c.outbox != nil {
		key := j.id + "\x00" + strconv.FormatInt(seq, 10)
		switch err := c.outbox.add(outboxEntry{Key: key, ID: j.id, Method: method, Body: body}); err {
		case nil:
			f.outboxKey = key
		case errOutboxFull:
			c.outboxFull.Add(1)
		default:
			c.log.Warn("wlmclient: outbox", "err", err)
		}
	}
	j.seq, j.info, j.method, j.ended = seq, info, method, terminal
	wake := j.appendLocked(f)
	j.mu.Unlock()
	if wake {
		c.wake(j)
	}
	if terminal {
		j.stopRenewing()
	} else if f.lease > 0 {
		j.renewAfter(c.renewEvery)
	}
	return nil
}

// track makes the client hold j for its renewals, and says false once the
// client is closed.
func (j *Job) track() bool {
	c := j.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.jobs[j] = struct{}{}
	return true
}

// renewAfter (re)arms the job's lease renewal.
func (j *Job) renewAfter(d time.Duration) {
	if !j.track() {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ended {
		return
	}
	if j.renew != nil {
		j.renew.Stop()
	}
	j.renew = time.AfterFunc(d, func() { j.renewNow(d) })
}

// renewNow sends the job's last frame again, unchanged but for the lease
// header, when nothing of the job is waiting (a waiting frame carries the
// lease itself), and arms the next renewal.
func (j *Job) renewNow(d time.Duration) {
	c := j.c
	j.mu.Lock()
	if j.ended || j.owned || j.renew == nil {
		j.mu.Unlock()
		return
	}
	var f *frame
	if len(j.pending) == 0 {
		body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": j.method,
			"params": map[string]any{"workloadInfo": j.info}})
		if err == nil {
			f = &frame{method: j.method, body: body, lease: int(c.cfg.Lease / time.Second)}
		}
	}
	wake := false
	if f != nil {
		if err := c.reserve(); err == ErrClosed {
			// Close stopped the renewals; this one raced it.
			j.renew = nil
			j.mu.Unlock()
			return
		} else if err != nil {
			c.log.Warn("wlmclient: lease renewal not queued", "id", j.id, "err", err)
		} else {
			wake = j.appendLocked(f)
		}
	}
	j.renew = time.AfterFunc(d, func() { j.renewNow(d) })
	j.mu.Unlock()
	if wake {
		c.wake(j)
	}
}

// stopRenewing ends the job's renewals.
func (j *Job) stopRenewing() {
	j.mu.Lock()
	if j.renew != nil {
		j.renew.Stop()
		j.renew = nil
	}
	j.mu.Unlock()
	c := j.c
	c.mu.Lock()
	if c.jobs != nil {
		delete(c.jobs, j)
	}
	c.mu.Unlock()
}

// NewID mints a job id: prefix, host, process id, the time in
// milliseconds and 64 random bits, each part cut to keep the id within the
// daemon's 256 bytes. Two processes mint the same id only if they share
// all of these, which the random bits alone make a 1 in 2^64 chance.
func NewID(prefix string) string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '_'
	}, host)
	var b [8]byte
	rand.Read(b[:])
	return fmt.Sprintf("%.64s-%.64s-%d-%s-%s", prefix, host, os.Getpid(),
		strconv.FormatInt(time.Now().UnixMilli(), 36), hex.EncodeToString(b[:]))
}
