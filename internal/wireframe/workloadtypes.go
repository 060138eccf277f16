package wireframe

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// The broker and the stock peers decode the workload object into typed
// fields, and refuse a frame that does not decode so. encoding/json, which
// the daemon reads the object with, would let such a frame through: it
// decodes only the fields the daemon reads, so a createdAt that is a string
// is never looked at, and it turns invalid UTF-8 and lone surrogates into
// U+FFFD without an error. So the daemon checks the members' types itself,
// on the raw JSON text, before it decodes the object, and what it accepts is
// exactly what they can decode: a frame it takes is one they can store.
//
// encoding/json matches member names without regard to case (Unicode simple
// folding) and keeps the last of two members that match one field, so every
// member whose name folds to a known field is checked, repeats included: a
// check on the exact name alone would pass a bad value sent as "CreatedAt",
// or a good one followed by a bad repeat. Members the daemon does not know
// are not checked: they pass through untouched.

// memberType is what a known member may hold.
type memberType uint8

const (
	typeString          memberType = iota // a string; null is refused
	typeStringOrNull                      // a string or null
	typeEpochMillisNull                   // an integer (epoch milliseconds) or null
	typeSeqOrNull                         // an integer from 0 to the int64 maximum, or null
)

// expectation says, for an error, what a member of type t must be.
func (t memberType) expectation() string {
	switch t {
	case typeString:
		return "a string"
	case typeStringOrNull:
		return "a string or null"
	case typeEpochMillisNull:
		return "an integer (epoch milliseconds) or null"
	default:
		return "an integer from 0 to " + strconv.FormatInt(maxSeq, 10) + " or null"
	}
}

// maxSeq is the largest seq: the broker keeps it as a signed 64-bit integer.
const maxSeq = 1<<63 - 1

// typedField is a known member, the type it must have and, for a string,
// the most bytes its decoded value may hold (0: no bound).
type typedField struct {
	name     string // its canonical spelling, for errors
	typ      memberType
	maxBytes int
	index    int // its place in the set, for typedValues
}

// typedFields maps the folded form of each name to its field, numbered in
// the order given.
func typedFields(fields ...typedField) map[string]typedField {
	m := make(map[string]typedField, len(fields))
	for i, f := range fields {
		f.index = i
		m[foldKey(f.name)] = f
	}
	return m
}

// MaxKeyFieldBytes bounds, in bytes of its decoded UTF-8 value, every string
// field that identifies a workload or an event of one: the fields the dedup
// key, the re-sync set's key and the removal memory are made of, and the
// model and requester beside them. A bound on these keeps every structure
// keyed by them bounded in bytes, not only in entries, whatever a peer or a
// producer sends; 256 bytes is far more than any id, node UUID or engine
// name the cluster uses.
const MaxKeyFieldBytes = 256

// The indexes of the workload fields in workloadTypedFields, in the order
// it lists them, and of the removal's in removalTypedFields.
const (
	wfID = iota
	wfModel
	wfEngine
	wfState
	wfOrigin
	wfRunID
	wfScheduledOn
	wfCreatedAt
	wfStartedAt
	wfCompletedAt
	wfError
	wfRequesterID
	wfSeq
)

const (
	rfWorkloadID = iota
	rfOrigin
)

var (
	// workloadTypedFields are the members of a workload object the broker
	// decodes, with their types (spec.md 3.2, Types). createdAt and seq
	// take null as the stock peers' decode does (Go int64 fields, which a
	// null leaves at 0): a stock peer relays such a frame, and refusing it
	// would hide that workload from every node of ours. The ingress, which
	// is this project's own, still refuses a null in either
	// (ingressframe.go).
	workloadTypedFields = typedFields(
		typedField{name: "id", typ: typeString, maxBytes: MaxKeyFieldBytes},
		typedField{name: "model", typ: typeString, maxBytes: MaxKeyFieldBytes},
		typedField{name: "engine", typ: typeString, maxBytes: MaxKeyFieldBytes},
		typedField{name: "state", typ: typeString, maxBytes: 0},
		typedField{name: "originatedFrom", typ: typeString, maxBytes: MaxKeyFieldBytes},
		typedField{name: "runId", typ: typeStringOrNull, maxBytes: MaxKeyFieldBytes},
		typedField{name: "scheduledOn", typ: typeStringOrNull, maxBytes: MaxKeyFieldBytes},
		typedField{name: "createdAt", typ: typeEpochMillisNull, maxBytes: 0},
		typedField{name: "startedAt", typ: typeEpochMillisNull, maxBytes: 0},
		typedField{name: "completedAt", typ: typeEpochMillisNull, maxBytes: 0},
		// error is bounded on the ingress only (ingressframe.go): the broker
		// and the stock peers send long error texts, and error is in no key.
		typedField{name: "error", typ: typeStringOrNull, maxBytes: 0},
		typedField{name: "requesterId", typ: typeStringOrNull, maxBytes: MaxKeyFieldBytes},
		typedField{name: "seq", typ: typeSeqOrNull, maxBytes: 0},
	)
	// removalTypedFields are the members of a workloads:remove frame's params
	// the broker decodes. originatedFrom is optional, as in the stock
	// peers' decode (a string field that absent, null and "" all leave
	// empty): older senders omit it (upstream spec, section 6).
	removalTypedFields = typedFields(
		typedField{name: "workloadId", typ: typeString, maxBytes: MaxKeyFieldBytes},
		typedField{name: "originatedFrom", typ: typeStringOrNull, maxBytes: MaxKeyFieldBytes},
	)
)

