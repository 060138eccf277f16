package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"
)

// resyncEntry is the latest event of one local-origin workload run.
type resyncEntry struct {
	method     string
	params     json.RawMessage // without any resync marker
	terminalAt time.Time       // zero while the workload is live
	// What a later frame is compared with (see supersedes): the held seq
	// when the frame carried one, and the held state as its rank, which is
	// all the comparison needs and a byte where the state's string would
	// be a second reference kept per entry.
	seq    int64
	rank   lifecycleRank
	hasSeq bool
}

// resyncSet holds the latest event per local-origin workload run, so the
// heartbeat can re-assert it to peers that missed a delivery. It is guarded
// by Manager.activeMu.
type resyncSet struct {
	retention time.Duration // how long a terminal entry stays
	entries   map[workloadKey]*resyncEntry
	byRef     map[workloadRef][]workloadKey // a removal names a ref, not a run; nearly always one run
}

func newResyncSet(retention time.Duration) *resyncSet {
	return &resyncSet{
		retention: retention,
		entries:   map[workloadKey]*resyncEntry{},
		byRef:     map[workloadRef][]workloadKey{},
	}
}

// track records ev as its run's latest event, unless the entry held is
// later (see supersedes): the heartbeat re-asserts what the set holds, so a
// frame that arrived late must not move it back. It reports whether ev was
// recorded; one that was not is still relayed by the caller.
func (s *resyncSet) track(ev *lifecycleEvent, now time.Time) bool {
	k := ev.key()
	if old, ok := s.entries[k]; ok && !supersedes(ev, old) {
		return false
	}
	// The stored params never carry a resync member, whatever its value or
	// spelling: the heartbeat adds its own marker, and a second one would win.
	e := &resyncEntry{method: ev.method, params: withoutResync(ev.params),
		rank: rankOf(ev.info.State), seq: ev.info.seqNum, hasSeq: ev.info.hasSeq}
	if ev.terminal() {
		e.terminalAt = now
	}
	s.entries[k] = e
	if keys := s.byRef[ev.ref()]; !slices.Contains(keys, k) {
		s.byRef[ev.ref()] = append(keys, k)
	}
	return true
}

// supersedes reports whether ev may replace the entry held for its run.
//
// A producer may post each frame on its own goroutine, so one run's frames
// can reach the daemon in any order: its terminal frame before its running
// one, its running frame before its queued one. The peers' brokers keep the
// last frame they were sent, and the heartbeat re-asserts the set to them
// until the run ends, so the set must end up holding the run's latest state
// whatever the arrival order, or the cluster would show a finished job as
// running, or a running one as queued, for good.
//
//   - A terminal frame always replaces: nothing follows the end of a run
//     (and a second terminal frame, a correction, is the later word).
//   - A non-terminal frame never replaces a terminal entry: it is a late or
//     replayed delivery, and a finished workload must not be re-asserted as
//     live.
//   - Between live frames, the producer's seq, when both carry one, is its
//     own order of events and decides: a lower seq is older. An equal seq
//     replaces, as a resent frame always did.
//   - Otherwise the lifecycle order decides: a queued frame does not replace
//     a running entry. A state outside queued and running has no rank (the
//     stdio and peer paths allow any state, and nothing says where it
//     falls), so it neither replaces by rank nor is refused by it.
func supersedes(ev *lifecycleEvent, held *resyncEntry) bool {
	switch {
	case ev.terminal():
		return true
	case !held.terminalAt.IsZero():
		return false
	case ev.info.hasSeq && held.hasSeq:
		return ev.info.seqNum >= held.seq
	}
	return !rankOf(ev.info.State).before(held.rank)
}

// lifecycleRank orders the live states: queued comes before running.
type lifecycleRank uint8

const (
	rankNone    lifecycleRank = iota // terminal or unknown: not ordered
	rankQueued                       // queued
	rankRunning                      // running
)

func rankOf(state string) lifecycleRank {
	switch state {
	case "queued":
		return rankQueued
	case "running":
		return rankRunning
	}
	return rankNone
}

// before reports whether a state of rank r comes before one of rank other in
// a run's life; a state without a rank comes before none and after none.
func (r lifecycleRank) before(other lifecycleRank) bool {
	return r != rankNone && other != rankNone && r < other
}

