package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// resyncEntry is the latest event of one local-origin workload run.
type resyncEntry struct {
	key wireframe.WorkloadKey
	// line is the entry's re-assertion, the notification with "resync": true
	// in its params, encoded once when the entry changes rather than on
	// every pass to every peer. Its bytes are never modified afterwards, so
	// a sender may hold it without a lock.
	line       []byte
	method     string
	terminalAt time.Time // zero while the workload is live
	// What a later frame is compared with (see supersedes): the held seq
	// when the frame carried one, and the held state as its rank, which is
	// all the comparison needs and a byte where the state's string would
	// be a second reference kept per entry.
	seq    int64
	rank   lifecycleRank
	hasSeq bool
	// ingress says an ingress frame of this run was tracked since the
	// daemon started: the read-back lists such runs (readback.go).
	ingress bool
	// hasRequester and requester are the held event's requesterId, which
	// the read-back's filter compares without parsing the line (see track
	// for the bytes it keeps).
	hasRequester bool
	requester    string
	// order is the entry's place in pass order, rising with every entry
	// linked: the read-back's cursor names it.
	order uint64
	// gen is the set's generation when the entry last changed: a pass that
	// started before it skips the entry, which every peer was just sent as
	// a fresh frame.
	gen uint64
	// sibling links the runs of one workload (one byRef entry): nearly
	// always there is one, so a chain costs a pointer where a slice of
	// keys cost a slice header and a backing array per workload.
	sibling *resyncEntry
	// prev and next link the entries in pass order: the order they were
	// first tracked in. An update keeps its place, so a heartbeat pass,
	// which walks this list, visits every entry once whatever changes
	// meanwhile, and no entry can be skipped pass after pass.
	prev, next *resyncEntry
}

// params returns the entry's params as they were tracked (any resync
// member removed), without the marker the re-assertion line adds.
func (e *resyncEntry) params() json.RawMessage {
	// The method is a lifecycle method, which needs no escaping, so the
	// first occurrence of the marker is the one withResync wrote.
	marker := []byte(`,"params":{"resync":true`)
	rest := e.line[bytes.Index(e.line, marker)+len(marker) : len(e.line)-1]
	return append([]byte{'{'}, bytes.TrimPrefix(rest, []byte(","))...)
}

// resyncCursor is one peer's place in its current heartbeat pass. next is
// guarded by the lock of the set it was opened on, which moves it when the
// entry it points at goes; the other fields belong to the peer's sender.
type resyncCursor struct {
	next     *resyncEntry // the next entry the pass visits; nil at its end
	startGen uint64       // the set's generation when the pass started
	pending  bool         // the pass has started but not yet taken its place
}

// expiry is a terminal entry's deadline, in the order entries ended.
type expiry struct {
	key wireframe.WorkloadKey
	at  time.Time // the entry's terminalAt when it was queued
}

// resyncSet holds the latest event per local-origin workload run, so the
// heartbeat can re-assert it to peers that missed a delivery. It is guarded
// by Manager.activeMu. Every operation is O(1) amortized except a removal
// (O(runs of the workload + open cursors)): nothing walks the whole set
// under the lock, so the read loop and the ingress never wait on the
// heartbeat for more than a bounded slice of work.
type resyncSet struct {
	retention  time.Duration // how long a terminal entry stays
	limit      int           // the most entries, live and terminal (--max-live-workloads)
	entries    map[wireframe.WorkloadKey]*resyncEntry
	byRef      map[wireframe.WorkloadRef]*resyncEntry // a removal names a ref, not a run: the first of its runs
	self       string                                 // this node's id: every key's origin shares its bytes
	head, tail *resyncEntry                           // pass order
	linked     uint64                                 // entries ever linked: the last order given
	cursors    map[*resyncCursor]struct{}             // one per peer sender
	// gen counts the changes to the set. It is written under the set's
	// lock and read without it, when a peer sender starts a pass.
	gen atomic.Uint64
	// expiries holds terminal entries' deadlines oldest first, from
	// expiryHead on; an entry that changed since it was queued is skipped
	// when its item comes up. Entries end in time order, so pruning pops
	// from the front only.
	expiries   []expiry
	expiryHead int

	// maxBytes bounds bytes, the sum of the entries' re-assertion lines
	// (--max-live-workload-bytes): the text of the workloads the set keeps,
	// which the entry bound alone would let reach 100,000 broker lines.
	maxBytes, bytes int64

	// gone, when set, is told of a workload whose last run the set
	// dropped by itself (pruned, or over its byte bound), with its lock
	// held (ownership.go).
	gone func(wireframe.WorkloadRef)
	// ended, when set, is told of a terminal entry the set drops at the
	// end of its retention, with its lock held, before it goes: the log of
	// recent ends keeps it (endedlog.go).
	ended func(e *resyncEntry, now time.Time)
}

