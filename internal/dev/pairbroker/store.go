// Package pairbroker models the Jobs store of PAIR's broker (the desktop
// back end that is the daemon's parent), so that the dev cluster and every
// test that plays a broker assert what a PAIR user's Jobs list would show,
// not what a last-write-wins stand-in shows.
//
// It owns the merge rule (Store.Apply, Store.ApplyInferred), the removal of
// every generation of a workload (Store.Remove), the staleness sweep
// (Store.SweepStale), the node-loss inference (Store.FailNode), the replay a
// restarted daemon is owed (Store.Replay, ReplayMethod), the reader of
// the worker's stdout (ReadLines) and the stop sequence a broker runs on
// its worker (Stop). Each rule cites where PAIR states it, in
// NVIDIA/Personal-AI-Router: services/nvpair-ui-broker/workloadstore/store.go
// (a copy is in ../shared/upstream) and services/nvpair-ui-broker/stopwait.go. The facts are PAIR's; the code is ours.
// internal/dev/pairshadow holds the model to PAIR's store itself.
//
// It is pure state and timing: it must never import the daemon (the root
// package), any other package of this module, nor net, net/http or os/exec.
// Processes, pipes and sockets belong to its callers, which hand Stop the
// three actions it sequences.
package pairbroker

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Key identifies a workload cluster-wide, as PAIR's broker keys it
// (workloadstore.Key): the request id alone is not unique, since each
// engine proxy counts from 1 and starts again on a restart, so the engine
// and the proxy's per-run nonce are part of it.
type Key struct {
	Origin, Engine, RunID, ID string
}

// Record is the store's entry for one workload.
type Record struct {
	Key
	Model       string
	State       string
	ScheduledOn string
	CreatedAt   int64 // epoch ms from the workload object; 0 when absent
	CompletedAt int64 // epoch ms; 0 when absent
	Seq         int64 // the origin's number for the event held; 0 when it sent none
	// Inferred marks a record set by a local guess (the staleness sweep or
	// the node-loss inference) rather than by the origin. The origin's next
	// event always overrides it.
	Inferred bool
	Info     json.RawMessage // the workload object as received (or as the guess rewrote it)
	// LastSeen is when the origin last asserted the workload, a no-op
	// re-assertion (its heartbeat) included; only authoritative events of
	// the current generation refresh it. It carries the monotonic clock
	// reading, so a wall-clock step cannot make every record stale at once.
	LastSeen time.Time
	// Updated is when the record last changed; a no-op re-assertion does
	// not move it.
	Updated time.Time
}

// Terminal reports whether the record's state ends a workload's life.
func (r Record) Terminal() bool { return terminal(r.State) }

func terminal(state string) bool {
	return state == "completed" || state == "failed" || state == "cancelled"
}

// rank orders the states so a workload only moves forward within a
// generation: queued < running < terminal. An unknown state ranks below
// queued, so PAIR's broker rejects any event carrying one onto an existing
// record (workloadstore.rank).
func rank(state string) int {
	switch state {
	case "queued":
		return 1
	case "running":
		return 2
	case "completed", "failed", "cancelled":
		return 3
	}
	return 0
}

// Incoming is a parsed workload object, ready to merge.
type Incoming struct {
	Key
	Model       string
	State       string
	ScheduledOn string
	CreatedAt   int64
	CompletedAt int64
	Seq         int64
	Info        json.RawMessage
}

// Parse reads the fields the merge needs from a workload object and keeps a
// copy of its bytes. Null members read as absent, as PAIR's broker decodes
// them. id and originatedFrom are required, and only they, as
// workloadstore.ParseIncoming requires them: an object without a state is
// kept, live, and ranks below queued.
func Parse(info json.RawMessage) (Incoming, error) {
	var w struct {
		ID             string `json:"id"`
		Model          string `json:"model"`
		Engine         string `json:"engine"`
		RunID          string `json:"runId"`
		State          string `json:"state"`
		OriginatedFrom string `json:"originatedFrom"`
		ScheduledOn    string `json:"scheduledOn"`
		CreatedAt      *int64 `json:"createdAt"`
		CompletedAt    *int64 `json:"completedAt"`
		Seq            *int64 `json:"seq"`
	}
	if err := json.Unmarshal(info, &w); err != nil {
		return Incoming{}, fmt.Errorf("workloadInfo: %w", err)
	}
	if w.ID == "" || w.OriginatedFrom == "" {
		return Incoming{}, errors.New("workloadInfo: id and originatedFrom are required")
	}
	in := Incoming{Key: Key{w.OriginatedFrom, w.Engine, w.RunID, w.ID}, Model: w.Model, State: w.State,
		ScheduledOn: w.ScheduledOn, Info: slices.Clone(info)}
	if w.CreatedAt != nil {
		in.CreatedAt = *w.CreatedAt
	}
	if w.CompletedAt != nil {
		in.CompletedAt = *w.CompletedAt
	}
	if w.Seq != nil {
		in.Seq = *w.Seq
	}
	return in, nil
}

