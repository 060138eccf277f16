package statetable

import (
	"errors"
	"fmt"

	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// Owner says who may change a workload: the broker, or the producer that
// posted it on the ingress (spec 3.5.3).
type Owner uint8

const (
	Broker   Owner = iota // entered through the broker
	Producer              // entered through the ingress
)

// Source says where a frame entered the daemon.
type Source uint8

const (
	FromBroker   Source = iota // the broker, on the local channel
	FromProducer               // a producer, on the loopback ingress (or its lease's expiry)
)

// kind is what an entry records.
type kind uint8

const (
	kindLive     kind = iota // a run that has not ended
	kindTerminal             // a run that ended: a tombstone
	kindRemoved              // a workload removed: a tombstone, keyed by its ref
)

// runKey is one run of a workload: what tells the broker's replay of a
// removed run from a new job of the same id.
type runKey struct{ engine, runID string }

// entry is one thing this node asserts. Guarded by Table.mu. Its fields
// are ordered by size, the one-byte ones together: a table of 100,000 runs
// holds 100,000 of them, and padding between fields is paid that often.
type entry struct {
	key  wireframe.WorkloadKey // a removal's has Origin and ID only
	line []byte                // a run's re-assertion line, a removal's notification
	// endedAt is when a tombstone ended (see retired).
	endedAt time.Time
	// A removal's runs are the runs it removed, nil for any (see
	// replayDrop): at most MaxRemovalRuns, a removal of more keeps none.
	runs []runKey
	// requester is the held event's requesterId (when hasRequester), which
	// the read-back's filter compares without parsing the line.
	requester string
	version   uint64
	// changedAt is when the entry got its version (Unix nanoseconds): a
	// member's lag is the age of the first entry above its mark.
	changedAt int64
	// seq is what a later frame is compared with (supersedes), with rank.
	seq int64
	// order is the entry's place in pass order, for the read-back's cursor.
	order uint64
	// lease is the producer's lease on the run, nil for none: most runs
	// have none, so it costs them a pointer.
	lease   *leaseState
	sibling *entry // the runs of one workload (byRef)
	// anchor holds the cursors that have the entry as their last (see
	// cursor.go), nil for none.
	anchor *anchor
	// v links every entry in version order; p links the live and
	// retained terminal runs in pass order (first tracked first).
	v, p links
	// journalSize is the bytes of the entry's record in the journal, while
	// journaled says one is there: a later change that needs none writes a
	// forget instead.
	journalSize int32
	// recSeq is the journal sequence of the entry's latest record, 0 for
	// none since the start: a producer's frame that changes nothing waits
	// on it, so its 200 too counts on a durable record of the job.
	recSeq uint64
	kind   kind
	owner  Owner
	rank   lifecycleRank
	hasSeq bool
	// hasRequester says requester holds the event's requesterId.
	hasRequester bool
	// retired says the end's retention has passed: it is out of the pass
	// order, no longer holds its run or id, and stays only until every
	// member has acknowledged it.
	retired bool
	gone    bool // deleted from the table: an item still naming it is stale
	// unheld says a removal named a workload the table held no run of.
	unheld bool
	// compact says the end was evicted at the byte bound while a member
	// lacked it and kept in its small form (compactEnd).
	compact bool
	// replayDrop says the broker's replay of a removal's runs is dropped
	// (a producer removed an owned workload).
	replayDrop bool
	// asserted says the run's latest frame was the broker's explicit
	// re-assertion (its params carried "resync": true): it goes to the
	// peers with the marker, fresh too, as the broker sent it (lineOf).
	asserted  bool
	journaled bool
	inPass    bool
	// parked is the first of the heartbeat passes whose next run is this
	// one (Pass.parkedNext links the rest): when the entry leaves pass
	// order, only they move on, not every pass in progress.
	parked *Pass
}

func (e *entry) size() int64 {
	n := len(e.line) + len(e.key.Origin) + len(e.key.Engine) + len(e.key.RunID) + len(e.key.ID)
	for _, r := range e.runs {
		n += len(r.engine) + len(r.runID)
	}
	return int64(n) + entryOverhead
}

// entryOverhead is what an entry costs beside its line and key, counted
// in the ended bytes: the struct, its map slots and item.
const entryOverhead = 256

// lineOf is the entry's line as a peer is sent it. A run's is sent fresh
// without the re-assertion marker, but for one the broker itself
// re-asserted: the seed's rule is that a re-sync-tagged frame from the
// broker is an explicit re-assertion, which the peers' dedup must let
// through (the stock worker relays it with its marker), so it keeps the
// marker on its fresh send as well.
func (e *entry) lineOf() Line {
	return Line{b: e.line, run: e.kind != kindRemoved, asserted: e.asserted}
}

// Config is a table's bounds and collaborators.
type Config struct {
	Self string // this node's id: every key's origin shares its bytes
	// Retention is how long an end is re-asserted and holds its id: two
	// re-sync intervals.
	Retention time.Duration
	// MaxLive and MaxLiveBytes bound the runs in pass order (live ones and
	// ended ones within their retention) and their lines' bytes
	// (--max-live-workloads, --max-live-workload-bytes).
	MaxLive      int
	MaxLiveBytes int64
	// MaxEndedBytes bounds the tombstones' bytes (--max-ended-bytes): the
	// oldest goes first, acknowledged or not.
	MaxEndedBytes int64
	// MaxEndKeyBytes bounds the ends evicted at MaxEndedBytes while a
	// member lacked them, kept in their small form until every member has
	// them (0: the larger of MaxEndedBytes and DefaultMinEndKeyBytes).
	MaxEndKeyBytes int64
	// MemberClaim is how long a member that left keeps its claim on the
	// ends it has not acknowledged.
	MemberClaim time.Duration
	// MaxGoneMembers and MaxGoneBytes bound the members that left and
	// still hold their claim (0: DefaultMaxGoneMembers and
	// DefaultMaxGoneBytes): past either, the one that left longest ago is
	// dropped.
	MaxGoneMembers int
	MaxGoneBytes   int64
	// LeaseUnit is one second of a lease (shorter in tests).
	LeaseUnit time.Duration
	Journal   Journal // nil: nothing is written
	Now       func() time.Time
}

// Journal is where the table writes its records, in the order of its
// changes (internal/statejournal). Append copies payload before it
// returns: the table builds its records in a buffer it reuses.
type Journal interface {
	Append(payload []byte) (uint64, error)
}

// Table is the state table. Its methods are safe for concurrent use.
type Table struct {
	// mu guards everything below but the atomics. It is the design card's
	// activeMu: taken under the ingress's ingestMu and alone by every other
	// caller, and nothing is taken under it but the journal's append lock.
	mu  sync.Mutex
	cfg Config

	byKey    map[wireframe.WorkloadKey]*entry // runs
	byRef    map[wireframe.WorkloadRef]*entry // the first of a workload's runs
	removals map[wireframe.WorkloadRef]*entry // removal tombstones
	members  map[string]*Member               // by node id and principal (peersend.Target.MemberID)
	versions order                            // every entry, oldest version first
	pass     order                            // the runs re-asserted, first tracked first
	linked   uint64                           // the last pass order given
	version  atomic.Uint64                    // the last version given
	inPass   int                              // runs in pass order
	passSize int64                            // their lines' bytes
	ended    int64                            // tombstones' bytes (the ends of runs this node held)
	ends     endQueue                         // tombstones, oldest first
	// unheldBytes and unheldEnds are the removals of workloads the table
	// held no run of, with a bound of their own (evictLocked).
	unheldBytes int64
	unheldEnds  endQueue
	// keyBytes and keyEnds are the ends kept in their small form
	// (compactEnd), with a bound of their own (MaxEndKeyBytes).
	keyBytes int64
	keyCount int
	keyEnds  endQueue
	leases   leaseHeap     //
	leaseCh  chan struct{} // poked when the earliest deadline may have moved
	stats    Stats         //
	self     string        //
	// journaledBytes is what the journaled entries' records take: what a
	// compaction would write, beside the members' marks.
	journaledBytes int64
	// waiting are the members that found nothing to take (wakeLocked),
	// dirty those whose mark is not written yet (flushMarksLocked).
	waiting, dirty []*Member
	// goneHead..goneTail are the members that left, oldest departure
	// first, goneCount of them taking goneBytes (boundGoneLocked).
	goneHead, goneTail *Member
	goneCount          int
	goneBytes          int64
	// low keeps the members' lowest mark (lowmark.go).
	low markHeap
	// rec is the buffer a put's record is built in (journalPut).
	rec []byte
}

// DefaultMinEndKeyBytes is the least bound on the ends kept in their small
// form: some 40,000 ends of about 400 bytes, so a member away past tens of
// thousands of ends still learns each is over, whatever --max-ended-bytes.
const DefaultMinEndKeyBytes = 16 << 20

// The default bound on the members that left: a cluster's nodes leave and
// come back (a flap, a reboot); 1,024 of them, at most 256 KiB, is far
// more than a cluster has nodes, and a member dropped so is only sent the
// whole table when it comes back.
const (
	DefaultMaxGoneMembers = 1024
	DefaultMaxGoneBytes   = 256 << 10
)

// Stats are the table's counters, for the metrics.
type Stats struct {
	Evicted       atomic.Uint64 // ends taken out of the ended bytes at their bound (kept small while a member lacks them)
	Compacted     atomic.Uint64 // of those, ends a member lacked, kept in their small form
	KeysEvicted   atomic.Uint64 // small ends dropped at MaxEndKeyBytes before every member had them
	EvictedUnheld atomic.Uint64 // removals of unheld workloads dropped at their own bound
	FullPasses    atomic.Uint64 // members sent the whole table because an end they lacked was evicted
	Forgotten     atomic.Uint64 // ends forgotten once every member had them
	Untracked     atomic.Uint64 // broker frames not kept: a bound was reached
	Refused409    atomic.Uint64 // producer frames refused: the broker owns the workload
	JournalFailed atomic.Uint64 // records not appended to the journal
	LeaseRenewed  atomic.Uint64
	ClaimsExpired atomic.Uint64 // members whose claim ran out
	GoneDropped   atomic.Uint64 // members that left, dropped at their bound (MaxGoneMembers, MaxGoneBytes)
	GoneReplaced  atomic.Uint64 // members that left, dropped when their node came back under a new id (ForgetGone)
	MarksWritten  atomic.Uint64 // members' marks written to the journal (flushMarksLocked)
}

// New returns an empty table.
func New(cfg Config) *Table {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LeaseUnit == 0 {
		cfg.LeaseUnit = time.Second
	}
	if cfg.MaxEndKeyBytes == 0 {
		cfg.MaxEndKeyBytes = max(cfg.MaxEndedBytes, DefaultMinEndKeyBytes)
	}
	if cfg.MaxGoneMembers == 0 {
		cfg.MaxGoneMembers = DefaultMaxGoneMembers
	}
	if cfg.MaxGoneBytes == 0 {
		cfg.MaxGoneBytes = DefaultMaxGoneBytes
	}
	t := &Table{
		cfg:      cfg,
		byKey:    map[wireframe.WorkloadKey]*entry{},
		byRef:    map[wireframe.WorkloadRef]*entry{},
		removals: map[wireframe.WorkloadRef]*entry{},
		members:  map[string]*Member{},
		leaseCh:  make(chan struct{}, 1),
	}
	t.versions.at = func(e *entry) *links { return &e.v }
	t.pass.at = func(e *entry) *links { return &e.p }
	return t
}

// SetJournal sets where the table writes its records; called once, before
// the first change.
func (t *Table) SetJournal(j Journal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cfg.Journal = j
}

// SetMaxLiveBytes sets MaxLiveBytes; tests lower it below what the flag
// accepts, to reach it with a few small frames.
func (t *Table) SetMaxLiveBytes(n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cfg.MaxLiveBytes = n
}

// SetLeaseUnit sets the length of a lease's second (tests shorten it).
func (t *Table) SetLeaseUnit(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cfg.LeaseUnit = d
}

// Stats returns the table's counters.
func (t *Table) Stats() *Stats { return &t.stats }

// Version is the last version given; it needs no lock.
func (t *Table) Version() uint64 { return t.version.Load() }

// Frame is one local-origin frame to commit.
type Frame struct {
	Source       Source
	Life         *wireframe.Lifecycle // a lifecycle frame's; nil for a removal
	Removal      *wireframe.Removal   // a removal's
	LeaseSeconds int                  // a producer frame's Workload-Lease, 0 for none
	// Line is the frame as the table keeps it, when the caller built it
	// already (ReassertionLine for a run, the notification for a removal):
	// the ingress builds it before its frame enters the broker order.
	Line []byte
	// Echo says a broker lifecycle frame is the broker's replay of a
	// frame this node's ingress wrote up: its ingress mark checked
	// (internal/ingressmark), LeaseSeconds the lease the mark was made
	// under. It makes a workload the table holds no run of a producer's,
	// with that lease armed from now (spec 3.5.3): a crash between the
	// broker write and the journal lost the journal's word for it. Of a
	// workload the table holds it is a broker frame like any other.
	Echo bool
	// Claimed is set by Commit when an Echo made the workload a
	// producer's.
	Claimed bool
}

func (f *Frame) ref() wireframe.WorkloadRef {
	if f.Life == nil {
		return f.Removal.Ref
	}
	return f.Life.Ref()
}

// Outcome says what Commit did with a frame.
type Outcome uint8

const (
	Applied       Outcome = iota // the table holds it: every member is sent it
	Stale                        // the entry held is later (supersedes)
	Full                         // a new run while the table holds MaxLive runs (a broker frame)
	FullBytes                    // the run would take the table past MaxLiveBytes (a broker frame)
	ReplayDropped                // the broker's replay of a run a producer removed
	BrokerTook                   // a producer's frame for a workload the broker took after its check
	LineTooLong                  // a broker frame whose line is over MaxLineBytes
)

func (o Outcome) String() string {
	return [...]string{"applied", "stale", "full", "full_bytes", "replay_dropped", "broker_took", "line_too_long"}[o]
}

// Commit applies a local-origin frame: the one place the table changes
// for a frame, from the broker or a producer alike. It returns what it did
// and the journal sequence of its record (0 for none): an ingress frame's
// answer waits for that record to be durable.
func (t *Table) Commit(f *Frame) (Outcome, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	t.reapLocked(now)
	var o Outcome
	var seq uint64
	if f.Life == nil {
		o, seq = t.commitRemoval(f, now)
	} else {
		o, seq = t.commitLifecycle(f, now)
	}
	if o == Applied {
		t.wakeLocked()
	}
	return o, seq
}

// brokerOwns reports whether the broker owns ref: the table holds a run of
// it within its retention, and none of them is a producer's.
func (t *Table) brokerOwns(ref wireframe.WorkloadRef) bool {
	held := false
	for e := t.byRef[ref]; e != nil; e = e.sibling {
		if e.retired {
			continue
		}
		if e.owner == Producer {
			return false
		}
		held = true
	}
	return held
}

// producerOwns reports whether a producer owns ref: a run of it within its
// retention is a producer's.
func (t *Table) producerOwns(ref wireframe.WorkloadRef) bool {
	for e := t.byRef[ref]; e != nil; e = e.sibling {
		if !e.retired && e.owner == Producer {
			return true
		}
	}
	return false
}

// ErrBrokerOwned is a producer's frame naming a workload the broker owns:
// the ingress answers 409.
type ErrBrokerOwned struct{ Ref wireframe.WorkloadRef }

func (e *ErrBrokerOwned) Error() string {
	return fmt.Sprintf("workload %q (originatedFrom %s) entered through this node's broker, not the ingress: a producer may report, remove or lease only the workloads it posted, or new ids", clip(e.Ref.ID), e.Ref.Origin)
}

// CheckProducer refuses a producer's frame for a workload the broker owns,
// before anything is written for it.
func (t *Table) CheckProducer(ref wireframe.WorkloadRef) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.brokerOwns(ref) {
		t.stats.Refused409.Add(1)
		return &ErrBrokerOwned{Ref: ref}
	}
	return nil
}

