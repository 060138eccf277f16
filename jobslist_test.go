package main

import (
	"encoding/json"
	"errors"
	"testing"

	"nvpair-workload-manager/internal/pairbroker"
	"nvpair-workload-manager/internal/pairshadow"
	"nvpair-workload-manager/internal/testframe"
	"nvpair-workload-manager/internal/wireframe"
)

// jobsList folds every workloads:upsert and workloads:remove the daemon
// wrote to its broker, in order, through PAIR's broker's merge
// (internal/pairbroker, the model the dev cluster's brokers use): what the
// Jobs list of a PAIR broker fed by this daemon shows. A test asserting
// what a user would see uses it, not the last upsert, which is what a
// last-write store would show. When ../shared holds PAIR's own store, the
// same frames go to it too (internal/pairshadow), and a Jobs list that is
// not the model's fails the test, naming the job.
func (l *frameLog) jobsList() *pairbroker.Store {
	j := pairshadow.NewJudged(nil, l.shadow())
	defer j.Close()
	eachJobsFrame(l.all(), func(info json.RawMessage) { _, _ = j.Upsert(info) }, func(origin, id string) { j.Remove(origin, id) })
	for _, d := range j.Disagreements() {
		l.t.Errorf("PAIR's store disagrees with the model: %s", d)
	}
	return j.Model()
}

// eachJobsFrame hands what reaches PAIR's Jobs store of a daemon's frames
// to its broker, in order: each workloads:upsert's workloadInfo, each
// workloads:remove's origin and id. Other frames are not the store's.
func eachJobsFrame(frames []wireframe.RPC, upsert func(json.RawMessage), remove func(origin, id string)) {
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

// shadow starts PAIR's store for one Jobs list (startShadow).
func (l *frameLog) shadow() *pairshadow.Shadow { return startShadow(l.t) }

// startShadow starts PAIR's store, or returns nil, saying so in the test's
// log, when ../shared has none.
func startShadow(t testing.TB) *pairshadow.Shadow {
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

// A job's frames committed out of order (its producer posts each on its
// own goroutine, so the terminal can come first): the late queued frame is
// older than the end the origin holds, so no peer is sent it, and PAIR's
// broker at the peer shows the job completed.
func TestAPeersJobsListKeepsATerminalCommittedBeforeItsQueuedFrame(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	mesh(t, a, b)
	a.sendLifecycle(testframe.Workload("ooo", "completed", a.id, map[string]any{"seq": 3}))
	a.sendLifecycle(testframe.Workload("ooo", "queued", a.id, map[string]any{"seq": 1}))
	// A frame after both: once it is at the peer, so is whatever of ooo
	// was to be sent (one sender, version order).
	a.sendLifecycle(testframe.Workload("after", "running", a.id))
	b.broker.waitUpserts("after", 1)
	if c := b.broker.upsertCount("ooo"); c != 1 {
		t.Fatalf("the peer's broker got %d upserts of ooo, want the completed one alone", c)
	}
	if r, ok := b.broker.jobsList().Get(a.id, "ooo"); !ok || r.State != "completed" {
		t.Fatalf("the peer's Jobs list shows %+v, want the job completed", r)
	}
}
