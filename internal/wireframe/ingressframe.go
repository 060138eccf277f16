package wireframe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxIngressErrorBytes bounds a producer's error text (workloadInfo.error,
// its decoded value). A producer reports a failure, not a log: 4 KiB holds
// any message worth a Jobs list. The broker's own frames and the peers'
// are not held to it (the broker may carry a long error text), and error
// is in no dedup or re-sync key, so nothing longer is ever cut: a frame
// either travels whole or is refused.
const MaxIngressErrorBytes = 4 << 10

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

// nameAt returns the i-th member's name as encoding/json decodes it.
func (l *scanLevel) nameAt(i int) string { return l.member(i).nameString() }

// nameIs reports whether the i-th member's name is name.
func (l *scanLevel) nameIs(i int, name string) bool {
	m := l.member(i)
	if m.nameS.escaped {
		return m.nameString() == name
	}
	return string(m.name[1:len(m.name)-1]) == name
}

// exact returns the member named exactly name (after checkSpelling there is
// at most one), or nil.
func (l *scanLevel) exact(name string) *scanMember {
	for i := range l.n {
		if l.nameIs(i, name) {
			return l.member(i)
		}
	}
	return nil
}

// IsWorkloadField reports whether a workload member's name folds to a field
// the daemon knows.
func IsWorkloadField(name string) bool {
	_, known := workloadFields[foldKey(name)]
	return known
}

// checkSpelling refuses a name that folds to a known field but is spelt
// otherwise, two names that fold together (an exact repeat included), and
// any spelling of resync.
func checkSpelling(level string, ms *scanLevel, known map[string]string) error {
	n := ms.n
	if n > maxInlineMembers {
		return checkSpellingMap(level, ms, known)
	}
	// The folded names go into one buffer and are compared pairwise: for
	// the few members a frame has this allocates nothing, where a map of
	// folded names allocates each name and the map.
	var arena [512]byte
	var spans [maxInlineMembers][2]int
	folded := arena[:0]
	for i := range n {
		start := len(folded)
		folded = ms.member(i).foldedName(folded)
		f := folded[start:]
		spans[i] = [2]int{start, len(folded)}
		if string(f) == resyncFolded {
			return fmt.Errorf("%s: %q is reserved for peers' re-assertions", level, ms.nameAt(i))
		}
		for j := range i {
			if bytes.Equal(folded[spans[j][0]:spans[j][1]], f) {
				return fmt.Errorf("%s: names %q and %q collide", level, ms.nameAt(j), ms.nameAt(i))
			}
		}
		if canon, ok := known[string(f)]; ok && !ms.nameIs(i, canon) {
			return fmt.Errorf("%s: %q must be spelt %q", level, ms.nameAt(i), canon)
		}
	}
	return nil
}

// maxInlineMembers is the most members checkSpelling compares pairwise;
// a larger object goes through a map.
const maxInlineMembers = 32

func checkSpellingMap(level string, ms *scanLevel, known map[string]string) error {
	n := ms.n
	seen := make(map[string]int, n)
	for i := range n {
		f := string(ms.member(i).foldedName(nil))
		if f == resyncFolded {
			return fmt.Errorf("%s: %q is reserved for peers' re-assertions", level, ms.nameAt(i))
		}
		if prev, dup := seen[f]; dup {
			return fmt.Errorf("%s: names %q and %q collide", level, ms.nameAt(prev), ms.nameAt(i))
		}
		seen[f] = i
		if canon, ok := known[f]; ok && !ms.nameIs(i, canon) {
			return fmt.Errorf("%s: %q must be spelt %q", level, ms.nameAt(i), canon)
		}
	}
	return nil
}

// Ingress is a producer's frame as the ingress validated it, its
// origin stamped: a lifecycle event or a removal, and the params relayed.
type Ingress struct {
	Method  string
	Params  json.RawMessage // relayed to the peers as they are
	Life    Lifecycle       // set for the lifecycle methods
	Removal Removal         // set for workloads:remove
}

func (f *Ingress) isRemoval() bool { return f.Method == MethodRemove }

