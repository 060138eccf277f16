package wireframe

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The package's own test helpers: small copies of the root package's
// (benchNodeID, benchSeedFrame and benchSeedParams of its benchmarks,
// benchPeerFrame, peerserver.ParseFrame, and its test helpers workload, methodFor
// and workloadJSON), so the frame format's tests need nothing of the daemon.

// benchNodeID is the node id of the benchmarked daemon.
const benchNodeID = "6f1c2a4e-8b7d-4c3e-9a5f-0d1e2f3a4b5c"

// fuzzNodeID is the node id the fuzz targets stamp.
const fuzzNodeID = "11111111-2222-4333-8444-555555555555"

// benchSeedFrame is the seed document's curl example, byte for byte.
const benchSeedFrame = `{
  "jsonrpc": "2.0", "method": "workload:started",
  "params": {"workloadInfo": {"id": "job-42", "runId": "job-42", "seq": 1, "model": "qwen3.5-9b", "engine": "llamacpp",
             "state": "running", "createdAt": 1789661457000, "startedAt": 1789661457000,
             "completedAt": null, "error": null, "requesterId": "my-scheduler"}}}`

// benchSeedParams are the seed frame's params as the broker would send them,
// with the origin stamped.
const benchSeedParams = `{"workloadInfo":{"id":"job-42","runId":"job-42","seq":1,"model":"qwen3.5-9b","engine":"llamacpp",` +
	`"state":"running","createdAt":1789661457000,"startedAt":1789661457000,"completedAt":null,"error":null,` +
	`"requesterId":"my-scheduler","originatedFrom":"` + benchNodeID + `"}}`

// benchPeerFrame appends a peer's single frame: workload n of origin, as a
// stock daemon relays it (compact, origin stamped).
func benchPeerFrame(buf []byte, origin string, n int64) []byte {
	buf = append(buf, `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"peer-job-`...)
	buf = strconv.AppendInt(buf, n, 10)
	buf = append(buf, `","runId":"peer-job-`...)
	buf = strconv.AppendInt(buf, n, 10)
	buf = append(buf, `","seq":2,"model":"qwen3.5-9b","engine":"llamacpp","state":"running","createdAt":1789661457000,`+
		`"startedAt":1789661457000,"completedAt":null,"error":null,"requesterId":"my-scheduler","originatedFrom":"`...)
	buf = append(buf, origin...)
	return append(buf, `"}}}`...)
}

// peerEvent is what the peer port reads of a frame.
type peerEvent struct {
	isRemoval bool
	life      Lifecycle
	removal   Removal
}

// parsePeerFrame reads a frame as the peer port does (peerserver's
// ParseFrame), the same steps in the same order, with no slack on the
// workload bound: the fuzz targets pass a bound no frame reaches.
func parsePeerFrame(body []byte, maxWorkload int) (peerEvent, error) {
	if err := CheckUTF8(body); err != nil {
		return peerEvent{}, err
	}
	var s Scan
	if err := s.ScanFrame(body); err != nil {
		return peerEvent{}, fmt.Errorf("not a JSON-RPC frame: %w", err)
	}
	env, err := EnvelopeOf(&s)
	if err != nil {
		return peerEvent{}, fmt.Errorf("not a JSON-RPC frame: %w", err)
	}
	if env.JSONRPC != "2.0" {
		return peerEvent{}, errors.New(`jsonrpc must be "2.0"`)
	}
	if err := CheckWorkloadBytes(&s, maxWorkload, 0); err != nil {
		return peerEvent{}, err
	}
	switch {
	case IsLifecycleMethod(env.Method):
		ev, err := s.Lifecycle(env.Method)
		return peerEvent{life: ev}, err
	case env.Method == MethodRemove:
		r, err := s.Removal()
		return peerEvent{isRemoval: true, removal: r}, err
	default:
		return peerEvent{}, fmt.Errorf("unknown method %q", env.Method)
	}
}

// workload returns a valid workload object with overrides applied; a nil
// override value deletes the field.
func workload(id, state, origin string, overrides ...map[string]any) map[string]any {
	w := map[string]any{
		"id": id, "model": "qwen3.5-9b", "engine": "llamacpp", "state": state,
		"originatedFrom": origin, "runId": "run-" + id, "seq": 1, "createdAt": 1789661457000,
	}
	for _, o := range overrides {
		for k, v := range o {
			if v == nil {
				delete(w, k)
			} else {
				w[k] = v
			}
		}
	}
	return w
}

// methodFor returns the lifecycle method that carries a state.
func methodFor(state string) string {
	switch state {
	case "queued":
		return MethodSubmitted
	case "running":
		return MethodStarted
	case "completed":
		return MethodCompleted
	default:
		return MethodErrored
	}
}

// workloadJSON renders a workload object as JSON text: id "job-1", a model,
// an engine, state running and originatedFrom (only when origin is not
// empty), each left out when members names it, then members, each a raw
// `"name":value`, so a test can send what json.Marshal would not: a repeated
// name, a raw byte, a lone surrogate escape.
func workloadJSON(origin string, members ...string) string {
	base := []string{`"id":"job-1"`, `"model":"qwen3.5-9b"`, `"engine":"llamacpp"`, `"state":"running"`}
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

// ifxForeign is a node id that is not the test node's.
const ifxForeign = "5f0c1c1e-2b7d-4a1e-8f00-00000000f0e1"