// IsBrokerOwned reports whether err is CheckProducer's refusal.
func IsBrokerOwned(err error) bool { return errors.As(err, new(*ErrBrokerOwned)) }

func (t *Table) commitLifecycle(f *Frame, now time.Time) (Outcome, uint64) {
	ev := f.Life
	ref, k := ev.Ref(), ev.Key()
	producer := f.Source == FromProducer
	if producer && t.brokerOwns(ref) {
		return BrokerTook, 0
	}
	owned := producer || t.producerOwns(ref)
	claims := f.Echo && !producer && !owned && !t.brokerOwns(ref)
	if r := t.removals[ref]; r != nil && !r.retired && r.replayDrop {
		switch {
		case producer:
			// The producer reports the workload anew: its removal no
			// longer speaks for the broker's frames.
			r.replayDrop = false
		case !ev.Resync && (r.runs == nil || hasRun(r.runs, k)):
			return ReplayDropped, 0
		}
	}
	e := t.byKey[k]
	// An end past its retention no longer holds its run: a frame for it
	// starts the run again, as if the table held none, and a member that
	// missed the end is sent the newer state instead.
	held := e != nil && !e.retired
	if held && !supersedes(ev, e) {
		// Nothing changes, but the state the frame's answer stands on is
		// the held one: its answer waits for that state's record (which
		// may be in a group still being written, or one that failed).
		return Stale, e.recSeq
	}
	line := f.Line
	if line == nil {
		line = ReassertionLine(ev.Method, ev.Params)
	}
	if len(line) > MaxLineBytes {
		// Its record would pass the bound a restore holds it to. Only a
		// broker frame's re-encoding reaches this (MaxLineBytes); like a
		// frame over the byte bound, it deletes the run rather than leave
		// the older state re-asserted.
		t.stats.Untracked.Add(1)
		if e != nil {
			t.deleteEntry(e)
		}
		return LineTooLong, 0
	}
	if !held && !producer && t.inPass >= t.cfg.MaxLive {
		t.stats.Untracked.Add(1)
		return Full, 0
	}
	grow := int64(len(line))
	if held {
		grow -= int64(len(e.line))
	}
	if !producer && grow > 0 && t.passSize+grow > t.cfg.MaxLiveBytes {
		// Re-asserting the older state held would undo, at every peer,
		// the newer one the broker holds: the run is dropped instead.
		t.stats.Untracked.Add(1)
		if e != nil {
			t.deleteEntry(e)
		}
		return FullBytes, 0
	}
	switch {
	case e == nil:
		e = t.newRun(k)
	case !held:
		t.unretire(e)
		e.owner = Broker // the run starts again: whoever owned its end does not own it
	}
	t.setRun(e, ev, line, now)
	e.asserted = ev.Resync && !producer
	if owned || claims {
		e.owner = Producer
	}
	t.applyLease(e, f, now)
	if claims {
		f.Claimed = true
		t.armEchoLease(e, f.LeaseSeconds, now)
	}
	return Applied, t.journalPut(e)
}

