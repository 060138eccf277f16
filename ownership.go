package main

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ownjournal"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/wireframe"
)

// Ownership (spec 3.5.3). The daemon knows which workloads entered through
// its ingress (a producer owns them) and which through the broker (the
// broker owns them). A producer may report, remove and lease only the
// workloads it owns, or ids the daemon does not hold: a frame naming a
// workload the broker owns is refused 409 before anything is written, so
// a producer whose id collides with a proxy's can neither retire the
// proxy's job at every member nor, through the removal memory, silence the
// broker's later frames for it. The seed accepted that collision for a
// one-minute window by documentation; knowing the owner, the daemon need
// not accept it at all.
//
// Ownership survives a restart through the journal (journal.go): the
// broker replays its store to a restarted daemon, and a replayed frame for
// a workload the journal lists is the producer's again, leased again if it
// was, and listed by the read-back.

// restartLeaseGrace is the least time a lease restored from the journal is
// given once its job is replayed, in lease units (a second each): a
// producer that outlived the daemon's restart renews at a third of its
// lease, and its renewals failed while the daemon was down. A lease whose
// deadline passed while the daemon was down runs out this long after its
// job is replayed; one still ahead keeps its deadline.
const restartLeaseGrace = minLeaseSeconds

// ownership is the set of workloads the producers own. It is guarded by
// Manager.activeMu and changed only in the commit step (trackLocal), except
// the restored set's drop, which pruneResync does.
type ownership struct {
	// owned holds the workloads an ingress frame was committed for, or a
	// replay of one the journal listed, while the re-sync set holds a run
	// of them: a removal, from either side, ends it, and so does the set
	// dropping the workload's last run (resyncSet.gone).
	owned map[wireframe.WorkloadRef]struct{}
	// restored holds the workloads the journal listed at start that no
	// frame has named since, with their leases. A replay moves an entry to
	// owned; the whole map is dropped once the replay window has passed
	// (restoredUntil), so a journal entry the broker no longer holds is not
	// kept forever.
	restored      map[wireframe.WorkloadRef]restoredOwn
	restoredUntil time.Time

	refusals atomic.Uint64 // ingress frames refused 409: a broker-owned workload
}

// restoredOwn is a journal entry's lease: 0 seconds for none.
type restoredOwn struct {
	seconds  int
	deadline time.Time
}

func newOwnership() ownership {
	return ownership{owned: map[wireframe.WorkloadRef]struct{}{}}
}

// owns reports whether a producer owns ref.
func (o *ownership) owns(ref wireframe.WorkloadRef) bool {
	if _, ok := o.owned[ref]; ok {
		return true
	}
	_, ok := o.restored[ref]
	return ok
}

func (o *ownership) drop(ref wireframe.WorkloadRef) {
	delete(o.owned, ref)
	delete(o.restored, ref)
}

func (o *ownership) len() int { return len(o.owned) + len(o.restored) }

// errNotOwned is an ingress frame naming a workload the broker owns: 409.
type errNotOwned struct{ ref wireframe.WorkloadRef }

func (e *errNotOwned) Error() string {
	return fmt.Sprintf("workload %q (originatedFrom %s) entered through this node's broker, not the ingress: a producer may report, remove or lease only the workloads it posted, or new ids", httpguard.ClipReason(e.ref.ID), e.ref.Origin)
}

// errRemovalsFull is an ingress removal refused because the removal memory
// holds its most: 503 with the time until its oldest entry expires.
type errRemovalsFull struct {
	limit int
	after time.Duration
}

func (e *errRemovalsFull) Error() string {
	return fmt.Sprintf("this node remembers %d removals made within the retention window, its most; retry after %d s", e.limit, e.retryAfterSeconds())
}

func (e *errRemovalsFull) retryAfterSeconds() int {
	return max(1, int((e.after+time.Second-1)/time.Second))
}

