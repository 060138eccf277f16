package main

import (
	"encoding/json"
	"testing"

	"nvpair-workload-manager/internal/pairbroker"
	"nvpair-workload-manager/internal/wireframe"
)

// jobsList folds every workloads:upsert and workloads:remove the daemon
// wrote to its broker, in order, through PAIR's broker's merge
// (internal/pairbroker, the model the dev cluster's brokers use): what the
// Jobs list of a PAIR broker fed by this daemon shows. A test asserting
// what a user would see uses it, not the last upsert, which is what a
// last-write store would show.
func (l *frameLog) jobsList() *pairbroker.Store {
	s := pairbroker.New(nil)
	applyFrames(s, l.all())
	return s
}

// applyFrames merges a daemon's frames to its broker, in order, into s as
// PAIR's broker does: each workloads:upsert through the merge, each
// workloads:remove as a removal of every record of (origin, id); other
// frames are not the Jobs store's. A broker whose store outlives its
// daemon's restarts (statetable_process_test.go) feeds one store this way.
func applyFrames(s *pairbroker.Store, frames []wireframe.RPC) {
	for _, f := range frames {
		switch f.Method {
		case wireframe.MethodUpsert:
			var p struct {
				WorkloadInfo json.RawMessage `json:"workloadInfo"`
			}
			if json.Unmarshal(f.Params, &p) == nil {
				if in, err := pairbroker.Parse(p.WorkloadInfo); err == nil {
					s.Apply(in)
				}
			}
		case wireframe.MethodRemove:
			var p struct {
				WorkloadID     string `json:"workloadId"`
				OriginatedFrom string `json:"originatedFrom"`
			}
			if json.Unmarshal(f.Params, &p) == nil {
				s.Remove(p.OriginatedFrom, p.WorkloadID)
			}
		}
	}
}

// A job's frames committed out of order (its producer posts each on its
// own goroutine, so the terminal can come first): the late queued frame is
// older than the end the origin holds, so no peer is sent it, and PAIR's
// broker at the peer shows the job completed.
func TestAPeersJobsListKeepsATerminalCommittedBeforeItsQueuedFrame(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	mesh(t, a, b)
	a.sendLifecycle(workload("ooo", "completed", a.id, map[string]any{"seq": 3}))
	a.sendLifecycle(workload("ooo", "queued", a.id, map[string]any{"seq": 1}))
	// A frame after both: once it is at the peer, so is whatever of ooo
	// was to be sent (one sender, version order).
	a.sendLifecycle(workload("after", "running", a.id))
	b.broker.waitUpserts("after", 1)
	if c := b.broker.upsertCount("ooo"); c != 1 {
		t.Fatalf("the peer's broker got %d upserts of ooo, want the completed one alone", c)
	}
	if r, ok := b.broker.jobsList().Get(a.id, "ooo"); !ok || r.State != "completed" {
		t.Fatalf("the peer's Jobs list shows %+v, want the job completed", r)
	}
}
