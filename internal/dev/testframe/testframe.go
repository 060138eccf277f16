// Package testframe builds the wire frames tests send: the broker's stdio
// lines, the ingress's bodies and the peers' frames and batches. They are
// one format (a JSON-RPC notification on one line), so one set of builders
// makes them all, and a change to a frame's shape is made here once.
//
// Two kinds of builder: Workload, Lifecycle, LifecycleLine and Removal
// marshal values, for the valid frames most tests send; WorkloadJSON and
// LifecycleJSON join raw JSON text, for the frames json.Marshal would not
// write (a repeated member, a raw invalid byte, a lone surrogate escape, a
// member of the wrong type).
//
// It imports only internal/wireframe and the standard library, and no
// non-test code imports it (its test holds both).
package testframe

import (
	"encoding/json"
	"maps"
	"strconv"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/wireframe"
)

// Workload returns a valid workload object: id, a model and an engine,
// state, originatedFrom, a runId of "run-"+id, seq 1 and a createdAt, with
// overrides applied in order; an override's nil value deletes the member.
func Workload(id, state, origin string, overrides ...map[string]any) map[string]any {
	return Override(map[string]any{
		"id": id, "model": "qwen3.5-9b", "engine": "llamacpp", "state": state,
		"originatedFrom": origin, "runId": "run-" + id, "seq": 1, "createdAt": 1789661457000,
	}, overrides...)
}

// Override returns a copy of w with overrides applied in order; an
// override's nil value deletes the member. w is left as it was.
func Override(w map[string]any, overrides ...map[string]any) map[string]any {
	out := maps.Clone(w)
	for _, o := range overrides {
		for k, v := range o {
			if v == nil {
				delete(out, k)
			} else {
				out[k] = v
			}
		}
	}
	return out
}

// MethodFor returns the lifecycle method that carries a state: errored for
// failed, and for a state that is missing or unknown.
func MethodFor(state string) string {
	switch state {
	case "queued":
		return wireframe.MethodSubmitted
	case "running":
		return wireframe.MethodStarted
	case "completed":
		return wireframe.MethodCompleted
	default:
		return wireframe.MethodErrored
	}
}

// Lifecycle is the lifecycle notification carrying w as its workloadInfo,
// with extra's members added to its params (a "resync": true, say); its
// method follows w's state (MethodFor). The same bytes are a broker's line,
// an ingress body and a peer's frame. It panics when w or extra cannot be
// marshalled, which is the calling test's mistake.
func Lifecycle(w map[string]any, extra map[string]any) []byte {
	params := map[string]any{"workloadInfo": w}
	for k, v := range extra {
		params[k] = v
	}
	p, err := json.Marshal(params)
	if err != nil {
		panic("testframe: " + err.Error())
	}
	state, _ := w["state"].(string)
	return wireframe.EncodeNotification(MethodFor(state), p)
}

// LifecycleLine is the lifecycle frame of Workload(id, state, origin), as
// text: a broker's line for a valid workload.
func LifecycleLine(id, state, origin string) string {
	return string(Lifecycle(Workload(id, state, origin), nil))
}

// Removal is the workloads:remove notification of (origin, id). An empty
// origin leaves originatedFrom out, as a producer posts a removal to the
// ingress, which stamps its own node.
func Removal(id, origin string) []byte {
	p := map[string]string{"workloadId": id}
	if origin != "" {
		p["originatedFrom"] = origin
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic("testframe: " + err.Error())
	}
	return wireframe.EncodeNotification(wireframe.MethodRemove, b)
}

// Batch is the body of a peer batch carrying frames, each on its own line.
func Batch(frames ...[]byte) []byte {
	var b []byte
	for _, f := range frames {
		b = append(append(b, f...), '\n')
	}
	return b
}

// WorkloadJSON renders a workload object as raw JSON text: id, a model, an
// engine, state and originatedFrom (only when origin is not empty), each
// left out when members names it, then members, each a raw `"name":value`
// written as it is. So a test can send what json.Marshal would not: a
// repeated name, a raw byte, a lone surrogate escape, a member of the wrong
// type. id and state are written without escaping.
func WorkloadJSON(id, state, origin string, members ...string) string {
	base := []string{`"id":"` + id + `"`, `"model":"qwen3.5-9b"`, `"engine":"llamacpp"`, `"state":"` + state + `"`}
	if origin != "" {
		base = append(base, `"originatedFrom":"`+origin+`"`)
	}
	var out []string
	for _, b := range base {
		name := b[:strings.Index(b, ":")+1]
		given := false
		for _, m := range members {
			given = given || strings.HasPrefix(m, name)
		}
		if !given {
			out = append(out, b)
		}
	}
	return "{" + strings.Join(append(out, members...), ",") + "}"
}

// LifecycleJSON is the notification of method whose params hold info, raw
// JSON text, as their workloadInfo, after params' own raw members (each
// `"name":value`, a `"resync":true` say). The method is given rather than
// taken from info's state, so a test can send a frame whose method and
// state disagree.
func LifecycleJSON(method, info string, params ...string) string {
	p := strings.Join(append(params[:len(params):len(params)], `"workloadInfo":`+info), ",")
	return `{"jsonrpc":"2.0","method":"` + method + `","params":{` + p + `}}`
}

// PaddedParams are the params of a notification of method whose line to
// the broker, its newline included, is exactly size bytes: {"pad":"ppp..."}.
// It fails t when no such line is that short.
func PaddedParams(t testing.TB, method string, size int) json.RawMessage {
	t.Helper()
	empty := len(wireframe.EncodeNotification(method, json.RawMessage(`{"pad":""}`))) + 1
	if size < empty {
		t.Fatalf("a %s line is at least %d bytes, more than %d", method, empty, size)
	}
	params := json.RawMessage(`{"pad":"` + strings.Repeat("p", size-empty) + `"}`)
	if got := len(wireframe.EncodeNotification(method, params)) + 1; got != size {
		t.Fatalf("padded line is %d bytes, want %d", got, size)
	}
	return params
}

// MaxLengthFrame is a completed workload whose every bounded field is at
// its bound (wireframe.MaxKeyFieldBytes) and distinct for i; an empty
// origin is one at its bound too.
func MaxLengthFrame(i int, origin string) string {
	v := func(tag string) string {
		s := tag + "-" + strconv.Itoa(i) + "-"
		return s + strings.Repeat("x", wireframe.MaxKeyFieldBytes-len(s))
	}
	field := func(name, value string) string { return `"` + name + `":"` + value + `"` }
	members := []string{field("id", v("id")), field("runId", v("run")), field("engine", v("engine")),
		field("model", v("model")), field("scheduledOn", v("sched")), field("requesterId", v("req")),
		field("state", "completed"), `"seq":` + strconv.Itoa(i+1)}
	if origin == "" {
		origin = v("origin")
	}
	return LifecycleJSON(wireframe.MethodStarted, WorkloadJSON("job-1", "running", origin, members...))
}
