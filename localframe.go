package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"nvpair-workload-manager/internal/brokerio"
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

// tableLine is the line the table keeps of a frame: a run's re-assertion
// line, a removal's notification.
func tableLine(f *localFrame) []byte {
	if f.isRemoval() {
		return wireframe.EncodeNotification(f.method, f.params)
	}
	return statetable.ReassertionLine(f.method, f.params)
}

// frameLine builds the broker line of a local frame.
func frameLine(f *localFrame) *bytes.Buffer {
	if f.isRemoval() {
		return brokerio.RemoveLine(&f.removal)
	}
	return brokerio.UpsertLine(f.life.Raw)
}