// checkOwner refuses an ingress frame that names a workload the broker
// owns (the re-sync set holds a run of it and no producer owns it), and a
// removal of an owned workload while the removal memory is full. Called
// with ingestMu held, before the frame takes its place in the broker
// order, so a refused frame is neither written, relayed nor remembered.
func (m *Manager) checkOwner(f *localFrame) error {
	ref := f.ref()
	m.activeMu.Lock()
	defer m.activeMu.Unlock()
	owned := m.own.owns(ref)
	if !owned && m.resync.byRef[ref] != nil {
		m.own.refusals.Add(1)
		return &errNotOwned{ref: ref}
	}
	if f.isRemoval() && owned {
		now := m.now()
		if full, after := m.removed.full(ref, now); full {
			m.removed.refusals.Add(1)
			return &errRemovalsFull{limit: m.removed.capacity, after: after}
		}
	}
	return nil
}

// brokersNow reports, at an ingress frame's commit (activeMu held),
// whether the broker owns ref: the re-sync set holds a run of it and no
// producer owns it. checkOwner refused a frame in that state, so it arose
// after the check, while the frame waited for its broker write: the
// broker's own frame for the id was committed in between. The ingress
// frame then neither takes the workload over nor, a removal, untracks and
// retires it at the peers: it is not tracked or relayed (spec 3.5.3).
func (m *Manager) brokersNow(ref wireframe.WorkloadRef) bool {
	return !m.own.owns(ref) && m.resync.byRef[ref] != nil
}

// trackOwned records what a committed frame means for ownership. Called
// from trackLocal with activeMu held, after the re-sync set took the
// frame. A frame of an owned workload marks its run as an ingress run (the
// read-back lists it); a broker frame for a workload restored from the
// journal makes it owned again and re-arms its lease.
func (m *Manager) trackOwned(f *localFrame, src frameSource, owned bool, now time.Time) {
	ref := f.life.Ref()
	if !owned || m.resync.byRef[ref] == nil {
		return
	}
	r, wasRestored := m.own.restored[ref]
	delete(m.own.restored, ref)
	m.own.owned[ref] = struct{}{}
	e := m.resync.entries[f.life.Key()]
	if e == nil {
		return
	}
	e.ingress = true
	if src == fromBroker && wasRestored && r.seconds > 0 && e.terminalAt.IsZero() {
		d := max(r.deadline.Sub(now), restartLeaseGrace*m.leaseUnit)
		m.leases.arm(ref, f.life.Key(), r.seconds, d, now)
	}
}

// dropRestored forgets the journal's workloads that no frame named within
// the replay window: the broker no longer holds them.
func (m *Manager) dropRestored(now time.Time) {
	m.activeMu.Lock()
	defer m.activeMu.Unlock()
	if m.own.restored != nil && !now.Before(m.own.restoredUntil) {
		m.own.restored = nil
		m.journal.changed()
	}
}

// loadJournal reads the journal at start: its owned workloads become the
// restored set, its removals within the retention window the removal
// memory. A journal that cannot be read is one WARN line and a fresh
// start: it never keeps the daemon from starting. The file is first moved
// aside (ownjournal.SetAside), since the next write would replace it: a
// read error need not mean a bad journal (EACCES, EIO, a newer version's
// header after a downgrade), and an operator can still put it back.
func (m *Manager) loadJournal() {
	if m.journal == nil {
		return
	}
	s, err := ownjournal.Read(m.journal.path, m.journal.maxBytes)
	if err != nil {
		aside, aerr := ownjournal.SetAside(m.journal.path)
		kept := "kept_as"
		if aerr != nil {
			kept, aside = "not_kept", httpguard.ClipReason(aerr.Error())
		}
		m.log.Warn("ownership journal unusable: starting without it", "file", m.journal.path, "reason", httpguard.ClipReason(err.Error()), kept, aside)
		return
	}
	now := m.now()
	m.activeMu.Lock()
	defer m.activeMu.Unlock()
	m.own.restored = make(map[wireframe.WorkloadRef]restoredOwn, len(s.Owned))
	m.own.restoredUntil = now.Add(m.resync.retention)
	// Times in the future are not trusted as they stand (a clock stepped
	// back since the write, or an edited file): a lease's deadline is at
	// most its length from now, a removal's time at most now, so neither
	// outlives its window.
	for _, o := range s.Owned {
		deadline := time.UnixMilli(o.LeaseDeadline)
		if latest := now.Add(time.Duration(o.LeaseSeconds) * m.leaseUnit); deadline.After(latest) {
			deadline = latest
		}
		m.own.restored[wireframe.WorkloadRef{Origin: o.Origin, ID: o.ID}] = restoredOwn{seconds: o.LeaseSeconds, deadline: deadline}
	}
	for _, r := range s.Removed {
		at := time.UnixMilli(r.At)
		if at.After(now) {
			at = now
		}
		m.removed.restore(wireframe.WorkloadRef{Origin: r.Origin, ID: r.ID}, at, now)
	}
	if len(s.Owned)+len(s.Removed) > 0 {
		m.log.Info("ownership journal read", "file", m.journal.path, "owned", len(s.Owned), "removed", len(s.Removed))
	}
}