// newRun creates the entry of a new run, in pass order and its workload's
// chain.
func (t *Table) newRun(k wireframe.WorkloadKey) *entry {
	k = t.ownKey(k)
	e := &entry{key: k}
	t.byKey[k] = e
	ref := k.Ref()
	e.sibling = t.byRef[ref]
	t.byRef[ref] = e
	t.linkPass(e)
	return e
}

// ownKey returns k with its strings in one allocation of their own: the
// origin sharing the node id's bytes when it is this node, and a run id
// that is the id (as most producers send it) sharing the id's. A frame's
// strings arrive in one allocation with every other string of its
// workload object (its model, state, requester...): a run whose key held
// them would keep them all alive for as long as the table holds it, some
// tens of bytes per run at 100,000 runs.
func (t *Table) ownKey(k wireframe.WorkloadKey) wireframe.WorkloadKey {
	var stack [256]byte
	b := stack[:0]
	self := k.Origin == t.cfg.Self
	if !self {
		b = append(b, k.Origin...)
	}
	b = append(b, k.ID...)
	sameRun := k.RunID == k.ID
	if !sameRun {
		b = append(b, k.RunID...)
	}
	b = append(b, k.Engine...)
	all := string(b)
	out := wireframe.WorkloadKey{Origin: t.cfg.Self}
	if !self {
		out.Origin, all = all[:len(k.Origin)], all[len(k.Origin):]
	}
	out.ID, all = all[:len(k.ID)], all[len(k.ID):]
	out.RunID = out.ID
	if !sameRun {
		out.RunID, all = all[:len(k.RunID)], all[len(k.RunID):]
	}
	out.Engine = all
	return out
}

