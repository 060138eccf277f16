package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// maxIngressErrorBytes bounds a producer's error text (workloadInfo.error,
// its decoded value). A producer reports a failure, not a log: 4 KiB holds
// any message worth a Jobs list. The broker's own frames and the peers'
// are not held to it (the broker may carry a long error text), and error
// is in no dedup or re-sync key, so nothing longer is ever cut: a frame
// either travels whole or is refused.
const maxIngressErrorBytes = 4 << 10

// The names the ingress knows at each level it checks. encoding/json matches
// names case-insensitively, so a name that folds to one of these but is
// spelt otherwise would be decoded as the field while slipping past any
// check on the exact key; the ingress refuses it instead.
var (
	envelopeFields = foldSet("jsonrpc", "id", "method", "params")
	paramsFields   = foldSet("workloadInfo", "workloadId", "originatedFrom")
	workloadFields = foldSet("id", "model", "engine", "state", "originatedFrom", "scheduledOn",
		"runId", "seq", "createdAt", "startedAt", "completedAt", "error", "requesterId")
	// resyncFolded is the peers' re-assertion marker, which bypasses their
	// dedup: a producer may not send it in any spelling, at any level.
	resyncFolded = foldKey("resync")
)

// foldSet maps the folded form of each name to its canonical spelling.
func foldSet(names ...string) map[string]string {
	m := make(map[string]string, len(names))
	for _, n := range names {
		m[foldKey(n)] = n
	}
	return m
}

// foldKey folds a name the way encoding/json matches names to fields:
// Unicode simple case folding, each rune mapped to the smallest rune of its
// fold orbit (so "ſ" U+017F folds with "s" and "K" U+212A with "k"). Two
// names fold together exactly when encoding/json could confuse them.
func foldKey(name string) string {
	return string(appendFold(make([]byte, 0, len(name)), name))
}

// appendFold appends foldKey(name) to dst.
func appendFold[T ~string | ~[]byte](dst []byte, name T) []byte {
	for i := 0; i < len(name); {
		c := name[i]
		if c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(string(name[i:]))
		dst = utf8.AppendRune(dst, smallestFold(r))
		i += n
	}
	return dst
}

func smallestFold(r rune) rune {
	for {
		next := unicode.SimpleFold(r)
		if next <= r {
			return next
		}
		r = next
	}
}

// checkSpelling refuses a name that folds to a known field but is spelt
// otherwise, two names that fold together (an exact repeat included), and
// any spelling of resync.
func checkSpelling(level string, ms []jsonMember, known map[string]string) error {
	if len(ms) > maxInlineMembers {
		return checkSpellingMap(level, ms, known)
	}
	// The folded names go into one buffer and are compared pairwise: for
	// the few members a frame has this allocates nothing, where a map of
	// folded names allocates each name and the map.
	var arena [512]byte
	var spans [maxInlineMembers][2]int
	folded := arena[:0]
	for i, m := range ms {
		start := len(folded)
		folded = appendFold(folded, m.name)
		f := folded[start:]
		spans[i] = [2]int{start, len(folded)}
		if string(f) == resyncFolded {
			return fmt.Errorf("%s: %q is reserved for peers' re-assertions", level, m.name)
		}
		for j := range i {
			if bytes.Equal(folded[spans[j][0]:spans[j][1]], f) {
				return fmt.Errorf("%s: names %q and %q collide", level, ms[j].name, m.name)
			}
		}
		if canon, ok := known[string(f)]; ok && canon != m.name {
			return fmt.Errorf("%s: %q must be spelt %q", level, m.name, canon)
		}
	}
	return nil
}

// maxInlineMembers is the most members checkSpelling compares pairwise;
// a larger object goes through a map.
const maxInlineMembers = 32

func checkSpellingMap(level string, ms []jsonMember, known map[string]string) error {
	seen := make(map[string]string, len(ms))
	for _, m := range ms {
		f := foldKey(m.name)
		if f == resyncFolded {
			return fmt.Errorf("%s: %q is reserved for peers' re-assertions", level, m.name)
		}
		if prev, dup := seen[f]; dup {
			return fmt.Errorf("%s: names %q and %q collide", level, prev, m.name)
		}
		seen[f] = m.name
		if canon, ok := known[f]; ok && canon != m.name {
			return fmt.Errorf("%s: %q must be spelt %q", level, m.name, canon)
		}
	}
	return nil
}

