package pairshadow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"nvpair-workload-manager/internal/dev/pairbroker"
)

// Judged is a broker's Jobs store, the model of internal/dev/pairbroker, with
// PAIR's store beside it when there is one. Every change goes to both, at
// the same instant and in the same order, so that after any of them the
// two must hold the same Jobs list; Disagreements says where they do not.
type Judged struct {
	// mu serializes the operations: each runs on both stores before the
	// next starts, so both see one sequence. Reads of the model alone
	// (Model's Snapshot, Get, Len) need it not.
	mu     sync.Mutex
	clock  func() time.Time
	at     time.Time // the instant of the operation in progress; read by the model's clock
	model  *pairbroker.Store
	shadow *Shadow // nil: no shadow
}

// NewJudged returns an empty Jobs store reading the time from clock
// (time.Now when nil), judged by shadow when it is not nil.
func NewJudged(clock func() time.Time, shadow *Shadow) *Judged {
	if clock == nil {
		clock = time.Now
	}
	j := &Judged{clock: clock, shadow: shadow}
	// The model reads the time only inside an operation, under mu, so it
	// reads the instant the shadow is given.
	j.model = pairbroker.New(func() time.Time { return j.at })
	return j
}

// Model is the model's store, for reading.
func (j *Judged) Model() *pairbroker.Store { return j.model }

// begin starts an operation: it takes mu and fixes its instant. The
// instant is the wall clock's alone (Round(0) drops the monotonic
// reading): PAIR's store is given it as Unix nanoseconds, and both stores
// must measure the same intervals, or a wall-clock step during a run would
// show as a disagreement that neither store made.
func (j *Judged) begin() time.Time {
	j.mu.Lock()
	j.at = j.clock().Round(0)
	return j.at
}

// Upsert is a workloads:upsert of info (or a frame the broker's own
// producers emit): the model's Parse and Apply, and PAIR's ParseIncoming
// and Apply. A payload the model refuses still goes to PAIR's store, which
// may take it: the comparison then shows the difference.
func (j *Judged) Upsert(info json.RawMessage) (pairbroker.Outcome, error) {
	now := j.begin()
	defer j.mu.Unlock()
	if j.shadow != nil {
		j.shadow.Upsert(now, info)
	}
	in, err := pairbroker.Parse(info)
	if err != nil {
		return 0, err
	}
	return j.model.Apply(in), nil
}

// Remove is a workloads:remove of (origin, id).
func (j *Judged) Remove(origin, id string) int {
	now := j.begin()
	defer j.mu.Unlock()
	if j.shadow != nil {
		j.shadow.Remove(now, origin, id)
	}
	return j.model.Remove(origin, id)
}

// FailNode is the node-loss inference for node (pairbroker.Store.FailNode).
func (j *Judged) FailNode(node, reason string) []pairbroker.Record {
	now := j.begin()
	defer j.mu.Unlock()
	if j.shadow != nil {
		j.shadow.FailNode(now, node, reason)
	}
	return j.model.FailNode(node, reason)
}

// SweepStale is the staleness sweep (pairbroker.Store.SweepStale).
func (j *Judged) SweepStale(self string, budget time.Duration, reason string) []pairbroker.Record {
	now := j.begin()
	defer j.mu.Unlock()
	if j.shadow != nil {
		j.shadow.Sweep(now, self, budget, reason)
	}
	return j.model.SweepStale(self, budget, reason)
}

// Replay is what the broker replays to its restarted daemon, from the
// model (pairbroker.Store.Replay); with a shadow, it also returns where
// PAIR's ReplayForNode at the same instant would replay another set.
func (j *Judged) Replay(self string, window time.Duration) ([]pairbroker.Record, []string) {
	now := j.begin()
	defer j.mu.Unlock()
	recs := j.model.Replay(self, window)
	if j.shadow == nil {
		return recs, nil
	}
	theirs, err := j.shadow.Replay(now, self, window)
	if err != nil {
		return recs, []string{err.Error()}
	}
	return recs, Diff("replay", infosOf(recs), theirs)
}

// Disagreements compares the two Jobs lists now: nil when they agree (or
// there is no shadow), else one line per job that differs.
func (j *Judged) Disagreements() []string {
	now := j.begin()
	defer j.mu.Unlock()
	if j.shadow == nil {
		return nil
	}
	theirs, err := j.shadow.Snapshot(now)
	if err != nil {
		return []string{err.Error()}
	}
	return Diff("Jobs list", infosOf(j.model.Snapshot()), theirs)
}

// Close ends the shadow's program.
func (j *Judged) Close() error {
	if j.shadow == nil {
		return nil
	}
	return j.shadow.Close()
}

func infosOf(recs []pairbroker.Record) []json.RawMessage {
	out := make([]json.RawMessage, len(recs))
	for i, r := range recs {
		out[i] = r.Info
	}
	return out
}

// Diff compares the model's workload objects with PAIR's store's, as
// multisets (PAIR's Snapshot has an order of its own, and ties in it are
// unordered), keyed the way both stores key a workload. It returns one
// line per key whose objects differ, naming the job, sorted.
func Diff(what string, model, pair []json.RawMessage) []string {
	ours, theirs := byKey(model), byKey(pair)
	keys := map[string]bool{}
	for k := range ours {
		keys[k] = true
	}
	for k := range theirs {
		keys[k] = true
	}
	var out []string
	for k := range keys {
		a, b := ours[k], theirs[k]
		if slices.Equal(a, b) {
			continue
		}
		out = append(out, fmt.Sprintf("%s: job %s: the model holds %s, PAIR's store holds %s", what, k, listOf(a), listOf(b)))
	}
	sort.Strings(out)
	return out
}

// byKey groups compacted workload objects by origin/id (engine, runId).
func byKey(infos []json.RawMessage) map[string][]string {
	out := map[string][]string{}
	for _, info := range infos {
		var w struct {
			ID             string `json:"id"`
			Engine         string `json:"engine"`
			RunID          string `json:"runId"`
			OriginatedFrom string `json:"originatedFrom"`
		}
		json.Unmarshal(info, &w)
		k := w.OriginatedFrom + "/" + w.ID
		if w.Engine != "" || w.RunID != "" {
			k += fmt.Sprintf(" (engine %q, runId %q)", w.Engine, w.RunID)
		}
		var b bytes.Buffer
		if json.Compact(&b, info) != nil {
			b.Reset()
			b.Write(info)
		}
		out[k] = append(out[k], b.String())
	}
	for k := range out {
		sort.Strings(out[k])
	}
	return out
}

func listOf(infos []string) string {
	if len(infos) == 0 {
		return "nothing"
	}
	return strings.Join(infos, " and ")
}

// Reset empties both stores: a property test runs many sequences on one
// program. The model is a new one, so a caller must ask Model again, and
// must not reset while another goroutine reads the old one.
func (j *Judged) Reset() {
	j.begin()
	defer j.mu.Unlock()
	j.model = pairbroker.New(func() time.Time { return j.at })
	if j.shadow != nil {
		j.shadow.Reset()
	}
}
