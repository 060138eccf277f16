package wlmclient

import (
	"errors"
	"fmt"
	"time"
)

// A producer that mirrors another system (a scheduler) reports that
// system's own times, not the instant it noticed a change: a job seen
// running on the next poll started when the scheduler started it. These
// are the lifecycle methods with the time given; a zero time is now.

// StartAt queues the started frame (state running) with startedAt t.
func (j *Job) StartAt(t time.Time) error {
	return j.next("running", func(info map[string]any) { info["startedAt"] = millis(t) })
}

// CompleteAt queues the completed frame, the job's last, with completedAt t.
func (j *Job) CompleteAt(t time.Time) error {
	return j.next("completed", func(info map[string]any) { info["completedAt"] = millis(t) })
}

// FailAt queues the errored frame with state failed, completedAt t and
// reason, the job's last.
func (j *Job) FailAt(t time.Time, reason string) error {
	return j.next("failed", ended(t, reason))
}

// CancelAt queues the errored frame with state cancelled, completedAt t
// and reason, the job's last.
func (j *Job) CancelAt(t time.Time, reason string) error {
	return j.next("cancelled", ended(t, reason))
}

// ended sets what a failed or cancelled frame carries.
func ended(t time.Time, reason string) func(map[string]any) {
	return func(info map[string]any) {
		info["completedAt"] = millis(t)
		info["error"] = reason
	}
}

// Requeue queues a queued frame for a job that was running and waits
// again (a scheduler requeued it): its startedAt is cleared, and its seq,
// higher than the running frame's, makes it the later word on every
// member (between live frames the higher seq wins, spec 5).
func (j *Job) Requeue() error {
	return j.next("queued", func(info map[string]any) { info["startedAt"] = nil })
}

// ErrJobLive is returned by Rerun for a job that has not ended.
var ErrJobLive = errors.New("wlmclient: the job has not ended")

// Rerun starts a new run of an ended job under its id, created at t: it
// queues the job's removal, so that every member drops the run that
// ended, and then the new run's submitted frame (state queued, runId
// runID), in that order on the job's one queue, so the removal can never
// reach a member after the new run and drop it too. The job is live again
// and leased like a new one. A producer uses it when the work it reports
// goes on after its run was ended for it: a lease that ran out while the
// producer was down, a scheduler that requeued a finished job.
func (j *Job) Rerun(runID string, t time.Time) error {
	if runID == "" {
		return fmt.Errorf("wlmclient: Rerun needs a run id")
	}
	j.mu.Lock()
	if !j.ended {
		j.mu.Unlock()
		return ErrJobLive
	}
	if j.owned {
		j.mu.Unlock()
		return ErrOwned
	}
	j.ended = false // open for the removal, which ends it again
	j.mu.Unlock()
	if err := j.next("", nil); err != nil {
		j.reopen(false)
		return err
	}
	j.reopen(true)
	err := j.next("queued", func(info map[string]any) {
		info["runId"] = runID
		info["createdAt"] = millis(t)
		info["startedAt"], info["completedAt"], info["error"] = nil, nil, nil
	})
	if err != nil {
		j.reopen(false)
	}
	return err
}

// reopen sets whether the job takes frames again (Rerun's middle step).
func (j *Job) reopen(open bool) {
	j.mu.Lock()
	j.ended = !open
	j.mu.Unlock()
}

// Seq is the seq of the job's latest frame asked for (0 before any).
func (j *Job) Seq() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.seq
}

// State is the state of the job's latest frame asked for: queued,
// running, completed, failed or cancelled ("removed" after Remove).
func (j *Job) State() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.method == "workloads:remove" {
		return "removed"
	}
	s, _ := j.info["state"].(string)
	return s
}

// RunID is the run id of the job's latest frame asked for.
func (j *Job) RunID() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	s, _ := j.info["runId"].(string)
	return s
}

// millis is t in epoch milliseconds, now for a zero t.
func millis(t time.Time) int64 {
	if t.IsZero() {
		t = time.Now()
	}
	return t.UnixMilli()
}
