package wlmclient

import (
	"fmt"
	"maps"
	"time"
)

// Resume takes back a job this producer reported before, as the node's
// read-back lists it (ReadBack), so that a restarted producer carries on
// with it: the job's next frame has the next seq after the node's, and is
// built on the workload the node holds. A live job is leased again at once
// (its last frame sent again with Workload-Lease, as a renewal is), so a
// lease the previous process left does not run out under the new one. An
// ended job takes no frame but Rerun.
//
// The workload's originatedFrom is not sent again: the daemon stamps it.
func (c *Client) Resume(w Workload) (*Job, error) {
	id := w.ID()
	if id == "" {
		return nil, fmt.Errorf("wlmclient: Resume: the workload has no id")
	}
	state := w.State()
	switch state {
	case "queued", "running", "completed", "failed", "cancelled":
	default:
		return nil, fmt.Errorf("wlmclient: Resume %s: state %q is not a workload's", id, state)
	}
	info := maps.Clone(w.Info)
	delete(info, "originatedFrom")
	terminal := state != "queued" && state != "running"
	j := &Job{c: c, id: id, info: info, seq: w.Seq(), method: methodFor(state), ended: terminal}
	if !terminal && c.cfg.Lease > 0 {
		j.renewSoon()
	}
	return j, nil
}

// renewSoon arms the job's lease renewal to fire at once, then every
// renewEvery, as renewAfter arms it after a frame.
func (j *Job) renewSoon() {
	c := j.c
	if !j.track() {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.renew = time.AfterFunc(0, func() { j.renewNow(c.renewEvery) })
}
