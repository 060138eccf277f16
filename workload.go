package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// The lifecycle methods a workload's events travel as, on every channel.
const (
	methodSubmitted = "workload:submitted"
	methodStarted   = "workload:started"
	methodCompleted = "workload:completed"
	methodErrored   = "workload:errored"
	methodRemove    = "workloads:remove"
	methodUpsert    = "workloads:upsert"
)

// workloadStates maps each known state to whether it is terminal.
var workloadStates = map[string]bool{
	"queued":    false,
	"running":   false,
	"completed": true,
	"failed":    true,
	"cancelled": true,
}

func isLifecycleMethod(m string) bool {
	switch m {
	case methodSubmitted, methodStarted, methodCompleted, methodErrored:
		return true
	}
	return false
}

// isTerminalState reports whether a workload in state s has ended. On the
// stdio and peer paths any non-empty state passes validation; an unknown one
// is treated as live.
func isTerminalState(s string) bool { return workloadStates[s] }

// workloadInfo holds the fields of a workload object that the daemon reads.
// It is never re-encoded: the object travels as the raw JSON it arrived as.
type workloadInfo struct {
	ID             string `json:"id"`
	Model          string `json:"model"`
	Engine         string `json:"engine"`
	State          string `json:"state"`
	OriginatedFrom string `json:"originatedFrom"`
	ScheduledOn    string `json:"scheduledOn"`
	RunID          string `json:"runId"`

	// seqNum is the producer's event counter when hasSeq; the typed check
	// reads it (checkWorkloadTypes), not encoding/json.
	seqNum int64
	hasSeq bool
}

// workloadKey identifies one run of a workload in the re-sync set.
type workloadKey struct{ origin, engine, runID, id string }

// workloadRef identifies a workload across runs: what a removal names.
type workloadRef struct{ origin, id string }

// lifecycleEvent is a validated lifecycle frame.
type lifecycleEvent struct {
	method string
	info   workloadInfo
	raw    json.RawMessage // the workload object exactly as it arrived
	params json.RawMessage // the frame's params exactly as they arrived
	resync bool            // params carried "resync": true
}

func (e *lifecycleEvent) key() workloadKey {
	return workloadKey{e.info.OriginatedFrom, e.info.Engine, e.info.RunID, e.info.ID}
}

func (e *lifecycleEvent) ref() workloadRef { return workloadRef{e.info.OriginatedFrom, e.info.ID} }

func (e *lifecycleEvent) terminal() bool { return isTerminalState(e.info.State) }

// dedupKey is the key peers deduplicate a lifecycle event on.
func (e *lifecycleEvent) dedupKey() dedupDigest {
	i := &e.info
	seq := ""
	if i.hasSeq {
		seq = strconv.FormatInt(i.seqNum, 10)
	}
	return digestKey("L", i.OriginatedFrom, i.Engine, i.RunID, i.ID, i.State, i.ScheduledOn, seq)
}

// removalEvent is a validated workloads:remove frame.
type removalEvent struct {
	ref workloadRef
	// idToken and originToken are the JSON string tokens of workloadId and
	// originatedFrom exactly as they arrived. The removal the broker gets
	// is built from them, not from ref re-encoded, so it names the
	// workload in the very bytes the upsert named it in (an escape such as
	// \u00e9 or \/ stays an escape).
	idToken, originToken json.RawMessage
	params               json.RawMessage
}

func (r *removalEvent) dedupKey() dedupDigest { return digestKey("R", r.ref.origin, r.ref.id) }

// brokerParams renders the removal's params for the broker from the tokens
// as they arrived, in the order json.Marshal of a map wrote them before,
// so a removal that needs no escaping reaches the broker byte for byte as
// it always did.
func (r *removalEvent) brokerParams() json.RawMessage {
	b := make([]byte, 0, len(r.idToken)+len(r.originToken)+32)
	b = append(b, `{"originatedFrom":`...)
	b = append(b, r.originToken...)
	b = append(b, `,"workloadId":`...)
	b = append(b, r.idToken...)
	return append(b, '}')
}