// typedValues holds, for each field of a typed set (by its index), the
// member encoding/json would decode it from: the last member whose name
// folds to the field, or for a field that may be null the last one that is
// not null (a null decodes to nothing and leaves an earlier value in
// place). nil when no member sets the field.
type typedValues [maxTypedFields]*scanMember

// maxTypedFields is the most fields a typed set has.
const maxTypedFields = 16

// checkTypedMembers checks the type of every member of l whose name folds
// to one of fields, repeats included, and returns the members the fields
// decode from. skip, when it is not "", names a field whose members the
// caller has checked itself (the ingress's stamped origin).
func checkTypedMembers(level string, l *scanLevel, fields map[string]typedField, skip string) (typedValues, error) {
	var vals typedValues
	for i := range l.n {
		m := l.member(i)
		f, known := lookupTypedField(fields, m)
		if !known || f.name == skip {
			continue
		}
		if err := checkMemberType(level, f, m); err != nil {
			return vals, err
		}
		if !isJSONNull(m.value) {
			vals[f.index] = m
		}
	}
	return vals, nil
}

// lookupTypedField finds the field a member's name would be decoded as.
func lookupTypedField(fields map[string]typedField, m *scanMember) (typedField, bool) {
	var buf [64]byte // a known name folds well within it: no allocation
	f, ok := fields[string(m.foldedName(buf[:0]))]
	return f, ok
}

// checkMemberType refuses a member whose value the broker cannot decode as
// its field's type, or a string over its field's bound. The error names the
// field and the type it must have, or the bound; a member sent under
// another spelling is named as sent too.
func checkMemberType(level string, f typedField, m *scanMember) error {
	var what string
	switch {
	case !hasMemberType(f.typ, m.value):
		what = "must be " + f.typ.expectation()
	case m.isString() && !m.valS.wellFormed():
		what = "must be valid UTF-8 with no lone surrogates"
	default:
		if err := checkStringBound(level, f.name, f.maxBytes, m.value); err != nil {
			if name := m.nameString(); name != f.name {
				err.sentAs = name
			}
			return err
		}
		return nil
	}
	if name := m.nameString(); name != f.name {
		return fmt.Errorf("%s.%s %s (sent as %q)", level, f.name, what, name)
	}
	return fmt.Errorf("%s.%s %s", level, f.name, what)
}

// FieldTooLongError refuses a string member over its field's bound. It is
// a type of its own so that each path can count these refusals
// (nvpair_wlm_field_bound_refusals_total).
type FieldTooLongError struct {
	field  string // with its level: "workloadInfo.engine"
	sentAs string // the member's name when it was not the field's spelling
	size   int    // the decoded value's bytes
	limit  int
}

func (e *FieldTooLongError) Error() string {
	msg := fmt.Sprintf("%s is %d bytes, over its %d-byte bound", e.field, e.size, e.limit)
	if e.sentAs != "" {
		msg += fmt.Sprintf(" (sent as %q)", e.sentAs)
	}
	return msg
}

// checkStringBound refuses v, a well-formed JSON value, when it is a string
// whose decoded value is over limit bytes; limit 0 bounds nothing. The
// bound is on the decoded value, the string every structure keyed by it
// holds, not on its escaped text: "\u00e9" is the two bytes of é.
func checkStringBound(level, field string, limit int, v []byte) *FieldTooLongError {
	if limit == 0 || !isJSONStringValue(v) {
		return nil
	}
	// Escapes only shrink on decoding, so a token whose text fits needs no
	// closer look.
	if len(v)-2 <= limit {
		return nil
	}
	if n := decodedJSONStringLen(v); n > limit {
		return &FieldTooLongError{field: level + "." + field, size: n, limit: limit}
	}
	return nil
}