// Outcome says which rule decided a merge, so a test can name the rule it
// holds and a caller can tell a change from a rejection.
type Outcome int

const (
	Added              Outcome = iota // a workload the store did not hold
	NewerGeneration                   // a later createdAt replaced the record
	OlderGeneration                   // an earlier createdAt was rejected
	OverInferred                      // the origin's event replaced a local guess
	InferredFailed                    // a guess failed a live record
	InferredOnTerminal                // a guess about a finished record was rejected
	HigherSeq                         // both sequenced: a higher seq replaced
	SeqNotHigher                      // both sequenced: an equal or lower seq, or a record already terminal, was rejected
	HigherRank                        // a later state replaced
	LowerRank                         // an earlier state was rejected
	Repointed                         // the same state with another scheduledOn replaced
	Unchanged                         // the same state, nothing to apply
	OlderThanGuess                    // the origin's event had a lower seq than the guess it would replace, and was rejected
)

var outcomeNames = [...]string{"added", "newer generation", "older generation", "authoritative over inferred",
	"inferred failed a live record", "inferred on a terminal record", "higher seq", "seq not higher",
	"higher rank", "lower rank", "scheduledOn changed", "unchanged", "seq lower than the guess kept"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Changed reports whether the merge changed the store.
func (o Outcome) Changed() bool {
	switch o {
	case Added, NewerGeneration, OverInferred, InferredFailed, HigherSeq, HigherRank, Repointed:
		return true
	}
	return false
}

// Store is a broker's Jobs store. It is safe for concurrent use.
type Store struct {
	now func() time.Time

	mu      sync.Mutex // guards recs and changes; a leaf: nothing is called with it held
	recs    map[Key]*Record
	changes uint64
}

// New returns an empty store reading the time from now (time.Now when nil).
func New(now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{now: now, recs: map[Key]*Record{}}
}

// Apply merges an event from the workload's origin (the broker's own
// producers, or its daemon's workloads:upsert).
func (s *Store) Apply(in Incoming) Outcome { return s.apply(in, false) }

// ApplyInferred merges a local guess about a workload.
func (s *Store) ApplyInferred(in Incoming) Outcome { return s.apply(in, true) }

func (s *Store) apply(in Incoming, inferred bool) Outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(in, inferred)
}