// sharedOrigin returns k with its origin sharing the node id's bytes when
// it is this node: every local key's origin is, and one string for all
// saves an allocation per entry.
func (t *Table) sharedOrigin(k wireframe.WorkloadKey) wireframe.WorkloadKey {
	if k.Origin == t.cfg.Self {
		k.Origin = t.cfg.Self
	}
	return k
}

// setRun records ev as e's latest state, with a new version.
func (t *Table) setRun(e *entry, ev *wireframe.Lifecycle, line []byte, now time.Time) {
	wasEnd := e.kind != kindLive
	oldSize := e.size()
	t.passSize += int64(len(line) - len(e.line))
	e.line = line
	e.rank, e.seq, e.hasSeq = rankOf(ev.Info.State), ev.Info.Seq, ev.Info.HasSeq
	// A new entry's requester is part of the allocation its key's strings
	// are parts of, so it costs only its bytes; a later event's would keep
	// that event's whole allocation alive: kept when the same, else copied.
	if e.requester != ev.Info.Requester {
		e.requester = strings.Clone(ev.Info.Requester)
	}
	e.hasRequester = ev.Info.HasRequester
	if wasEnd {
		*t.endBytes(e) -= oldSize
		t.uncompact(e)
	}
	if ev.Terminal() {
		e.kind, e.endedAt = kindTerminal, now
		t.ended += e.size()
	} else {
		e.kind, e.endedAt = kindLive, time.Time{}
	}
	t.bump(e)
	if e.kind == kindTerminal {
		t.ends.push(e)
		t.evictLocked()
	}
}

