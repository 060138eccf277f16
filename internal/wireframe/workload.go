package wireframe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// The lifecycle methods a workload's events travel as, on every channel.
const (
	MethodSubmitted = "workload:submitted"
	MethodStarted   = "workload:started"
	MethodCompleted = "workload:completed"
	MethodErrored   = "workload:errored"
	MethodRemove    = "workloads:remove"
	MethodUpsert    = "workloads:upsert"
)

// workloadStates maps each known state to whether it is terminal.
var workloadStates = map[string]bool{
	"queued":    false,
	"running":   false,
	"completed": true,
	"failed":    true,
	"cancelled": true,
}

// IsLifecycleMethod reports whether m is one of the four lifecycle methods.
func IsLifecycleMethod(m string) bool {
	switch m {
	case MethodSubmitted, MethodStarted, MethodCompleted, MethodErrored:
		return true
	}
	return false
}

// IsTerminalState reports whether a workload in state s has ended. On the
// stdio and peer paths any non-empty state passes validation; an unknown one
// is treated as live.
func IsTerminalState(s string) bool { return workloadStates[s] }

// WorkloadInfo holds the fields of a workload object that the daemon reads.
// It is never re-encoded: the object travels as the raw JSON it arrived as.
type WorkloadInfo struct {
	ID             string `json:"id"`
	Model          string `json:"model"`
	Engine         string `json:"engine"`
	State          string `json:"state"`
	OriginatedFrom string `json:"originatedFrom"`
	ScheduledOn    string `json:"scheduledOn"`
	RunID          string `json:"runId"`

	// Seq is the producer's event counter when HasSeq; the typed check
	// reads it (checkTypedMembers), not encoding/json.
	Seq    int64
	HasSeq bool
	// requester is the requesterId when hasRequester (null and absent are
	// not a requester): the read-back's filter compares it
	// (internal/statetable's Table.ReadSlice) rather than parse every
	// entry's line on every answer.
	Requester    string
	HasRequester bool
}

// WorkloadKey identifies one run of a workload in the re-sync set.
type WorkloadKey struct{ Origin, Engine, RunID, ID string }

// WorkloadRef identifies a workload across runs: what a removal names.
type WorkloadRef struct{ Origin, ID string }

// Ref is the workload a run belongs to.
func (k WorkloadKey) Ref() WorkloadRef { return WorkloadRef{k.Origin, k.ID} }

// Lifecycle is a validated lifecycle frame.
type Lifecycle struct {
	Method string
	Info   WorkloadInfo
	Raw    json.RawMessage // the workload object exactly as it arrived
	Params json.RawMessage // the frame's params exactly as they arrived
	Resync bool            // params carried "resync": true
}

// Key is the run the event is about: its re-sync set key.
func (e *Lifecycle) Key() WorkloadKey {
	return WorkloadKey{e.Info.OriginatedFrom, e.Info.Engine, e.Info.RunID, e.Info.ID}
}

// Ref is the workload the event is about, across runs.
func (e *Lifecycle) Ref() WorkloadRef { return WorkloadRef{e.Info.OriginatedFrom, e.Info.ID} }

// Terminal reports whether the event ends its workload.
func (e *Lifecycle) Terminal() bool { return IsTerminalState(e.Info.State) }

// Removal is a validated workloads:remove frame.
type Removal struct {
	Ref WorkloadRef
	// idToken and originToken are the JSON string tokens of workloadId and
	// originatedFrom exactly as they arrived. The removal the broker gets
	// is built from them, not from ref re-encoded, so it names the
	// workload in the very bytes the upsert named it in (an escape such as
	// \u00e9 or \/ stays an escape).
	idToken, originToken json.RawMessage
	Params               json.RawMessage
}