// applyLocked is PAIR's merge (workloadstore.applyLocked), in its order:
// the generation gate, then provenance, then seq when both events carry
// one, then state rank, with an equal rank applied only when scheduledOn
// changed.
func (s *Store) applyLocked(in Incoming, inferred bool) Outcome {
	now := s.now()
	cur, ok := s.recs[in.Key]
	if !ok {
		s.putLocked(in, inferred, now, nil)
		return Added
	}
	// An authoritative event of a current generation is the origin still
	// holding an opinion, even when it changes nothing: the staleness sweep
	// must see the heartbeat's re-assertions. A guess, or an older
	// generation, is no sighting.
	if !inferred && in.CreatedAt >= cur.CreatedAt {
		cur.LastSeen = now
	}
	switch {
	case in.CreatedAt > cur.CreatedAt:
		s.putLocked(in, inferred, now, cur)
		return NewerGeneration
	case in.CreatedAt < cur.CreatedAt:
		return OlderGeneration
	}
	// Provenance before rank: the origin's word undoes a wrong guess (a
	// node that was only cut off, not gone), and a guess may only fail a
	// record the origin left live. A guess keeps the seq of the record it
	// replaced, so an event of the origin with a lower one is a delayed
	// copy of something older than that record, and is rejected; an equal
	// one is the origin re-asserting that record, and wins.
	if !inferred && cur.Inferred {
		if in.Seq > 0 && cur.Seq > 0 && in.Seq < cur.Seq {
			return OlderThanGuess
		}
		s.putLocked(in, false, now, cur)
		return OverInferred
	}
	if inferred && !cur.Inferred {
		if cur.Terminal() {
			return InferredOnTerminal
		}
		s.putLocked(in, true, now, cur)
		return InferredFailed
	}
	// Both sequenced: the origin numbers a workload's events in the order it
	// made them, so a higher seq is newer even where the rank disagrees, and
	// a finished record stays finished.
	if !inferred && in.Seq > 0 && cur.Seq > 0 {
		if cur.Terminal() || in.Seq <= cur.Seq {
			return SeqNotHigher
		}
		s.putLocked(in, false, now, cur)
		return HigherSeq
	}
	switch ri, rc := rank(in.State), rank(cur.State); {
	case ri > rc:
		s.putLocked(in, inferred, now, cur)
		return HigherRank
	case ri < rc:
		return LowerRank
	case in.ScheduledOn != cur.ScheduledOn:
		s.putLocked(in, inferred, now, cur)
		return Repointed
	}
	return Unchanged
}

// putLocked writes in as the record of its key. A guess keeps the sighting
// the origin last gave: it must never make a record look freshly asserted.
func (s *Store) putLocked(in Incoming, inferred bool, now time.Time, prev *Record) {
	r := &Record{Key: in.Key, Model: in.Model, State: in.State, ScheduledOn: in.ScheduledOn,
		CreatedAt: in.CreatedAt, CompletedAt: in.CompletedAt, Seq: in.Seq, Inferred: inferred,
		Info: in.Info, LastSeen: now, Updated: now}
	if inferred && prev != nil {
		r.LastSeen = prev.LastSeen
	}
	s.recs[in.Key] = r
	s.changes++
}

// Remove drops every record of (origin, id), whatever its engine, run or
// generation: a removal carries only those two (workloadstore.Remove). It
// returns how many it dropped.
func (s *Store) Remove(origin, id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k := range s.recs {
		if k.Origin == origin && k.ID == id {
			delete(s.recs, k)
			n++
		}
	}
	if n > 0 {
		s.changes++
	}
	return n
}

// SweepStale fails, by inference, every live record of another origin than
// self that its origin has not asserted for budget, and returns the records
// as it failed them (workloadstore.StaleForeign and the broker's sweep).
// The origin's heartbeat re-asserts each of its live workloads every
// interval, so such silence means the terminal was lost or the origin is
// no longer running. Own-origin records are never swept: their authority
// is this broker's own producers, which never re-assert into the store. A
// record whose (origin, id) is shared by another live record is left
// alone: a client keys on that pair, so a guess about one could land on the
// other. Selection and the guess happen under one hold of the lock, so a
// re-assertion cannot slip between them.
func (s *Store) SweepStale(self string, budget time.Duration, reason string) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	live := map[[2]string]int{}
	for k, r := range s.recs {
		if !r.Terminal() {
			live[[2]string{k.Origin, k.ID}]++
		}
	}
	var out []Record
	for k, r := range s.recs {
		if r.Terminal() || k.Origin == self || live[[2]string{k.Origin, k.ID}] > 1 || now.Sub(r.LastSeen) < budget {
			continue
		}
		if rec, ok := s.failLocked(r, reason, now); ok {
			out = append(out, rec)
		}
	}
	sortRecords(out)
	return out
}

// FailNode fails, by inference, every live record that node originated or
// runs, when node has left discovery, and returns them: the records of
// workloadstore.ActiveForNode, which PAIR's broker fails with
// ApplyInferred. That includes this broker's own workloads scheduled on
// node, since the engine that ran them is gone; their producers' next word
// undoes the guess, as the origin's always does.
func (s *Store) FailNode(node, reason string) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []Record
	for k, r := range s.recs {
		if r.Terminal() || (k.Origin != node && r.ScheduledOn != node) {
			continue
		}
		if rec, ok := s.failLocked(r, reason, now); ok {
			out = append(out, rec)
		}
	}
	sortRecords(out)
	return out
}