func hasRun(runs []runKey, k wireframe.WorkloadKey) bool {
	for _, r := range runs {
		if r.engine == k.Engine && r.runID == k.RunID {
			return true
		}
	}
	return false
}

func (t *Table) commitRemoval(f *Frame, now time.Time) (Outcome, uint64) {
	ref := f.Removal.Ref
	producer := f.Source == FromProducer
	if producer && t.brokerOwns(ref) {
		return BrokerTook, 0
	}
	// A removal of a workload the table holds no run of is relayed all
	// the same: the peers may hold it (an end this node forgot once every
	// member had it, a job finished long ago that a user removes from the
	// Jobs list). Its tombstone is unheld: it counts against a budget of
	// its own, so removals of ids this node never held cannot push out
	// the ends of the workloads it did.
	unheld := t.byRef[ref] == nil
	owned := t.producerOwns(ref)
	var runs []runKey
	for e := t.byRef[ref]; e != nil; {
		next := e.sibling
		runs = append(runs, runKey{e.key.Engine, e.key.RunID})
		t.deleteEntry(e)
		e = next
	}
	r := t.removals[ref]
	if r == nil {
		r = &entry{key: t.sharedOrigin(wireframe.WorkloadKey{Origin: ref.Origin, ID: ref.ID}), kind: kindRemoved, unheld: unheld}
		t.removals[ref] = r
	} else {
		*t.endBytes(r) -= r.size()
		t.uncompact(r)
		r.retired = false
		r.unheld = r.unheld && unheld
	}
	line := f.Line
	if line == nil {
		line = wireframe.EncodeNotification(wireframe.MethodRemove, f.Removal.Params)
	}
	r.line = line
	// A repeat of a removal whose runs are gone is relayed again, but it
	// neither extends nor starts a window of replays dropped: a producer
	// cannot keep an id silenced for the broker by removing it again.
	if !unheld || r.endedAt.IsZero() {
		r.endedAt, r.runs = now, keptRuns(runs)
		r.replayDrop = producer && owned
	}
	if producer {
		r.owner = Producer
	}
	*t.endBytes(r) += r.size()
	t.bump(r)
	t.ends.push(r)
	if r.unheld {
		t.unheldEnds.push(r)
	}
	t.evictLocked()
	return Applied, t.journalPut(r)
}

