package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/ingressmark"
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
	// none (lease.go); of an echo, the lease its mark was made under.
	leaseSeconds int
	// echo says a broker frame carries an ingress mark this node made
	// for its run: the broker's replay of a frame the ingress wrote up
	// (spec 3.5.3).
	echo bool
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

// tableLine is the line the table keeps of a frame: a run's re-assertion
// line, a removal's notification.
func tableLine(f *localFrame) []byte {
	if f.isRemoval() {
		return wireframe.EncodeNotification(f.method, f.params)
	}
	return statetable.ReassertionLine(f.method, f.params)
}

// ingressLine builds the broker line of an ingress frame, a producer's or
// a lease's expiry: a lifecycle frame's workload object ends with the
// ingress mark (spec 3.5.3). Without a key, or where the mark would take
// the line past the broker's line limit (or past markedLineMax) and the
// frame alone would not, the frame is written as it came: a crash before
// its journal record is durable then leaves its job to the broker's replay
// as the broker's.
func ingressLine(f *localFrame, mk *ingressmark.Marker, lineMax int) *bytes.Buffer {
	if f.isRemoval() || mk == nil {
		return frameLine(f)
	}
	line := brokerio.UpsertLineWith(f.life.Raw, mk.Member(f.life.Key(), f.leaseSeconds))
	if line.Len() <= min(lineMax, markedLineMax) {
		return line
	}
	brokerio.PutLine(line)
	return frameLine(f)
}

// markedLineMax bounds a marked line, its newline included: the broker
// replays the workload object as it stored it, mark and all, and this
// daemon reads a broker line of at most wireframe.MaxBytes. With the
// broker's line limit raised past it (--broker-line-max), a frame near
// the ingress's bound would otherwise come back in a replay this daemon
// cannot read. The slack covers a replay's method being longer than the
// frame's ("workload:submitted" for "workload:started") and its newline.
const markedLineMax = wireframe.MaxBytes - len("workload:submitted")

// withoutIngressMark returns the scan of a broker frame with its workload
// object's ingress marks cut out.
func withoutIngressMark(method string, s *wireframe.Scan) *wireframe.Scan {
	var u wireframe.Scan
	// Cutting members out of a valid object leaves a valid one: the
	// frame scans.
	_ = u.ScanFrame(wireframe.EncodeNotification(method, s.ParamsWithoutInfoMember(wireframe.IngressMarkName)))
	return &u
}

// frameLine builds the broker line of a local frame.
func frameLine(f *localFrame) *bytes.Buffer {
	if f.isRemoval() {
		return brokerio.RemoveLine(&f.removal)
	}
	return brokerio.UpsertLine(f.life.Raw)
}