// failLocked merges the guess that r failed, its workload object rewritten
// with state failed, completedAt now and reason as its error.
func (s *Store) failLocked(r *Record, reason string, now time.Time) (Record, bool) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(r.Info, &members); err != nil {
		members = map[string]json.RawMessage{}
	}
	ms := now.UnixMilli()
	members["state"] = json.RawMessage(`"failed"`)
	members["completedAt"], _ = json.Marshal(ms)
	members["error"], _ = json.Marshal(reason)
	info, err := json.Marshal(members)
	if err != nil {
		return Record{}, false
	}
	in := Incoming{Key: r.Key, Model: r.Model, State: "failed", ScheduledOn: r.ScheduledOn,
		CreatedAt: r.CreatedAt, CompletedAt: ms, Seq: r.Seq, Info: info}
	if s.applyLocked(in, true) != InferredFailed {
		return Record{}, false
	}
	return *s.recs[r.Key], true
}

// ReplayWindow is how recently a terminal workload must have finished to be
// replayed to a restarted daemon: PAIR's workloadTerminalReplayWindowMs,
// the daemon's terminal retention (2 x its 30 s heartbeat), so a restart
// inside that window does not cut short the re-assertions of a terminal.
const ReplayWindow = 60 * time.Second

// Replay returns what a broker replays to its restarted daemon before the
// daemon's ready (workloadstore.ReplayForNode): every live record self
// originated, and those it holds finished on the origin's word whose
// completion (completedAt, else the record's last change) is within window
// of now; never a peer's, never a guess. Oldest first, where
// workloadstore.ReplayForNode has no order: a replay in a stable order
// makes the dev cluster's restarts repeatable.
func (s *Store) Replay(self string, window time.Duration) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	// In whole epoch milliseconds, as ReplayForNode compares them (the
	// completion time is the wire's, in milliseconds): a comparison in
	// nanoseconds would drop a terminal PAIR's store replays, for up to a
	// millisecond at the window's edge.
	cutoff := s.now().UnixMilli() - window.Milliseconds()
	var out []Record
	for k, r := range s.recs {
		if k.Origin != self {
			continue
		}
		if r.Terminal() {
			done := r.Updated.UnixMilli()
			if r.CompletedAt > 0 {
				done = r.CompletedAt
			}
			if r.Inferred || done < cutoff {
				continue
			}
		}
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b Record) int {
		if a.CreatedAt != b.CreatedAt {
			return cmp.Compare(a.CreatedAt, b.CreatedAt)
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// ReplayMethod is the lifecycle method a replayed record travels as
// (PAIR's stateReplayMethod): cancelled rides workload:errored, as the
// producers send it.
func ReplayMethod(state string) string {
	switch state {
	case "queued":
		return "workload:submitted"
	case "running":
		return "workload:started"
	case "completed":
		return "workload:completed"
	}
	return "workload:errored"
}

// Snapshot returns a copy of every record, ordered by origin, id, engine
// and run. The order differs from workloadstore.Snapshot's (createdAt,
// origin, id) on purpose: the dev cluster's view and the tests sort as
// they need, and internal/dev/pairshadow compares the two lists as sets.
func (s *Store) Snapshot() []Record {
	s.mu.Lock()
	out := make([]Record, 0, len(s.recs))
	for _, r := range s.recs {
		out = append(out, *r)
	}
	s.mu.Unlock()
	sortRecords(out)
	return out
}

// Get returns a record of (origin, id), the most recently changed when
// several engines or runs share the pair.
func (s *Store) Get(origin, id string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *Record
	for k, r := range s.recs {
		if k.Origin == origin && k.ID == id && (best == nil || r.Updated.After(best.Updated)) {
			best = r
		}
	}
	if best == nil {
		return Record{}, false
	}
	return *best, true
}

// Len returns how many records the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

func sortRecords(rs []Record) {
	slices.SortFunc(rs, func(a, b Record) int {
		for _, c := range [...]int{strings.Compare(a.Origin, b.Origin), strings.Compare(a.ID, b.ID),
			strings.Compare(a.Engine, b.Engine), strings.Compare(a.RunID, b.RunID)} {
			if c != 0 {
				return c
			}
		}
		return 0
	})
}
