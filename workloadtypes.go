package main

import (
	"encoding/json"
	"fmt"
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
	typeEpochMillis                       // an integer (epoch milliseconds); null is refused
	typeEpochMillisNull                   // an integer (epoch milliseconds) or null
	typeSeq                               // an integer from 0 to the int64 maximum
)

// expectation says, for an error, what a member of type t must be.
func (t memberType) expectation() string {
	switch t {
	case typeString:
		return "a string"
	case typeStringOrNull:
		return "a string or null"
	case typeEpochMillis:
		return "an integer (epoch milliseconds)"
	case typeEpochMillisNull:
		return "an integer (epoch milliseconds) or null"
	default:
		return "an integer from 0 to " + strconv.FormatInt(maxSeq, 10)
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
}

// typedFields maps the folded form of each name to its field.
func typedFields(fields ...typedField) map[string]typedField {
	m := make(map[string]typedField, len(fields))
	for _, f := range fields {
		m[foldKey(f.name)] = f
	}
	return m
}

// maxKeyFieldBytes bounds, in bytes of its decoded UTF-8 value, every string
// field that identifies a workload or an event of one: the fields the dedup
// key, the re-sync set's key and the removal memory are made of, and the
// model and requester beside them. A bound on these keeps every structure
// keyed by them bounded in bytes, not only in entries, whatever a peer or a
// producer sends; 256 bytes is far more than any id, node UUID or engine
// name the cluster uses.
const maxKeyFieldBytes = 256

var (
	// workloadTypedFields are the members of a workload object the broker
	// decodes, with their types (contract, section 3).
	workloadTypedFields = typedFields(
		typedField{"id", typeString, maxKeyFieldBytes},
		typedField{"model", typeString, maxKeyFieldBytes},
		typedField{"engine", typeString, maxKeyFieldBytes},
		typedField{"state", typeString, 0},
		typedField{"originatedFrom", typeString, maxKeyFieldBytes},
		typedField{"runId", typeStringOrNull, maxKeyFieldBytes},
		typedField{"scheduledOn", typeStringOrNull, maxKeyFieldBytes},
		typedField{"createdAt", typeEpochMillis, 0},
		typedField{"startedAt", typeEpochMillisNull, 0},
		typedField{"completedAt", typeEpochMillisNull, 0},
		// error is bounded on the ingress only (ingressframe.go): the broker
		// and the stock peers send long error texts, and error is in no key.
		typedField{"error", typeStringOrNull, 0},
		typedField{"requesterId", typeStringOrNull, maxKeyFieldBytes},
		typedField{"seq", typeSeq, 0},
	)
	// removalTypedFields are the members of a workloads:remove frame's params
	// the broker decodes.
	removalTypedFields = typedFields(
		typedField{"workloadId", typeString, maxKeyFieldBytes},
		typedField{"originatedFrom", typeString, maxKeyFieldBytes},
	)
)

// checkWorkloadTypes checks the type of every known member of a workload
// object, given as valid JSON, and returns its seq when it has one (the last
// member that folds to seq, the one encoding/json would decode).
func checkWorkloadTypes(info []byte) (seq int64, hasSeq bool, err error) {
	ms, err := validObjectMembers(info)
	if err != nil {
		return 0, false, fmt.Errorf("workloadInfo: %w", err)
	}
	for _, m := range ms {
		f, known := lookupTypedField(workloadTypedFields, m.name)
		if !known {
			continue
		}
		if err := checkMemberType("workloadInfo", f, m); err != nil {
			return 0, false, err
		}
		if f.typ == typeSeq {
			seq, hasSeq = parseJSONInteger(m.value)
		}
	}
	return seq, hasSeq, nil
}

// removalTokens are the raw JSON string tokens of a removal's workloadId
// and originatedFrom, each the last member whose name folds to the field:
// the one encoding/json decodes. nil when the member is absent.
type removalTokens struct {
	workloadID, originatedFrom json.RawMessage
}

// checkRemovalTypes checks the type of every known member of a removal's
// params and returns the tokens of its two fields, as they arrived.
func checkRemovalTypes(params []byte) (removalTokens, error) {
	var tok removalTokens
	ms, err := objectMembers(params)
	if err != nil {
		return tok, fmt.Errorf("params: %w", err)
	}
	for _, m := range ms {
		f, known := lookupTypedField(removalTypedFields, m.name)
		if !known {
			continue
		}
		if err := checkMemberType("params", f, m); err != nil {
			return tok, err
		}
		if f.name == "workloadId" {
			tok.workloadID = m.value
		} else {
			tok.originatedFrom = m.value
		}
	}
	return tok, nil
}

// lookupTypedField finds the field a member name would be decoded as.
func lookupTypedField(fields map[string]typedField, name string) (typedField, bool) {
	var buf [64]byte // a known name folds well within it: no allocation
	f, ok := fields[string(appendFold(buf[:0], name))]
	return f, ok
}

// checkMemberType refuses a member whose value the broker cannot decode as
// its field's type, or a string over its field's bound. The error names the
// field and the type it must have, or the bound; a member sent under
// another spelling is named as sent too.
func checkMemberType(level string, f typedField, m jsonMember) error {
	var what string
	switch {
	case !hasMemberType(f.typ, m.value):
		what = "must be " + f.typ.expectation()
	case isJSONStringValue(m.value) && !isWellFormedJSONString(m.value):
		what = "must be valid UTF-8 with no lone surrogates"
	default:
		if err := checkStringBound(level, f.name, f.maxBytes, m.value); err != nil {
			if m.name != f.name {
				err.sentAs = m.name
			}
			return err
		}
		return nil
	}
	if m.name != f.name {
		return fmt.Errorf("%s.%s %s (sent as %q)", level, f.name, what, m.name)
	}
	return fmt.Errorf("%s.%s %s", level, f.name, what)
}

// fieldTooLongError refuses a string member over its field's bound. It is
// a type of its own so that each path can count these refusals
// (nvpair_wlm_field_bound_refusals_total).
type fieldTooLongError struct {
	field  string // with its level: "workloadInfo.engine"
	sentAs string // the member's name when it was not the field's spelling
	size   int    // the decoded value's bytes
	limit  int
}

func (e *fieldTooLongError) Error() string {
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
func checkStringBound(level, field string, limit int, v []byte) *fieldTooLongError {
	if limit == 0 || !isJSONStringValue(v) {
		return nil
	}
	// Escapes only shrink on decoding, so a token whose text fits needs no
	// closer look.
	if len(v)-2 <= limit {
		return nil
	}
	if n := decodedJSONStringLen(v); n > limit {
		return &fieldTooLongError{field: level + "." + field, size: n, limit: limit}
	}
	return nil
}

// decodedJSONStringLen returns the bytes of the UTF-8 text a well-formed
// quoted JSON string decodes to (isWellFormedJSONString), without
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
		r, _ := escapedRune(s, i)
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
	case typeEpochMillis:
		return isJSONInteger(v)
	case typeEpochMillisNull:
		return isJSONNull(v) || isJSONInteger(v)
	default:
		return isSeq(v)
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
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, err == nil
}

// isWellFormedJSONString reports whether a quoted JSON string decodes to
// text without a substitution: its raw bytes are valid UTF-8 and every \u
// escape of a surrogate is a high one followed by an escaped low one.
// encoding/json turns a violation into U+FFFD without an error, so this is
// decided on the raw text.
func isWellFormedJSONString(q []byte) bool {
	if len(q) < 2 {
		return false
	}
	s := q[1 : len(q)-1]
	for i := 0; i < len(s); {
		switch c := s[i]; {
		case c == '\\':
			if i+1 < len(s) && s[i+1] != 'u' {
				i += 2
				continue
			}
			r, ok := escapedRune(s, i)
			if !ok {
				return false
			}
			i += 6
			if isLowSurrogate(r) {
				return false
			}
			if isHighSurrogate(r) {
				low, ok := escapedRune(s, i)
				if !ok || !isLowSurrogate(low) {
					return false
				}
				i += 6
			}
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && n == 1 { // also an encoded surrogate
				return false
			}
			i += n
		}
	}
	return true
}

// escapedRune reads the \uXXXX escape at s[i].
func escapedRune(s []byte, i int) (rune, bool) {
	if i+6 > len(s) || s[i] != '\\' || s[i+1] != 'u' {
		return 0, false
	}
	n, err := strconv.ParseUint(string(s[i+2:i+6]), 16, 16)
	return rune(n), err == nil
}

func isHighSurrogate(r rune) bool { return 0xd800 <= r && r < 0xdc00 }

func isLowSurrogate(r rune) bool { return 0xdc00 <= r && r < 0xe000 }
