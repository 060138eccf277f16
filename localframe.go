package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/statetable"
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

// commitLocal is the only place a local-origin frame changes what this
// node asserts, from the broker, the ingress and a lease's expiry alike: it
// commits the frame to the state table, which every peer's sender reads
// from its mark (spec 5). It reports whether the table took the frame and
// the journal sequence of its record (0 for none).
func (m *Manager) commitLocal(f localFrame, src frameSource) (bool, uint64) {
	return m.commitLocalLine(f, src, tableLine(&f))
}

// commitLocalLine is commitLocal with the frame's line in the table
// already built: an ingress frame's is built before it enters the broker
// order, so the commit the group's leader runs for it does no O(size) work.
func (m *Manager) commitLocalLine(f localFrame, src frameSource, line []byte) (bool, uint64) {
	tf := statetable.Frame{Source: statetable.FromBroker, LeaseSeconds: f.leaseSeconds, Line: line}
	if src == fromIngress {
		tf.Source = statetable.FromProducer
	}
	if f.isRemoval() {
		tf.Removal = &f.removal
	} else {
		tf.Life = &f.life
	}
	o, seq := m.table.Commit(&tf)
	m.noteOutcome(o, &f)
	return o == statetable.Applied, seq
}

// tableLine is the line the table keeps of a frame: a run's re-assertion
// line, a removal's notification.
func tableLine(f *localFrame) []byte {
	if f.isRemoval() {
		return wireframe.EncodeNotification(f.method, f.params)
	}
	return statetable.ReassertionLine(f.method, f.params)
}

// noteOutcome logs what the table did not take, rate-limited where a
// client can repeat it.
func (m *Manager) noteOutcome(o statetable.Outcome, f *localFrame) {
	switch o {
	case statetable.Applied:
	case statetable.Full:
		m.untrackedLog.Note(m.log, "state table full (--max-live-workloads): a new broker workload is not relayed",
			"limit", m.cfg.MaxLiveWorkloads, "method", f.method, "id", httpguard.ClipLogged(f.workloadID()))
	case statetable.FullBytes:
		m.untrackedBytesLog.Note(m.log, "state table full (--max-live-workload-bytes): a broker workload is no longer relayed",
			"limitBytes", m.cfg.MaxLiveWorkloadBytes, "method", f.method, "id", httpguard.ClipLogged(f.workloadID()))
	default:
		if m.log.Enabled(context.Background(), slog.LevelDebug) {
			m.log.Debug("local frame changes nothing this node asserts", "outcome", o.String(), "method", f.method, "id", httpguard.ClipLogged(f.workloadID()))
		}
	}
}

// frameLine builds the broker line of a local frame.
func frameLine(f *localFrame) *bytes.Buffer {
	if f.isRemoval() {
		return brokerio.RemoveLine(&f.removal)
	}
	return brokerio.UpsertLine(f.life.Raw)
}