// keptRuns is what a removal's tombstone keeps of the runs it removed: all
// of them up to MaxRemovalRuns, else none, which stands for any run (a
// replay of each is still dropped) in a record of bounded size.
func keptRuns(runs []runKey) []runKey {
	if len(runs) > MaxRemovalRuns {
		return nil
	}
	return runs
}

// bump gives e the next version and moves it to the end of version order.
// The counter cannot wrap: a restore starts it at most at MaxVersion, and
// it takes 3 x 2^62 changes from there (MaxVersion says how long that is).
func (t *Table) bump(e *entry) {
	if e.version != 0 {
		t.unlinkVersion(e)
	}
	e.version = t.version.Add(1)
	e.changedAt = t.cfg.Now().UnixNano()
	t.linkVersion(e)
}

// deleteEntry takes e out of the table, its journal record with it.
func (t *Table) deleteEntry(e *entry) {
	if e.gone {
		return
	}
	e.gone = true
	if e.journaled {
		t.journalForget(e)
	}
	if e.kind != kindLive {
		*t.endBytes(e) -= e.size()
	}
	if e.compact {
		t.keyCount--
	}
	t.unlinkVersion(e)
	t.leavePass(e)
	t.endLease(e)
	if e.kind == kindRemoved {
		delete(t.removals, e.key.Ref())
		return
	}
	delete(t.byKey, e.key)
	t.unchain(e)
}