// digestKey is the SHA-256 of the parts, each preceded by its length as
// eight big-endian bytes, so that no two tuples share an encoding and no
// two share a digest short of a SHA-256 collision. The dedup stores the
// digest, 32 bytes whatever the parts hold.
func digestKey(parts ...string) dedupDigest {
	n := 0
	for _, p := range parts {
		n += 8 + len(p)
	}
	var stack [1024]byte // the bounded fields of a key fit: no allocation
	b := stack[:0]
	if n > len(stack) {
		b = make([]byte, 0, n)
	}
	for _, p := range parts {
		b = binary.BigEndian.AppendUint64(b, uint64(len(p)))
		b = append(b, p...)
	}
	return sha256.Sum256(b)
}

var errNotObject = errors.New("must be a JSON object")

// lifecycleParams is the params object of a lifecycle frame.
type lifecycleParams struct {
	WorkloadInfo json.RawMessage `json:"workloadInfo"`
	Resync       bool            `json:"resync"`
}

// parseLifecycle validates a lifecycle frame's params: a workload object
// whose known members have the types the broker decodes (workloadtypes.go),
// with every required field present and non-empty. The stdio path, the
// ingress and the peer port all go through it. It has no side effects.
func parseLifecycle(method string, params json.RawMessage) (lifecycleEvent, error) {
	if !isLifecycleMethod(method) {
		return lifecycleEvent{}, fmt.Errorf("unknown method %q", method)
	}
	if !isJSONObject(params) {
		return lifecycleEvent{}, fmt.Errorf("params: %w", errNotObject)
	}
	var p lifecycleParams
	if err := json.Unmarshal(params, &p); err != nil {
		return lifecycleEvent{}, fmt.Errorf("params: %w", err)
	}
	if p.WorkloadInfo == nil {
		return lifecycleEvent{}, errors.New("params.workloadInfo is missing")
	}
	if !isJSONObject(p.WorkloadInfo) {
		return lifecycleEvent{}, fmt.Errorf("params.workloadInfo: %w", errNotObject)
	}
	// The object is valid JSON: encoding/json has just decoded params.
	seq, hasSeq, err := checkWorkloadTypes(p.WorkloadInfo)
	if err != nil {
		return lifecycleEvent{}, err
	}
	ev := lifecycleEvent{method: method, raw: p.WorkloadInfo, params: params, resync: p.Resync}
	if err := json.Unmarshal(p.WorkloadInfo, &ev.info); err != nil {
		return lifecycleEvent{}, fmt.Errorf("workloadInfo: %w", err)
	}
	ev.info.seqNum, ev.info.hasSeq = seq, hasSeq
	if err := ev.info.validate(); err != nil {
		return lifecycleEvent{}, err
	}
	return ev, nil
}

func (i *workloadInfo) validate() error {
	for _, f := range []struct{ name, v string }{
		{"id", i.ID}, {"model", i.Model}, {"engine", i.Engine},
		{"state", i.State}, {"originatedFrom", i.OriginatedFrom},
	} {
		if f.v == "" {
			return fmt.Errorf("workloadInfo.%s is missing or empty", f.name)
		}
	}
	return nil
}

// parseRemove validates a workloads:remove frame's params: the typed checks
// of workloadtypes.go, then a non-empty workloadId and originatedFrom. The
// ref is decoded from the very tokens the removal keeps, the last member
// that folds to each field, as encoding/json would decode it. It has no
// side effects.
func parseRemove(params json.RawMessage) (removalEvent, error) {
	if !isJSONObject(params) {
		return removalEvent{}, fmt.Errorf("params: %w", errNotObject)
	}
	tok, err := checkRemovalTypes(params)
	if err != nil {
		return removalEvent{}, err
	}
	// The tokens are well-formed strings (checkRemovalTypes): decoding them
	// cannot fail, and substitutes nothing.
	var id, origin string
	if tok.workloadID != nil {
		_ = json.Unmarshal(tok.workloadID, &id)
	}
	if tok.originatedFrom != nil {
		_ = json.Unmarshal(tok.originatedFrom, &origin)
	}
	if id == "" {
		return removalEvent{}, errors.New("params.workloadId is missing or empty")
	}
	if origin == "" {
		return removalEvent{}, errors.New("params.originatedFrom is missing or empty")
	}
	return removalEvent{ref: workloadRef{origin, id}, idToken: tok.workloadID, originToken: tok.originatedFrom, params: params}, nil
}

func isJSONObject(b json.RawMessage) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{'
}