// BrokerParams renders the removal's params for the broker from the tokens
// as they arrived, in the order json.Marshal of a map wrote them before,
// so a removal that needs no escaping reaches the broker byte for byte as
// it always did. A removal that names no origin (absent, null or "", an
// older sender's) goes up as {"workloadId":...} alone, as it came and as a
// stock peer writes it: an empty originatedFrom would tell the broker of
// a node "" that no workload comes from.
func (r *Removal) BrokerParams() json.RawMessage {
	b := make([]byte, 0, len(r.idToken)+len(r.originToken)+32)
	if r.Ref.Origin == "" {
		b = append(b, `{"workloadId":`...)
		b = append(b, r.idToken...)
		return append(b, '}')
	}
	b = append(b, `{"originatedFrom":`...)
	b = append(b, r.originToken...)
	b = append(b, `,"workloadId":`...)
	b = append(b, r.idToken...)
	return append(b, '}')
}

var errNotObject = errors.New("must be a JSON object")

// ParseLifecycle validates a lifecycle frame's params: a workload object
// whose known members have the types the broker decodes (workloadtypes.go),
// with every required field present and non-empty. The stdio path, the
// ingress and the peer port all go through it, or through lifecycleFromScan
// when they have scanned the whole frame. It has no side effects.
func ParseLifecycle(method string, params json.RawMessage) (Lifecycle, error) {
	if !IsLifecycleMethod(method) {
		return Lifecycle{}, fmt.Errorf("unknown method %q", method)
	}
	if !isJSONObject(params) {
		return Lifecycle{}, fmt.Errorf("params: %w", errNotObject)
	}
	var s Scan
	if err := s.scanParams(params); err != nil {
		return Lifecycle{}, fmt.Errorf("params: %w", err)
	}
	return lifecycleFromScan(method, &s, "")
}

// lifecycleFromScan reads a lifecycle frame from its scanned params, in
// the one pass's members: the params' workloadInfo and resync, then the
// workload's typed members, decoded as encoding/json would decode them.
// stampedOrigin, when not "", is the origin the ingress stamped: the
// object's own originatedFrom member was checked by the stamp, and the
// event's raw object and params are the caller's to set.
func lifecycleFromScan(method string, s *Scan, stampedOrigin string) (Lifecycle, error) {
	pl := &s.levels[levelParams]
	if !pl.present {
		return Lifecycle{}, fmt.Errorf("params: %w", errNotObject)
	}
	info, resync, err := lifecycleParamsOf(pl)
	if err != nil {
		return Lifecycle{}, err
	}
	if info == nil {
		return Lifecycle{}, errors.New("params.workloadInfo is missing")
	}
	il := &s.levels[levelInfo]
	if !il.present {
		return Lifecycle{}, fmt.Errorf("params.workloadInfo: %w", errNotObject)
	}
	skip := ""
	if stampedOrigin != "" {
		skip = "originatedFrom"
	}
	vals, err := checkTypedMembers("workloadInfo", il, workloadTypedFields, skip)
	if err != nil {
		return Lifecycle{}, err
	}
	ev := Lifecycle{Method: method, Raw: il.raw, Params: pl.raw, Resync: resync}
	ev.Info = decodeWorkloadInfo(&vals, stampedOrigin)
	if err := ev.Info.validate(); err != nil {
		return Lifecycle{}, err
	}
	return ev, nil
}

// lifecycleParamsOf returns the params' workloadInfo member and resync,
// each the last member whose name folds to it, as encoding/json decodes
// them (a null resync leaves it as it was). A resync that is not a boolean
// is refused, as encoding/json refuses it.
func lifecycleParamsOf(pl *scanLevel) (info *scanMember, resync bool, err error) {
	var buf [64]byte
	for i := range pl.n {
		m := pl.member(i)
		switch string(m.foldedName(buf[:0])) {
		case foldedNames["workloadInfo"]:
			info = m
		case resyncFolded:
			switch string(m.value) {
			case "true":
				resync = true
			case "false":
				resync = false
			case "null":
			default:
				return nil, false, errors.New("params.resync must be true, false or null")
			}
		}
	}
	return info, resync, nil
}