// journalSnapshot copies what the journal holds, under activeMu: owned
// workloads leased ones first, then unleased ones, then the removals newest
// first. Each pass stops at the first entry that would take the entries'
// cost past the journal's bound, and the copies are sized to what the
// bound can hold, so the hold is bounded by the bound, not by the sets:
// the unleased pass skips only leased workloads, all of which fitted. The
// copy is of string headers and numbers only, under one hold of
// leaseTable.mu: encoding is done after both are released.
func (m *Manager) journalSnapshot() (s ownjournal.State, omitted int) {
	m.activeMu.Lock()
	defer m.activeMu.Unlock()
	budget := m.journal.maxBytes
	total := m.own.len()
	s.Owned = make([]ownjournal.Owned, 0, min(total, budget/ownjournal.MinCost))
	full := false
	take := func(ref wireframe.WorkloadRef, seconds int, deadline time.Time) bool {
		c := ownjournal.Cost(ref.Origin, ref.ID)
		if c > budget {
			full = true
			return false
		}
		budget -= c
		o := ownjournal.Owned{Origin: ref.Origin, ID: ref.ID}
		if seconds > 0 {
			o.LeaseSeconds, o.LeaseDeadline = seconds, deadline.UnixMilli()
		}
		s.Owned = append(s.Owned, o)
		return true
	}
	m.leases.mu.Lock()
	for ref, l := range m.leases.byRef {
		if _, owned := m.own.owned[ref]; owned && !take(ref, l.seconds, l.deadline) {
			break
		}
	}
	if !full {
		for ref, r := range m.own.restored {
			if r.seconds > 0 && !take(ref, r.seconds, r.deadline) {
				break
			}
		}
	}
	if !full {
		for ref := range m.own.owned {
			if m.leases.byRef[ref] == nil && !take(ref, 0, time.Time{}) {
				break
			}
		}
	}
	m.leases.mu.Unlock()
	if !full {
		for ref, r := range m.own.restored {
			if r.seconds == 0 && !take(ref, 0, time.Time{}) {
				break
			}
		}
	}
	omitted = total - len(s.Owned)
	s.Removed, omitted = m.removed.snapshot(budget, omitted)
	return s, omitted
}

// journal writes the ownership journal: at most one write per
// journalMinInterval, whenever something it holds changed.
type journal struct {
	path     string
	maxBytes int
	kick     chan struct{} // one pending change is enough

	writes, failures, omitted atomic.Uint64
	bytes                     atomic.Int64
	failLog, omitLog          dropLogger
}

// journalMinInterval spaces the journal's writes: a burst of changes is
// one write, and a crash loses at most the changes of this long and of the
// write under way.
const journalMinInterval = 50 * time.Millisecond

func newJournal(path string, maxBytes int) *journal {
	return &journal{path: path, maxBytes: maxBytes, kick: make(chan struct{}, 1)}
}