// ParseIngress validates a producer's request body and returns it as a
// local-origin frame with its origin stamped, from one pass over the body
// (framescan.go). On top of the checks every path shares (the typed checks
// included), it enforces the ingress's own rules: a body that is UTF-8
// throughout, exact field spelling, no resync marker, no ingress mark
// (ingressmark.go), this node's origin only, a known state and a bounded
// error text. Params over maxWorkload
// bytes are refused (*WorkloadTooLargeError) before anything else is read
// of them. The frame relayed is the body's own text, byte for byte, but
// for the origin stamped where it was absent, empty or null. It has no
// side effects.
func ParseIngress(body []byte, nodeID string, maxWorkload int) (Ingress, error) {
	if err := CheckUTF8(body); err != nil {
		return Ingress{}, err
	}
	var s Scan
	if err := s.ScanFrame(body); err != nil {
		return Ingress{}, fmt.Errorf("envelope: %w", err)
	}
	method, err := ingressEnvelope(&s)
	if err != nil {
		return Ingress{}, err
	}
	if err := CheckWorkloadBytes(&s, maxWorkload, 0); err != nil {
		return Ingress{}, err
	}
	pl := &s.levels[levelParams]
	if err := checkSpelling("params", pl, paramsFields); err != nil {
		return Ingress{}, err
	}
	f := Ingress{Method: method}
	if method == MethodRemove {
		stamped, err := stampOrigin(&s, levelParams, nodeID)
		if err != nil {
			return Ingress{}, err
		}
		if f.Removal, err = removalFromScan(&s, stamped.origin); err != nil {
			return Ingress{}, err
		}
		f.Params, f.Removal.Params = stamped.params, stamped.params
		return f, checkIngressValues(&f, nodeID)
	}
	stamped, err := checkIngressWorkload(&s, nodeID)
	if err != nil {
		return Ingress{}, err
	}
	if err := checkIngressNumbers(&s.levels[levelInfo]); err != nil {
		return Ingress{}, err
	}
	if f.Life, err = lifecycleFromScan(method, &s, nodeID); err != nil {
		return Ingress{}, err
	}
	if stamped.params != nil {
		f.Life.Params, f.Life.Raw = stamped.params, stamped.object
	}
	f.Params = f.Life.Params
	return f, checkIngressValues(&f, nodeID)
}

// ingressEnvelope applies the ingress's rules to a scanned envelope and
// returns the frame's method: exact spelling, jsonrpc "2.0", a known
// method, and params that are an object.
func ingressEnvelope(s *Scan) (string, error) {
	env := &s.levels[levelEnvelope]
	if !env.present {
		return "", fmt.Errorf("envelope: %w", errNotObject)
	}
	if err := checkSpelling("envelope", env, envelopeFields); err != nil {
		return "", err
	}
	var jsonrpc, method string
	if m := env.exact("jsonrpc"); m == nil || envelopeString(m, "jsonrpc", &jsonrpc) != nil || jsonrpc != "2.0" {
		return "", errors.New(`jsonrpc must be "2.0"`)
	}
	if m := env.exact("method"); m == nil || envelopeString(m, "method", &method) != nil {
		return "", errors.New("method is missing or not a string")
	}
	if !IsLifecycleMethod(method) && method != MethodRemove {
		return "", fmt.Errorf("method %q: must be a workload lifecycle method or workloads:remove", method)
	}
	if env.exact("params") == nil {
		return "", errors.New("params is missing")
	}
	if !s.levels[levelParams].present {
		return "", fmt.Errorf("params: %w", errNotObject)
	}
	return method, nil
}

// checkIngressWorkload applies the ingress's rules to a lifecycle frame's
// workload object, when it has one (lifecycleFromScan names the problem
// when it has not): exact spelling, no ingress mark, the bound on a
// producer's error text, and the origin, which it stamps.
func checkIngressWorkload(s *Scan, nodeID string) (stampedObject, error) {
	il := &s.levels[levelInfo]
	if s.levels[levelParams].exact("workloadInfo") == nil || !il.present {
		return stampedObject{}, nil
	}
	if err := checkSpelling("workloadInfo", il, workloadFields); err != nil {
		return stampedObject{}, err
	}
	if err := checkNoIngressMark(il); err != nil {
		return stampedObject{}, err
	}
	// The spelling is checked: error is the one member that can be it.
	if m := il.exact("error"); m != nil {
		if err := checkStringBound("workloadInfo", "error", MaxIngressErrorBytes, m.value); err != nil {
			return stampedObject{}, err
		}
	}
	return stampOrigin(s, levelInfo, nodeID)
}

// stampedObject is the params of an ingress frame with the origin stamped
// into one of its objects.
type stampedObject struct {
	params json.RawMessage // nil when nothing was stamped: the text as sent
	object json.RawMessage // the stamped object within params
	origin json.RawMessage // the origin's token as it stands
}

