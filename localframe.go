package main

import (
	"encoding/json"
	"fmt"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/wireframe"
)

// localFrame is a validated local-origin frame: one that entered the cluster
// on this node, from the broker or from the ingress.
type localFrame struct {
	method  string
	params  json.RawMessage     // relayed to the peers as they are
	life    wireframe.Lifecycle // set for the lifecycle methods
	removal wireframe.Removal   // set for workloads:remove
	// leaseSeconds is the Workload-Lease an ingress frame carried, 0 for
	// none (lease.go).
	leaseSeconds int
}

func (f *localFrame) isRemoval() bool { return f.method == wireframe.MethodRemove }

// ref is the workload the frame is about.
func (f *localFrame) ref() wireframe.WorkloadRef {
	if f.isRemoval() {
		return f.removal.Ref
	}
	return f.life.Ref()
}

// workloadID is the id the frame is about, for logs.
func (f *localFrame) workloadID() string {
	if f.isRemoval() {
		return f.removal.Ref.ID
	}
	return f.life.Info.ID
}

// parseLocalFrame validates a local-origin frame given its method and
// params. It has no side effects.
func parseLocalFrame(method string, params json.RawMessage) (localFrame, error) {
	switch {
	case wireframe.IsLifecycleMethod(method):
		ev, err := wireframe.ParseLifecycle(method, params)
		return localFrame{method: method, params: ev.Params, life: ev}, err
	case method == wireframe.MethodRemove:
		r, err := wireframe.ParseRemove(params)
		return localFrame{method: method, params: r.Params, removal: r}, err
	default:
		return localFrame{method: method, params: params}, fmt.Errorf("unknown method %q", method)
	}
}

// localFrameFromScan validates a local-origin frame the stdio path has
// scanned whole: the same checks as parseLocalFrame, from the one pass.
func localFrameFromScan(method string, s *wireframe.Scan) (localFrame, error) {
	f := localFrame{method: method, params: s.Params()}
	var err error
	switch {
	case wireframe.IsLifecycleMethod(method):
		f.life, err = s.Lifecycle(method)
	case method == wireframe.MethodRemove:
		f.removal, err = s.Removal()
	default:
		err = fmt.Errorf("unknown method %q", method)
	}
	return f, err
}

// commitLocal is the only place that tracks a local-origin frame and queues
// it for the peers. Both happen under one hold of broadcastMu, tracking
// first, so the frames reach the peer queues in the order they were tracked,
// and a removal has left the re-sync set before it is queued: no heartbeat
// pass can read the workload after that (spec 5.1). It reports whether the
// frame was queued.
func (m *Manager) commitLocal(f localFrame, src frameSource) bool {
	return m.commitLocalLine(f, src, wireframe.EncodeNotification(f.method, f.params))
}

// commitLocalLine is commitLocal with the frame's line to the peers already
// built: an ingress frame's is built before it enters the broker order, so
// the commit the group's leader runs for it does no O(size) work.
func (m *Manager) commitLocalLine(f localFrame, src frameSource, line []byte) bool {
	m.broadcastMu.Lock()
	defer m.broadcastMu.Unlock()
	// Reserved before the track: from the track on, the heartbeat lanes see
	// a frame on its way and take no slice until it is delivered.
	m.bcast.reserve()
	m.activeMu.Lock()
	send := m.trackLocal(&f, src)
	if send && f.isRemoval() {
		// Every relayed removal of a local-origin workload, from the
		// broker or the ingress, goes into the log of recent ends, for a
		// peer that is away now (endedlog.go).
		m.ended.add(wireframe.WorkloadKey{Origin: f.removal.Ref.Origin, ID: f.removal.Ref.ID}, true, line, m.now())
	}
	m.activeMu.Unlock()
	if !send {
		m.bcast.unreserve()
		return false
	}
	return m.bcast.enqueueReserved(outboundFrame{method: f.method, line: line, ref: f.ref()})
}

// trackLocal updates the re-sync set and the removal memory for a frame and
// reports whether the frame is to be broadcast. Called with activeMu held.
func (m *Manager) trackLocal(f *localFrame, src frameSource) bool {
	now := m.now()
	if f.isRemoval() {
		// The removal memory covers the producers' own workloads only
		// (checkOwner refused a broker-owned one), and the runs they held:
		// a repeated removal of an id no one owns any more is relayed but
		// neither remembered nor refreshes the memory, so a producer cannot
		// keep an id it squatted silenced past the window of its removal.
		ref := f.removal.Ref
		if src == fromIngress && m.brokersNow(ref) {
			m.log.Debug("ingress removal of a workload the broker took after the ownership check: not applied", "id", httpguard.ClipLogged(ref.ID))
			return false
		}
		if src == fromIngress && m.own.owns(ref) {
			var runs []runKey
			for e := m.resync.byRef[ref]; e != nil; e = e.sibling {
				runs = append(runs, runKey{e.key.Engine, e.key.RunID})
			}
			m.removed.remember(ref, now, runs...)
		}
		m.resync.untrack(ref)
		m.own.drop(ref)
		m.applyLease(f, src, now)
		m.journal.changed()
		return true
	}
	ref := f.life.Ref()
	if src == fromIngress && m.brokersNow(ref) {
		m.log.Debug("ingress frame for a workload the broker took after the ownership check: not tracked", "method", f.method, "id", httpguard.ClipLogged(ref.ID))
		return false
	}
	// A broker frame for a workload a producer owns is the broker's
	// replay or echo of the producer's: still the producer's.
	owned := src == fromIngress || m.own.owns(ref)
	if owned {
		defer m.journal.changed()
	}
	switch {
	case src == fromIngress:
		m.removed.forget(ref)
	case !f.life.Resync && m.removed.dropsReplay(f.life.Key(), now):
		// The broker's replay of a run a producer removed through the
		// ingress: tracking it would re-assert it to peers forever. A new
		// run under the same id is the broker's own job, and tracked.
		m.log.Debug("replayed frame for a removed ingress workload ignored", "method", f.method, "id", httpguard.ClipLogged(ref.ID))
		return false
	}
	switch m.resync.track(&f.life, now, src == fromIngress) {
	case stale:
		m.log.Debug("stale event not tracked: the re-sync set holds a later one", "method", f.method, "id", httpguard.ClipLogged(ref.ID))
	case full:
		m.resyncUntracked.Add(1)
		m.untrackedLog.note(m.log, "re-sync set full (--max-live-workloads): a new workload is relayed once but not re-asserted",
			"limit", m.resync.limit, "method", f.method, "id", httpguard.ClipLogged(ref.ID))
	case fullBytes:
		m.resyncUntracked.Add(1)
		m.untrackedBytesLog.note(m.log, "re-sync set full (--max-live-workload-bytes): a workload is relayed once but no longer re-asserted",
			"limitBytes", m.resync.maxBytes, "method", f.method, "id", httpguard.ClipLogged(ref.ID))
	}
	m.applyLease(f, src, now)
	m.trackOwned(f, src, owned, now)
	return true
}