// changed asks for a write. Safe on a nil journal (none configured) and
// under any lock: it never blocks.
func (j *journal) changed() {
	if j == nil {
		return
	}
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// runJournal writes the journal when it changed, until done is closed.
func (m *Manager) runJournal(done <-chan struct{}) {
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for {
		select {
		case <-done:
			return
		case <-m.journal.kick:
		}
		m.writeJournal()
		t.Reset(journalMinInterval)
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}

// writeJournal snapshots and writes the journal once. A failed write
// keeps the previous journal whole (ownjournal.Write) and is tried again
// at the next change.
func (m *Manager) writeJournal() {
	s, omitted := m.journalSnapshot()
	file, more := ownjournal.Encode(s, m.journal.maxBytes)
	omitted += more
	j := m.journal
	if omitted > 0 {
		j.omitted.Add(uint64(omitted))
		j.omitLog.noteCounted(m.log, "omitted", "ownership journal at its byte bound: entries left out are forgotten by a restart", "limitBytes", j.maxBytes)
	}
	if err := ownjournal.Write(j.path, file); err != nil {
		j.failures.Add(1)
		j.failLog.noteCounted(m.log, "failed", "ownership journal not written; the previous one stays", "file", j.path, "reason", httpguard.ClipReason(err.Error()))
		return
	}
	j.writes.Add(1)
	j.bytes.Store(int64(len(file)))
}

// writeOwnershipMetrics renders ownership's, the removal memory's and the
// journal's counters and bounds.
func (m *Manager) writeOwnershipMetrics(t *promtext.Text) {
	m.activeMu.Lock()
	owned := m.own.len()
	m.activeMu.Unlock()
	t.Single("nvpair_wlm_ingress_owned_workloads", "gauge", "Workloads the producers own: entered through the ingress (or restored from the journal), not removed.", float64(owned))
	t.Single("nvpair_wlm_ingress_ownership_refusals_total", "counter", "Ingress frames refused 409 because they named a workload the broker owns.", float64(m.own.refusals.Load()))
	t.Single("nvpair_wlm_removal_memory_limit_entries", "gauge", "The most ingress removals remembered within the retention window; a removal past it is refused 503.", float64(m.removed.capacity))
	t.Single("nvpair_wlm_removal_memory_full_refusals_total", "counter", "Ingress removals refused 503 because the removal memory held its most.", float64(m.removed.refusals.Load()))
	// Without a journal (a Manager built without an app dir, in tests) the
	// series are served at zero, so the page has one shape.
	j := m.journal
	if j == nil {
		j = &journal{}
	}
	t.Single("nvpair_wlm_journal_writes_total", "counter", "Ownership journal writes completed (temporary file, fsync, rename, fsync of the directory).", float64(j.writes.Load()))
	t.Single("nvpair_wlm_journal_write_failures_total", "counter", "Ownership journal writes that failed; the previous journal stays.", float64(j.failures.Load()))
	t.Single("nvpair_wlm_journal_bytes", "gauge", "Bytes of the last ownership journal written.", float64(j.bytes.Load()))
	t.Single("nvpair_wlm_journal_limit_bytes", "gauge", "The most bytes the ownership journal may hold.", float64(j.maxBytes))
	t.Single("nvpair_wlm_journal_entries_omitted_total", "counter", "Entries left out of ownership journal writes at its byte bound: a restart forgets them.", float64(j.omitted.Load()))
}

// isNotOwned reports whether err is a 409.
func isNotOwned(err error) bool { return errors.As(err, new(*errNotOwned)) }

// snapshot copies the removals for the journal, newest first while their
// cost fits budget, and returns them oldest first with omitted plus the
// number left out.
func (r *removalMemory) snapshot(budget, omitted int) ([]ownjournal.Removed, int) {
	out := make([]ownjournal.Removed, 0, min(r.order.Len(), budget/ownjournal.MinCost))
	n := 0
	for e := r.order.Back(); e != nil; e = e.Prev() {
		x := e.Value.(removalEntry)
		c := ownjournal.Cost(x.ref.Origin, x.ref.ID)
		if c > budget {
			omitted += r.order.Len() - n
			break
		}
		budget -= c
		n++
		out = append(out, ownjournal.Removed{Origin: x.ref.Origin, ID: x.ref.ID, At: x.at.UnixMilli()})
	}
	slices.Reverse(out)
	return out, omitted
}