func newResyncSet(retention time.Duration, limit int, maxBytes int64, self string) *resyncSet {
	return &resyncSet{
		retention: retention,
		limit:     limit,
		maxBytes:  maxBytes,
		self:      self,
		entries:   map[wireframe.WorkloadKey]*resyncEntry{},
		byRef:     map[wireframe.WorkloadRef]*resyncEntry{},
		cursors:   map[*resyncCursor]struct{}{},
	}
}

// trackOutcome says what track did with a frame.
type trackOutcome int

const (
	tracked   trackOutcome = iota // recorded as its run's latest event
	stale                         // the entry held is later (see supersedes)
	full                          // a new run, and the set is at its limit
	fullBytes                     // the set would pass its byte bound: not kept
)

// resyncMarkerBytes is what the re-assertion marker adds to a frame's line
// to the peers, at most: `"resync":true,`.
const resyncMarkerBytes = len(`"resync":true,`)

// track records ev as its run's latest event, unless the entry held is
// later (see supersedes): the heartbeat re-asserts what the set holds, so a
// frame that arrived late must not move it back. A new run is not recorded
// while the set holds limit entries, unless overLimit: the ingress checks
// the limit before its broker write (atLimit) and may not refuse
// afterwards. Nor, unless overLimit, is a frame recorded that would take
// the set's bytes past maxBytes (fullBytes): a new run is then not
// tracked, and a run held is dropped, since re-asserting its older state
// would undo, at every peer, the newer one the caller relays. A frame
// that was not recorded is still relayed by the caller.
func (s *resyncSet) track(ev *wireframe.Lifecycle, now time.Time, overLimit bool) trackOutcome {
	s.prune(now)
	k := ev.Key()
	e, held := s.entries[k]
	switch {
	case held && !supersedes(ev, e):
		return stale
	case !held && !overLimit && len(s.entries) >= s.limit:
		return full
	}
	// The stored params never carry a resync member, whatever its value or
	// spelling: the heartbeat adds its own marker, and a second one would win.
	line := wireframe.EncodeNotification(ev.Method, withResync(withoutResync(ev.Params)))
	grow := int64(len(line))
	if held {
		grow -= int64(len(e.line))
	}
	if !overLimit && grow > 0 && s.bytes+grow > s.maxBytes {
		if held {
			s.remove(k)
		}
		return fullBytes
	}
	if !held {
		if k.Origin == s.self {
			// Every local workload's origin is this node: sharing one
			// string saves an allocation per entry.
			k.Origin = s.self
		}
		e = &resyncEntry{key: k}
		s.entries[k] = e
		s.link(e)
		ref := k.Ref()
		e.sibling = s.byRef[ref]
		s.byRef[ref] = e
	}
	s.bytes += grow
	e.line = line
	e.method, e.rank, e.seq, e.hasSeq = ev.Method, rankOf(ev.Info.State), ev.Info.Seq, ev.Info.HasSeq
	// A new entry's requester is a part of the allocation its key's strings
	// are parts of (decodeWorkloadInfo), so it costs only its bytes. A later
	// event's would keep that event's whole allocation alive: the string
	// held is kept when it is the same, as it nearly always is, else copied.
	switch {
	case !held:
		e.requester = ev.Info.Requester
	case e.requester != ev.Info.Requester:
		e.requester = strings.Clone(ev.Info.Requester)
	}
	e.hasRequester = ev.Info.HasRequester
	e.gen = s.gen.Add(1)
	e.terminalAt = time.Time{}
	if ev.Terminal() {
		e.terminalAt = now
		s.expiries = append(s.expiries, expiry{k, now})
	}
	return tracked
}

// setLimit names the bound of the re-sync set a frame found reached.
type setLimit int

const (
	underLimit   setLimit = iota
	limitEntries          // --max-live-workloads
	limitBytes            // --max-live-workload-bytes
)