// checkedMembers parses an object and checks its names' spelling. valid
// says raw is already known to be valid JSON (a member value of a checked
// object), so it need not be validated again.
func checkedMembers(level string, raw []byte, known map[string]string, valid bool) ([]jsonMember, error) {
	parse := objectMembers
	if valid {
		parse = validObjectMembers
	}
	ms, err := parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", level, err)
	}
	return ms, checkSpelling(level, ms, known)
}

// stampOrigin gives an object without an originatedFrom (or with an empty
// or null one) this node's id, and refuses one that names another node.
func stampOrigin(ms []jsonMember, nodeID string) (json.RawMessage, error) {
	if v, ok := member(ms, "originatedFrom"); ok && string(bytes.TrimSpace(v)) != "null" {
		var origin string
		if err := json.Unmarshal(v, &origin); err != nil {
			return nil, errors.New("originatedFrom must be a string")
		}
		if origin != "" && origin != nodeID {
			return nil, fmt.Errorf("originatedFrom %q is not this node: a producer reports only workloads that run here", origin)
		}
	}
	stamped, _ := json.Marshal(nodeID)
	return encodeMembers(withMember(ms, "originatedFrom", stamped)), nil
}

// parseIngressFrame validates a producer's request body and returns it as a
// local-origin frame with its origin stamped. On top of the local-frame
// validation every path shares (the typed checks included), it enforces the
// ingress's own rules: a body that is UTF-8 throughout, exact field
// spelling, no resync marker, this node's origin only, a known state and a
// bounded error text. It has no side effects.
func parseIngressFrame(body []byte, nodeID string) (localFrame, error) {
	if err := checkFrameUTF8(body); err != nil {
		return localFrame{}, err
	}
	env, err := checkedMembers("envelope", body, envelopeFields, false)
	if err != nil {
		return localFrame{}, err
	}
	var jsonrpc, method string
	if v, ok := member(env, "jsonrpc"); !ok || json.Unmarshal(v, &jsonrpc) != nil || jsonrpc != "2.0" {
		return localFrame{}, errors.New(`jsonrpc must be "2.0"`)
	}
	if v, ok := member(env, "method"); !ok || json.Unmarshal(v, &method) != nil {
		return localFrame{}, errors.New("method is missing or not a string")
	}
	if !isLifecycleMethod(method) && method != methodRemove {
		return localFrame{}, fmt.Errorf("method %q: must be a workload lifecycle method or workloads:remove", method)
	}
	params, ok := member(env, "params")
	if !ok {
		return localFrame{}, errors.New("params is missing")
	}
	if params, err = stampParams(method, params, nodeID); err != nil {
		return localFrame{}, err
	}
	f, err := parseLocalFrame(method, params)
	if err != nil {
		return localFrame{}, err
	}
	return f, checkIngressValues(&f, nodeID)
}

// stampParams checks the spelling of params (and of workloadInfo) and stamps
// the origin where the frame carries it.
func stampParams(method string, params json.RawMessage, nodeID string) (json.RawMessage, error) {
	pm, err := checkedMembers("params", params, paramsFields, true)
	if err != nil {
		return nil, err
	}
	if method == methodRemove {
		return stampOrigin(pm, nodeID)
	}
	info, ok := member(pm, "workloadInfo")
	if !ok || !isJSONObject(info) {
		return params, nil // parseLifecycle names the problem
	}
	wm, err := checkedMembers("workloadInfo", info, workloadFields, true)
	if err != nil {
		return nil, err
	}
	// The spelling is checked: error is the one member that can be it.
	if v, ok := member(wm, "error"); ok {
		if err := checkStringBound("workloadInfo", "error", maxIngressErrorBytes, v); err != nil {
			return nil, err
		}
	}
	stamped, err := stampOrigin(wm, nodeID)
	if err != nil {
		return nil, err
	}
	return encodeMembers(withMember(pm, "workloadInfo", stamped)), nil
}

// checkIngressValues validates the decoded frame again, so the ingress rules
// hold even for a spelling the name check missed: the origin is this node,
// the state is one of the five and no resync marker was decoded. The id's
// bound is not the ingress's own: every path holds it (maxKeyFieldBytes),
// in every spelling, in the parse step before this.
func checkIngressValues(f *localFrame, nodeID string) error {
	origin := f.removal.ref.origin
	if !f.isRemoval() {
		origin = f.life.info.OriginatedFrom
		if _, known := workloadStates[f.life.info.State]; !known {
			return fmt.Errorf("state %q: must be queued, running, completed, failed or cancelled", f.life.info.State)
		}
		if f.life.resync {
			return errors.New("resync is reserved for peers' re-assertions")
		}
	}
	if origin != nodeID {
		return fmt.Errorf("originatedFrom %q is not this node", origin)
	}
	return nil
}
