package main

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/pairbroker"
	"nvpair-workload-manager/internal/pairshadow"
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
	for _, f := range l.all() {
		switch f.Method {
		case wireframe.MethodUpsert:
			var p struct {
				WorkloadInfo json.RawMessage `json:"workloadInfo"`
			}
			if json.Unmarshal(f.Params, &p) == nil {
				j.Upsert(p.WorkloadInfo)
			}
		case wireframe.MethodRemove:
			var p struct {
				WorkloadID     string `json:"workloadId"`
				OriginatedFrom string `json:"originatedFrom"`
			}
			if json.Unmarshal(f.Params, &p) == nil {
				j.Remove(p.OriginatedFrom, p.WorkloadID)
			}
		}
	}
	for _, d := range j.Disagreements() {
		l.t.Errorf("PAIR's store disagrees with the model: %s", d)
	}
	return j.Model()
}

// shadow starts PAIR's store for one Jobs list, or returns nil, saying so
// once in the test's log, when ../shared has none.
func (l *frameLog) shadow() *pairshadow.Shadow {
	bin, err := pairshadow.Program(".")
	if errors.Is(err, pairshadow.ErrNotFound) {
		l.t.Logf("no shadow of PAIR's store: %v", err)
		return nil
	}
	if err != nil {
		l.t.Fatal(err)
	}
	sh, err := pairshadow.Start(bin)
	if err != nil {
		l.t.Fatal(err)
	}
	return sh
}

// brokerLineMaxArg is the --broker-line-max a daemon's arguments give, 0
// when they give none.
func brokerLineMaxArg(args []string) int {
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--broker-line-max=")
		if !ok && a == "--broker-line-max" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// A job's frames relayed out of order (its producer posts each on its own
// goroutine, so the terminal can come first): the peer's daemon relays
// both, the last upsert its broker gets is the queued one, and PAIR's
// broker still shows the job completed.
func TestAPeersJobsListKeepsATerminalRelayedBeforeItsQueuedFrame(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	mesh(t, a, b)
	a.sendLifecycle(workload("ooo", "completed", a.id, map[string]any{"seq": 3}))
	a.sendLifecycle(workload("ooo", "queued", a.id, map[string]any{"seq": 1}))
	b.broker.waitUpserts("ooo", 2)
	ups := b.upserts()
	if last := ups[len(ups)-1]; last["state"] != "queued" {
		t.Fatalf("the last upsert is %v; the test wants the queued frame last", last["state"])
	}
	if r, ok := b.broker.jobsList().Get(a.id, "ooo"); !ok || r.State != "completed" {
		t.Fatalf("the peer's Jobs list shows %+v, want the job completed", r)
	}
}