// atLimit reports which bound ev would pass: the entry bound when it would
// start a new run while the set, with pending more runs on their way into
// it, is at its limit; the byte bound when a line of up to lineBytes,
// with pendingBytes more on their way, would take the set's bytes past
// maxBytes (a frame that would not grow the set, a stale one included,
// passes). When one is reached it says how long until room may free:
// until the oldest terminal entry ages out, or one interval when every
// entry is live (only a terminal frame or a removal frees room then). The
// wait is advice for a Retry-After, so a queued deadline whose entry has
// since changed is not looked past. held says whether the set holds ev's
// run.
func (s *resyncSet) atLimit(ev *wireframe.Lifecycle, now time.Time, pending int, pendingBytes int64, lineBytes int) (hit setLimit, held bool, after time.Duration) {
	s.prune(now)
	e, held := s.entries[ev.Key()]
	grow := int64(lineBytes)
	switch {
	case held && !supersedes(ev, e):
		grow = 0 // not tracked: it takes no room
	case held:
		grow -= int64(len(e.line))
	}
	switch {
	case !held && len(s.entries)+pending >= s.limit:
		hit = limitEntries
	case grow > 0 && s.bytes+pendingBytes+grow > s.maxBytes:
		hit = limitBytes
	default:
		return underLimit, held, 0
	}
	return hit, held, s.retryAfter(now)
}