// untrack drops every run of the workload.
func (s *resyncSet) untrack(ref workloadRef) {
	for _, k := range s.byRef[ref] {
		delete(s.entries, k)
	}
	delete(s.byRef, ref)
}

func (s *resyncSet) remove(k workloadKey) {
	delete(s.entries, k)
	ref := workloadRef{k.origin, k.id}
	keys := slices.DeleteFunc(s.byRef[ref], func(x workloadKey) bool { return x == k })
	if len(keys) == 0 {
		delete(s.byRef, ref)
	} else {
		s.byRef[ref] = keys
	}
}

// snapshot drops terminal entries past their retention and returns the rest
// as re-assertion frames.
func (s *resyncSet) snapshot(now time.Time) []resyncEntry {
	out := make([]resyncEntry, 0, len(s.entries))
	for k, e := range s.entries {
		if !e.terminalAt.IsZero() && now.Sub(e.terminalAt) >= s.retention {
			s.remove(k)
			continue
		}
		out = append(out, *e)
	}
	return out
}

func (s *resyncSet) len() int { return len(s.entries) }

// withResync returns params with "resync": true added: the marker that lets
// a re-assertion through the peers' dedup.
func withResync(params json.RawMessage) json.RawMessage {
	p := bytes.TrimSpace(params)
	rest := bytes.TrimSpace(p[1:]) // p is a JSON object: it starts with '{'
	out := make([]byte, 0, len(p)+16)
	out = append(out, `{"resync":true`...)
	if rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...)
}

// withoutResync returns params without any member that encoding/json would
// decode as the resync marker.
func withoutResync(params json.RawMessage) json.RawMessage {
	if !mayHoldResync(params) {
		return params
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(params, &m); err != nil {
		return params // parseLifecycle already decoded it; unreachable
	}
	found := false
	for k := range m {
		if strings.EqualFold(k, "resync") {
			delete(m, k)
			found = true
		}
	}
	if !found {
		return params
	}
	b, err := json.Marshal(m)
	if err != nil {
		return params
	}
	return b
}

// queueResync queues the whole re-sync set as re-assertions, under one hold
// of broadcastMu so that no removal can be queued between the snapshot and
// its frames. It returns how many frames were queued.
func (m *Manager) queueResync(reason string) int {
	m.broadcastMu.Lock()
	defer m.broadcastMu.Unlock()
	m.activeMu.Lock()
	entries := m.resync.snapshot(m.now())
	m.activeMu.Unlock()
	queued := 0
	for _, e := range entries {
		if m.bcast.enqueue(outboundFrame{method: e.method, line: encodeNotification(e.method, withResync(e.params))}) {
			queued++
		}
	}
	m.resyncQueued.Add(uint64(queued))
	if len(entries) > 0 {
		m.log.Debug("re-sync set queued", "reason", reason, "frames", queued, "held", len(entries))
	}
	return queued
}

// heartbeat re-asserts the re-sync set every interval until ctx ends.
func (m *Manager) heartbeat(ctx context.Context) {
	runEvery(ctx, m.cfg.ResyncInterval, func() { m.queueResync("heartbeat") })
}

// mayHoldResync reports whether params could hold a member that
// encoding/json decodes as resync: a name with an escape, or one spelt
// resync in any case, with "ſ" (U+017F, which folds to s) for the s. When
// it reports false no such member exists and params need no decoding.
func mayHoldResync(params []byte) bool {
	if bytes.IndexByte(params, '\\') >= 0 {
		return true
	}
	for i := 0; i+6 <= len(params); i++ {
		if params[i]|0x20 != 'r' || params[i+1]|0x20 != 'e' {
			continue
		}
		j := i + 2
		switch {
		case params[j]|0x20 == 's':
			j++
		case j+1 < len(params) && params[j] == 0xc5 && params[j+1] == 0xbf: // ſ
			j += 2
		default:
			continue
		}
		if j+3 <= len(params) && params[j]|0x20 == 'y' && params[j+1]|0x20 == 'n' && params[j+2]|0x20 == 'c' {
			return true
		}
	}
	return false
}