// decodeWorkloadInfo decodes the string fields the daemon reads into one
// allocation, each field a part of it, and the seq. The members are
// well-formed (checkTypedMembers), so decoding substitutes nothing.
func decodeWorkloadInfo(vals *typedValues, stampedOrigin string) WorkloadInfo {
	fields := [...]int{wfID, wfModel, wfEngine, wfState, wfOrigin, wfScheduledOn, wfRunID, wfRequesterID}
	var stack [512]byte
	buf := stack[:0]
	var ends [len(fields)]int
	for i, f := range fields {
		if m := vals[f]; m != nil && m.isString() {
			buf = appendUnquoted(buf, m.value)
		}
		ends[i] = len(buf)
	}
	all := string(buf)
	part := func(i int) string {
		start := 0
		if i > 0 {
			start = ends[i-1]
		}
		return all[start:ends[i]]
	}
	w := WorkloadInfo{ID: part(0), Model: part(1), Engine: part(2), State: part(3),
		OriginatedFrom: part(4), ScheduledOn: part(5), RunID: part(6),
		Requester: part(7), HasRequester: vals[wfRequesterID] != nil}
	if stampedOrigin != "" {
		w.OriginatedFrom = stampedOrigin
	}
	if m := vals[wfSeq]; m != nil {
		w.Seq, w.HasSeq = parseJSONInteger(m.value)
	}
	return w
}

func (i *WorkloadInfo) validate() error {
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

// ParseRemove validates a workloads:remove frame's params: the typed checks
// of workloadtypes.go, then a non-empty workloadId. originatedFrom may be
// absent, null or empty, as the stock peers take it from older senders: the
// removal is then of ("", workloadId). It has no side effects.
func ParseRemove(params json.RawMessage) (Removal, error) {
	if !isJSONObject(params) {
		return Removal{}, fmt.Errorf("params: %w", errNotObject)
	}
	var s Scan
	if err := s.scanParams(params); err != nil {
		return Removal{}, fmt.Errorf("params: %w", err)
	}
	return removalFromScan(&s, nil)
}

// removalFromScan reads a removal from its scanned params. The ref is
// decoded from the very tokens the removal keeps, the last member that
// folds to each field, as encoding/json would decode it. stampedOrigin,
// when not nil, is the origin token the ingress stamped: the params' own
// originatedFrom was checked by the stamp, and the event's params are the
// caller's to set.
func removalFromScan(s *Scan, stampedOrigin json.RawMessage) (Removal, error) {
	pl := &s.levels[levelParams]
	if !pl.present {
		return Removal{}, fmt.Errorf("params: %w", errNotObject)
	}
	skip := ""
	if stampedOrigin != nil {
		skip = "originatedFrom"
	}
	vals, err := checkTypedMembers("params", pl, removalTypedFields, skip)
	if err != nil {
		return Removal{}, err
	}
	r := Removal{Params: pl.raw, originToken: stampedOrigin}
	if m := vals[rfWorkloadID]; m != nil {
		r.idToken = m.value
	}
	if m := vals[rfOrigin]; m != nil && stampedOrigin == nil {
		r.originToken = m.value
	}
	// The tokens are well-formed strings (checkTypedMembers): decoding them
	// substitutes nothing.
	if r.idToken != nil {
		r.Ref.ID = string(appendUnquoted(nil, r.idToken))
	}
	if r.originToken != nil {
		r.Ref.Origin = string(appendUnquoted(nil, r.originToken))
	}
	if r.Ref.ID == "" {
		return Removal{}, errors.New("params.workloadId is missing or empty")
	}
	// An empty origin is an older sender's removal, taken as the stock
	// peers take it; the ingress, which stamps its own, holds its frames to
	// this node's id (checkIngressValues).
	return r, nil
}

func isJSONObject(b json.RawMessage) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{'
}