// stampOrigin gives the object at level (a removal's params, a lifecycle
// frame's workloadInfo) this node's id when its originatedFrom is absent,
// empty or null, and refuses one that names another node. The spelling is
// checked: the member can only be spelt exactly. The params are the
// body's text with the one member's value replaced, or the one member
// added before the object's closing brace; an origin sent as this node's
// id in plain text is left as it is, and nothing is copied.
func stampOrigin(s *Scan, level int, nodeID string) (stampedObject, error) {
	var qbuf [96]byte
	quoted := appendJSONString(qbuf[:0], nodeID)
	l, pl := &s.levels[level], &s.levels[levelParams]
	var at, end int // the bytes of s.b replaced
	var ibuf [128]byte
	insert := ibuf[:0] // on the stack: the params below are the one copy
	switch m := l.exact("originatedFrom"); {
	case m == nil:
		at = l.off + len(l.raw) - 1 // the closing brace
		end = at
		if l.n > 0 {
			insert = append(insert, ',')
		}
		insert = append(append(insert, `"originatedFrom":`...), quoted...)
	case isJSONNull(m.value):
		at, end, insert = m.off, m.off+len(m.value), quoted
	case !m.isString():
		return stampedObject{}, errors.New("originatedFrom must be a string")
	case string(m.value) == string(quoted):
		return stampedObject{params: pl.raw, object: l.raw, origin: m.value}, nil
	default:
		if origin := string(appendUnquoted(nil, m.value)); origin != "" && origin != nodeID {
			return stampedObject{}, &ForeignOriginError{Origin: origin}
		}
		at, end, insert = m.off, m.off+len(m.value), quoted
	}
	params := make([]byte, 0, len(pl.raw)+len(insert))
	params = append(params, s.b[pl.off:at]...)
	params = append(params, insert...)
	params = append(params, s.b[end:pl.off+len(pl.raw)]...)
	objStart := l.off - pl.off
	objEnd := l.off + len(l.raw) - pl.off + len(insert) - (end - at)
	// The stamped token ends every insert.
	tokEnd := at - pl.off + len(insert)
	return stampedObject{params: params, object: params[objStart:objEnd:objEnd],
		origin: params[tokEnd-len(quoted) : tokEnd : tokEnd]}, nil
}

// MinEpochMillis is the least time the ingress takes in createdAt,
// startedAt and completedAt: 10^12 ms is 2001-09-09, while a time in
// seconds stays below it until the year 33658, so a smaller value is a
// producer's time in seconds (1789661457 is 2026 in seconds and a January
// 1970 in milliseconds), which every Jobs list would show as 1970.
const MinEpochMillis = 1_000_000_000_000

// checkIngressNumbers applies the ingress's own rules to the workload's
// numbers, before the typed checks, whose answer offers null: createdAt
// and seq are integers, never null, as the stock peers would take them,
// and each time is in epoch milliseconds. A startedAt or completedAt that
// is not an integer is left to the typed checks (the ingress takes null
// there). The spelling is checked, so each is at most one member spelt
// exactly.
func checkIngressNumbers(il *scanLevel) error {
	for _, name := range [...]string{"createdAt", "startedAt", "completedAt"} {
		m := il.exact(name)
		switch {
		case m == nil:
		case isJSONNull(m.value) || !isJSONInteger(m.value):
			if name == "createdAt" {
				return errors.New("workloadInfo.createdAt must be an integer (epoch milliseconds); the ingress takes no null")
			}
		default:
			if n, _ := parseJSONInteger(m.value); n < MinEpochMillis {
				return fmt.Errorf("workloadInfo.%s is %d, below %d: it looks like seconds; send epoch milliseconds", name, n, int64(MinEpochMillis))
			}
		}
	}
	if m := il.exact("seq"); m != nil && !isSeq(m.value) {
		return fmt.Errorf("workloadInfo.seq must be an integer from 0 to %d; the ingress takes no null", int64(maxSeq))
	}
	return nil
}

// stateOfMethod is what each lifecycle method says of its workload: the
// state a frame of that method must carry on the ingress.
var stateOfMethod = map[string]string{
	MethodSubmitted: "queued",
	MethodStarted:   "running",
	MethodCompleted: "completed",
	MethodErrored:   "failed or cancelled",
}

// methodAgrees reports whether a frame of method may carry state:
// workload:errored carries either failure, each other method its own.
func methodAgrees(method, state string) bool {
	if method == MethodErrored {
		return state == "failed" || state == "cancelled"
	}
	return stateOfMethod[method] == state
}

// checkIngressValues validates the decoded frame again, so the ingress rules
// hold even for a spelling the name check missed: the origin is this node,
// the state is one of the five and no resync marker was decoded. The id's
// bound is not the ingress's own: every path holds it (MaxKeyFieldBytes),
// in every spelling, in the parse step before this.
func checkIngressValues(f *Ingress, nodeID string) error {
	origin := f.Removal.Ref.Origin
	if !f.isRemoval() {
		origin = f.Life.Info.OriginatedFrom
		if _, known := workloadStates[f.Life.Info.State]; !known {
			return fmt.Errorf("state %q: must be queued, running, completed, failed or cancelled", f.Life.Info.State)
		}
		// The peers' brokers file an event by its state, and a producer's
		// frame whose method says otherwise is a mistake in one of the two:
		// relayed, its workload would show a state its method denies.
		if !methodAgrees(f.Method, f.Life.Info.State) {
			return fmt.Errorf("workloadInfo.state %q does not agree with method %s, which carries state %s", f.Life.Info.State, f.Method, stateOfMethod[f.Method])
		}
		if f.Life.Resync {
			return errors.New("resync is reserved for peers' re-assertions")
		}
	}
	if origin != nodeID {
		return fmt.Errorf("originatedFrom %q is not this node", origin)
	}
	return nil
}