// decodedJSONStringLen returns the bytes of the UTF-8 text a well-formed
// quoted JSON string decodes to (no lone surrogate, checkMemberType), without
// decoding it.
func decodedJSONStringLen(q []byte) int {
	s := q[1 : len(q)-1]
	n := 0
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			n++
			i++
			continue
		}
		if s[i+1] != 'u' {
			n++ // \" \\ \/ \b \f \n \r \t: one byte each
			i += 2
			continue
		}
		r, _ := escapedRuneAt(s, i)
		i += 6
		if isHighSurrogate(r) {
			n += 4 // with the escaped low surrogate that must follow
			i += 6
			continue
		}
		n += utf8.RuneLen(r)
	}
	return n
}

// hasMemberType reports whether v, valid JSON, is a value of type t.
func hasMemberType(t memberType, v []byte) bool {
	switch t {
	case typeString:
		return isJSONStringValue(v)
	case typeStringOrNull:
		return isJSONStringValue(v) || isJSONNull(v)
	case typeEpochMillisNull:
		return isJSONNull(v) || isJSONInteger(v)
	default:
		return isJSONNull(v) || isSeq(v)
	}
}

// isJSONStringValue reports whether v, valid JSON, is a string.
func isJSONStringValue(v []byte) bool { return len(v) > 0 && v[0] == '"' }

// isJSONNull reports whether v, valid JSON, is null.
func isJSONNull(v []byte) bool { return string(v) == "null" }

// isJSONInteger reports whether v is an integer the broker can hold: number
// text with no fraction and no exponent, in the int64 range.
func isJSONInteger(v []byte) bool {
	_, ok := parseJSONInteger(v)
	return ok
}

// isSeq reports whether v is a seq: an integer from 0 to the int64 maximum.
func isSeq(v []byte) bool {
	n, ok := parseJSONInteger(v)
	return ok && n >= 0
}

// parseJSONInteger reads an integer the broker can hold: number text of the
// form -?(0|[1-9][0-9]*) in the int64 range. v is valid JSON, so base-10
// ParseInt takes exactly that (JSON has no sign + and no leading zeros) and
// refuses a fraction or an exponent: 1e3 and 1.0 are refused although they
// are whole, since the broker decodes the field as an integer.
func parseJSONInteger(v []byte) (int64, bool) {
	neg := len(v) > 0 && v[0] == '-'
	digits := v
	if neg {
		digits = v[1:]
	}
	if len(digits) == 0 || len(digits) > 19 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	// Accumulated as a negative number, whose range reaches one further.
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n < (math.MinInt64+d)/10 {
			return 0, false
		}
		n = n*10 - d
	}
	if !neg {
		if n == math.MinInt64 {
			return 0, false
		}
		n = -n
	}
	return n, true
}

func isHighSurrogate(r rune) bool { return 0xd800 <= r && r < 0xdc00 }

func isLowSurrogate(r rune) bool { return 0xdc00 <= r && r < 0xe000 }

// MetricMethod bounds a metric's method label to the methods the daemon
// knows: anything else, which a client chooses, is "other".
func MetricMethod(m string) string {
	switch m {
	case MethodSubmitted, MethodStarted, MethodCompleted, MethodErrored, MethodRemove,
		"discovery:nodes", "log/set-level", "shutdown":
		return m
	}
	return "other"
}

// IsFieldTooLong reports whether err refuses a frame for a field over its
// bound.
func IsFieldTooLong(err error) bool {
	if err == nil {
		return false // the common case, without errors.As's allocation
	}
	var tooLong *FieldTooLongError
	return errors.As(err, &tooLong)
}

// IsWorkloadTooLarge reports whether err refuses a frame for params over
// the workload bound.
func IsWorkloadTooLarge(err error) bool {
	if err == nil {
		return false // the common case, without errors.As's allocation
	}
	var tooLarge *WorkloadTooLargeError
	return errors.As(err, &tooLarge)
}

// EventsPath is where a workload event is posted, on the peer port (a
// single frame or a batch from another member) and on the loopback
// ingress (a producer's frame) alike.
const EventsPath = "/v1/workloads/events"

// ResyncMarkerBytes is what the re-assertion marker adds to a frame's line
// to the peers, at most: `"resync":true,`.
const ResyncMarkerBytes = len(`"resync":true,`)