// retryAfter is how long until room may free in a set at a bound: until
// the oldest terminal entry ages out, or half the retention when every
// entry is live. Called with the set pruned.
func (s *resyncSet) retryAfter(now time.Time) time.Duration {
	if s.expiryHead < len(s.expiries) {
		return s.expiries[s.expiryHead].at.Add(s.retention).Sub(now)
	}
	return s.retention / 2
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
func supersedes(ev *wireframe.Lifecycle, held *resyncEntry) bool {
	switch {
	case ev.Terminal():
		return true
	case !held.terminalAt.IsZero():
		return false
	case ev.Info.HasSeq && held.hasSeq:
		return ev.Info.Seq >= held.seq
	}
	return !rankOf(ev.Info.State).before(held.rank)
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
func (s *resyncSet) untrack(ref wireframe.WorkloadRef) {
	for e := s.byRef[ref]; e != nil; e = e.sibling {
		s.unlink(e)
		delete(s.entries, e.key)
		s.bytes -= int64(len(e.line))
	}
	delete(s.byRef, ref)
}

func (s *resyncSet) remove(k wireframe.WorkloadKey) {
	e := s.entries[k]
	if e == nil {
		return
	}
	s.unlink(e)
	delete(s.entries, k)
	s.bytes -= int64(len(e.line))
	ref := k.Ref()
	switch first := s.byRef[ref]; {
	case first == e && e.sibling == nil:
		delete(s.byRef, ref)
		if s.gone != nil {
			s.gone(ref)
		}
	case first == e:
		s.byRef[ref] = e.sibling
	default:
		for p := first; p != nil; p = p.sibling {
			if p.sibling == e {
				p.sibling = e.sibling
				break
			}
		}
	}
	e.sibling = nil
}

// runsOf returns the keys of the workload's runs.
func (s *resyncSet) runsOf(ref wireframe.WorkloadRef) []wireframe.WorkloadKey {
	var keys []wireframe.WorkloadKey
	for e := s.byRef[ref]; e != nil; e = e.sibling {
		keys = append(keys, e.key)
	}
	return keys
}

// latestLines returns the re-assertion lines of the workload's runs, the
// run that changed last last: a peer that keys the workload alone keeps
// the latest.
func (s *resyncSet) latestLines(ref wireframe.WorkloadRef) [][]byte {
	first := s.byRef[ref]
	if first == nil {
		return nil
	}
	if first.sibling == nil {
		return [][]byte{first.line}
	}
	var runs []*resyncEntry
	for e := first; e != nil; e = e.sibling {
		runs = append(runs, e)
	}
	slices.SortFunc(runs, func(a, b *resyncEntry) int { return cmp.Compare(a.gen, b.gen) })
	lines := make([][]byte, len(runs))
	for i, e := range runs {
		lines[i] = e.line
	}
	return lines
}

// link appends e at the end of the pass order.
func (s *resyncSet) link(e *resyncEntry) {
	s.linked++
	e.order = s.linked
	e.prev, e.next = s.tail, nil
	if s.tail == nil {
		s.head = e
	} else {
		s.tail.next = e
	}
	s.tail = e
}

// unlink takes e out of the pass order; a cursor that was about to visit
// it moves on to the entry after it. e keeps its next pointer: a reader
// that holds e without the lock (the read-back, between two slices) goes on
// from e to the entries that followed it, each either in the set or, when
// removed too, pointing further on in pass order.
func (s *resyncSet) unlink(e *resyncEntry) {
	for c := range s.cursors {
		if c.next == e {
			c.next = e.next
		}
	}
	if e.prev == nil {
		s.head = e.next
	} else {
		e.prev.next = e.next
	}
	if e.next == nil {
		s.tail = e.prev
	} else {
		e.next.prev = e.prev
	}
	e.prev = nil
}

// pruneBudget is the most expired entries one prune drops. Entries that
// ended together expire together, and dropping 100,000 of them at once
// would hold the lock for milliseconds; a budget keeps every hold short,
// and the callers (each track, each take, and the Manager's periodic
// prune, which loops with the lock released between rounds) catch up.
const pruneBudget = 256

// prune drops up to pruneBudget terminal entries whose retention has
// passed and reports whether more are due. Each deadline is popped once, so
// the work is amortized O(1) per entry that ended.
func (s *resyncSet) prune(now time.Time) (more bool) {
	for n := 0; s.expiryHead < len(s.expiries); n++ {
		if n == pruneBudget {
			more = true
			break
		}
		x := s.expiries[s.expiryHead]
		if now.Sub(x.at) < s.retention {
			break
		}
		s.expiries[s.expiryHead] = expiry{}
		s.expiryHead++
		if e := s.entries[x.key]; e != nil && e.terminalAt.Equal(x.at) {
			if s.ended != nil {
				s.ended(e, now)
			}
			s.remove(x.key)
		}
	}
	// Reclaim the popped front once it is most of the slice: amortized O(1).
	if s.expiryHead > 64 && s.expiryHead*2 > len(s.expiries) {
		s.expiries = append(s.expiries[:0], s.expiries[s.expiryHead:]...)
		s.expiryHead = 0
	}
	return more
}

func (s *resyncSet) len() int { return len(s.entries) }

// size is the bytes the set holds: its entries' re-assertion lines.
func (s *resyncSet) size() int64 { return s.bytes }

// closeCursor forgets a cursor; the set no longer moves it.
func (s *resyncSet) closeCursor(c *resyncCursor) { delete(s.cursors, c) }

// generation returns the set's change count; it needs no lock.
func (s *resyncSet) generation() uint64 { return s.gen.Load() }

// beginPass starts a pass on c as of generation gen: the pass visits every
// entry in pass order except those changed after gen, which were queued to
// every peer as fresh frames after the pass began. It needs no lock: c takes
// its place in the set at its first take.
func beginPass(c *resyncCursor, gen uint64) { c.startGen, c.pending = gen, true }

// take returns the re-assertion lines of up to maxFrames entries from c's
// place on, at most maxBytes in all (but always at least one line, so an
// entry larger than maxBytes is not stuck), advances c past them and
// reports whether the pass has reached the end of the set. Expired
// terminal entries are pruned first, so a pass never re-asserts one. size
// is the set's size when the pass took its place, else 0.
func (s *resyncSet) take(c *resyncCursor, now time.Time, maxFrames, maxBytes int) (r reassertions, size int, done bool) {
	s.prune(now)
	if c.pending {
		// The cursor is registered here, under the lock, rather than when
		// its sender is created under broadcaster.mu, which must stay a leaf.
		s.cursors[c] = struct{}{}
		c.next, c.pending, size = s.head, false, len(s.entries)
	}
	bytes := 0
	for c.next != nil && len(r.lines) < maxFrames {
		e := c.next
		if e.gen > c.startGen {
			c.next = e.next
			continue
		}
		if len(r.lines) > 0 && bytes+len(e.line) > maxBytes {
			break
		}
		r.lines = append(r.lines, e.line)
		r.refs = append(r.refs, e.key.Ref())
		bytes += len(e.line)
		c.next = e.next
	}
	return r, size, c.next == nil
}

// reassertions is one slice of a heartbeat pass: the lines to send, and
// the workload each names, in the same order.
type reassertions struct {
	lines [][]byte
	refs  []wireframe.WorkloadRef
}

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