// unchain takes a run out of its workload's chain.
func (t *Table) unchain(e *entry) {
	ref := e.key.Ref()
	switch first := t.byRef[ref]; {
	case first == e && e.sibling == nil:
		delete(t.byRef, ref)
	case first == e:
		t.byRef[ref] = e.sibling
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

// unretire puts an end past its retention back in pass order, for a frame
// that takes its run again.
func (t *Table) unretire(e *entry) {
	e.retired = false
	t.linkPass(e)
	t.passSize += int64(len(e.line))
}

// retire takes an end past its retention out of pass order: it is no
// longer re-asserted or listed, and holds its run and id no more.
func (t *Table) retire(e *entry) {
	e.retired = true
	t.leavePass(e)
}

// leavePass takes e out of pass order, with its line's bytes.
func (t *Table) leavePass(e *entry) {
	if e.inPass {
		t.unlinkPass(e)
		t.passSize -= int64(len(e.line))
	}
}

// links are an entry's place in one of its two orders.
type links struct{ prev, next *entry }

// order is one intrusive doubly linked list of entries, through the links
// at gives for each: version order or pass order.
type order struct {
	head, tail *entry
	at         func(*entry) *links
}

func (o *order) pushBack(e *entry) {
	l := o.at(e)
	l.prev, l.next = o.tail, nil
	if o.tail == nil {
		o.head = e
	} else {
		o.at(o.tail).next = e
	}
	o.tail = e
}

// remove takes e out of the list; its own links are left as they were.
func (o *order) remove(e *entry) {
	l := o.at(e)
	if l.prev == nil {
		o.head = l.next
	} else {
		o.at(l.prev).next = l.next
	}
	if l.next == nil {
		o.tail = l.prev
	} else {
		o.at(l.next).prev = l.prev
	}
}

func (t *Table) linkVersion(e *entry) { t.versions.pushBack(e) }

// unlinkVersion takes e out of version order; a cursor past it moves back
// to the entry before it, so it still names the last entry it has.
func (t *Table) unlinkVersion(e *entry) {
	e.handOver()
	t.versions.remove(e)
	e.v = links{}
}

func (t *Table) linkPass(e *entry) {
	t.linked++
	e.order = t.linked
	e.inPass = true
	t.inPass++
	t.pass.pushBack(e)
}

// unlinkPass takes e out of pass order; the passes about to visit it (the
// ones parked on it, not every pass in progress) move on to the entry
// after it. e keeps its next link: a read-back that holds e between two
// slices goes on from e to the entries that followed it.
func (t *Table) unlinkPass(e *entry) {
	for e.parked != nil {
		e.parked.park(e.p.next)
	}
	t.pass.remove(e)
	e.p.prev = nil
	e.inPass = false
	t.inPass--
}

// Limit names the bound a producer's frame found reached.
type Limit int

const (
	UnderLimit   Limit = iota
	LimitEntries       // --max-live-workloads
	LimitBytes         // --max-live-workload-bytes
)

// AtLimit reports which bound a producer's frame would pass: the entry
// bound when it would start a new run while the table, with pending more
// runs on their way into it, holds MaxLive; the byte bound when a line of
// lineBytes, with pendingBytes more on their way, would take it past
// MaxLiveBytes. With a bound reached it says how long until room may free.
// held reports whether the table holds the frame's run.
func (t *Table) AtLimit(ev *wireframe.Lifecycle, pending int, pendingBytes int64, lineBytes int) (hit Limit, held bool, after time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	t.reapLocked(now)
	e := t.byKey[ev.Key()]
	held = e != nil && !e.retired
	grow := int64(lineBytes)
	switch {
	case held && !supersedes(ev, e):
		grow = 0 // not taken: it takes no room
	case held:
		grow -= int64(len(e.line))
	}
	switch {
	case !held && t.inPass+pending >= t.cfg.MaxLive:
		hit = LimitEntries
	case grow > 0 && t.passSize+pendingBytes+grow > t.cfg.MaxLiveBytes:
		hit = LimitBytes
	default:
		return UnderLimit, held, 0
	}
	return hit, held, t.retryAfterLocked(now)
}

// retryAfterLocked is how long until room may free in a table at a bound:
// until the oldest retained end retires, or half the retention when every
// run is live.
func (t *Table) retryAfterLocked(now time.Time) time.Duration {
	if e := t.ends.firstUnretired(); e != nil && e.kind == kindTerminal {
		return e.endedAt.Add(t.cfg.Retention).Sub(now)
	}
	return t.cfg.Retention / 2
}

// Sizes are the table's gauges.
type Sizes struct {
	Runs, Removals, Members, Leases   int
	RunBytes, EndedBytes, UnheldBytes int64
	// EndKeys ends are kept in their small form, taking EndKeyBytes.
	EndKeys     int
	EndKeyBytes int64
	// GoneMembers of the Members left, taking GoneBytes (boundGoneLocked).
	GoneMembers int
	GoneBytes   int64
}

// Sizes returns the table's gauges; O(1).
func (t *Table) Sizes() Sizes {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Sizes{Runs: t.inPass, RunBytes: t.passSize, EndedBytes: t.ended, UnheldBytes: t.unheldBytes, Removals: len(t.removals), Members: len(t.members), Leases: len(t.leases),
		GoneMembers: t.goneCount, GoneBytes: t.goneBytes, EndKeys: t.keyCount, EndKeyBytes: t.keyBytes}
}

// Latest returns the lines of the runs the table holds of ref within their
// retention, the run that changed last last, and whether a removal of it
// is held.
func (t *Table) Latest(ref wireframe.WorkloadRef) (lines []Line, removed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for e := t.byRef[ref]; e != nil; e = e.sibling {
		if !e.retired {
			lines = append(lines, e.lineOf())
		}
	}
	return lines, t.removals[ref] != nil
}

// Prune retires and forgets what is due, a budget at a time, and writes
// the marks that moved since the last Prune; it reports whether more is
// due. The Manager calls it on a tick, so a node without traffic still
// frees what it may.
func (t *Table) Prune() (more bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flushMarksLocked()
	return t.reapLocked(t.cfg.Now())
}

// FlushMarks writes the marks that moved since the last Prune: at a clean
// stop, after the senders stopped, so a restart sends nobody again what it
// took.
func (t *Table) FlushMarks() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flushMarksLocked()
}

// reapBudget is the most ends one reap looks at: ends that ended together
// retire together, and a hold of the lock stays short.
const reapBudget = 256

// reapLocked retires the ends past their retention, forgets those every
// member has too, and drops the claims of members gone past theirs. It
// reports whether more is due.
func (t *Table) reapLocked(now time.Time) (more bool) {
	n := 0
	for e := t.ends.atRetire(); e != nil; e = t.ends.atRetire() {
		if n == reapBudget {
			return true
		}
		n++
		if now.Sub(e.endedAt) < t.cfg.Retention {
			break
		}
		t.retire(e)
		t.ends.retireHead++
	}
	t.expireClaimsLocked(now)
	low := uint64(0)
	if e := t.ends.atForget(); e != nil && e.retired {
		low = t.lowMarkLocked()
	}
	for e := t.ends.atForget(); e != nil; e = t.ends.atForget() {
		if n == reapBudget {
			return true
		}
		n++
		if !e.retired || e.version > low {
			break
		}
		t.deleteEntry(e)
		t.stats.Forgotten.Add(1)
		t.ends.forgetHead++
	}
	t.ends.compact()
	return t.forgetKeysLocked(n)
}

// forgetKeysLocked forgets the small ends every member has now, within
// what is left of the reap's budget (n spent); it reports whether more
// is due.
func (t *Table) forgetKeysLocked(n int) (more bool) {
	e := t.keyEnds.atForget()
	if e == nil || e.version > t.lowMarkLocked() {
		return false
	}
	low := t.lowMarkLocked()
	for ; e != nil && e.version <= low; e = t.keyEnds.atForget() {
		if n == reapBudget {
			return true
		}
		n++
		t.deleteEntry(e)
		t.stats.Forgotten.Add(1)
		t.keyEnds.forgetHead++
	}
	t.keyEnds.compact()
	return false
}

// expireClaimsLocked drops the members that left longer than their claim
// ago: the oldest departure first, so a reap looks at one member that
// stays.
func (t *Table) expireClaimsLocked(now time.Time) {
	for m := t.goneHead; m != nil && now.Sub(m.departed) >= t.cfg.MemberClaim; m = t.goneHead {
		t.dropMemberLocked(m)
		t.stats.ClaimsExpired.Add(1)
	}
}

// endBytes is the count e's bytes are kept in: the ends of workloads this
// node held, or the unheld removals'.
func (t *Table) endBytes(e *entry) *int64 {
	switch {
	case e.compact:
		return &t.keyBytes
	case e.unheld:
		return &t.unheldBytes
	}
	return &t.ended
}

// unheldShare is the part of MaxEndedBytes the unheld removals may take,
// beside it: an eighth, some 20,000 removals at the default.
const unheldShare = 8

// evictLocked takes the oldest ends out while the tombstones are over
// their byte bound, acknowledged or not. An end a member lacks keeps the
// truth that its run is over: it stays, at its version, in its small form
// (compactEnd), until every member has it, within MaxEndKeyBytes; past
// that the oldest small one goes, and a member that lacked it is sent the
// whole table from the start. The unheld removals have a bound of their
// own, and a member that misses an evicted one is not sent the table
// again: the table never held what it names.
func (t *Table) evictLocked() {
	for t.ended > t.cfg.MaxEndedBytes {
		e := t.ends.atForget()
		if e == nil || e == t.versions.tail {
			break // the newest always stays
		}
		t.ends.forgetHead++
		t.ends.retireHead = max(t.ends.retireHead, t.ends.forgetHead)
		t.stats.Evicted.Add(1)
		if !e.unheld && t.lowMarkLocked() < e.version {
			t.compactEnd(e)
			continue
		}
		t.deleteEntry(e)
	}
	for t.keyBytes > t.cfg.MaxEndKeyBytes {
		e := t.keyEnds.atForget()
		if e == nil || e == t.versions.tail {
			break
		}
		t.keyEnds.forgetHead++
		t.resetLacking(e)
		t.deleteEntry(e)
		t.stats.KeysEvicted.Add(1)
	}
	t.keyEnds.compact()
	for t.unheldBytes > t.cfg.MaxEndedBytes/unheldShare {
		e := t.unheldEnds.atForget()
		if e == nil || e == t.versions.tail {
			return
		}
		t.unheldEnds.forgetHead++
		t.deleteEntry(e)
		t.stats.EvictedUnheld.Add(1)
	}
	t.unheldEnds.compact()
}

// uncompact notes that a small end changed (its bytes already taken out
// of keyBytes): it is whole again, counted where its kind says.
func (t *Table) uncompact(e *entry) {
	if e.compact {
		e.compact = false
		t.keyCount--
	}
}

// resetLacking sends every member that lacks e the whole table again: e
// goes before it had it.
func (t *Table) resetLacking(e *entry) {
	if t.lowMarkLocked() >= e.version {
		return
	}
	for _, m := range t.members {
		if m.mark < e.version {
			t.resetLocked(m)
		}
	}
}

// compactEnd keeps an end a member lacks in its small form (compactLine):
// out of the ended bytes and out of pass order (retired: it no longer
// holds its run or id), at its version, so every member whose mark is
// below it is still sent it, and forgotten once every member has it.
func (t *Table) compactEnd(e *entry) {
	t.ended -= e.size()
	if !e.retired {
		t.retire(e)
	}
	e.line = compactLine(e)
	e.compact = true
	t.keyBytes += e.size()
	t.keyCount++
	t.keyEnds.push(e)
	if e.journaled {
		// What a compaction would write now; the record in the file
		// stays whole until then, and a restart compacts it again.
		t.setJournaled(e, len(encodePut(nil, e)))
	}
	t.stats.Compacted.Add(1)
}

// clip shortens a value for an answer or a log line.
func clip(s string) string {
	const max = 256
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
