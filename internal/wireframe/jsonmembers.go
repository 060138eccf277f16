package wireframe

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"unicode/utf8"
)

// The ingress reads a JSON object as its members in document order, repeats
// included, because encoding/json's own decoding silently keeps the last of
// two names and matches names without regard to case: the spelling rules of
// ingressframe.go need to see every name as it was sent.

// Member is one name/value pair of a JSON object, in document order.
type Member struct {
	Name  string
	Value json.RawMessage
}

// objectMembers returns the members of a JSON object in order, repeated
// names included (encoding/json would silently keep the last one).
//
// A valid document, the common case, is split by a scanner that relies on
// json.Valid having checked the grammar; its names are unquoted exactly as
// encoding/json unquotes them (json.Unmarshal whenever a name has an escape
// or is not valid UTF-8). Anything json.Valid refuses goes through the
// decoder, for its error.
func objectMembers(raw []byte) ([]Member, error) {
	if !json.Valid(raw) {
		return objectMembersDecoded(raw)
	}
	return ValidObjectMembers(raw)
}

// ValidObjectMembers is objectMembers for raw known to be valid JSON, such
// as a member value of a document objectMembers accepted.
func ValidObjectMembers(raw []byte) ([]Member, error) {
	i := skipJSONSpace(raw, 0)
	if i == len(raw) || raw[i] != '{' {
		return nil, errNotObject
	}
	ms := make([]Member, 0, 16)
	i = skipJSONSpace(raw, i+1)
	if raw[i] == '}' {
		return ms, nil
	}
	for {
		end := skipJSONString(raw, i)
		name, err := unquoteName(raw[i:end])
		if err != nil {
			return nil, err
		}
		i = skipJSONSpace(raw, end)
		i = skipJSONSpace(raw, i+1) // the colon
		vEnd := skipJSONValue(raw, i)
		ms = append(ms, Member{Name: name, Value: raw[i:vEnd:vEnd]})
		i = skipJSONSpace(raw, vEnd)
		if raw[i] == '}' {
			return ms, nil
		}
		i = skipJSONSpace(raw, i+1) // the comma
	}
}

// unquoteName returns a quoted JSON name as encoding/json decodes it.
func unquoteName(q []byte) (string, error) {
	body := q[1 : len(q)-1]
	if bytes.IndexByte(body, '\\') < 0 && utf8.Valid(body) {
		return string(body), nil
	}
	var s string
	err := json.Unmarshal(q, &s)
	return s, err
}

func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipJSONString returns the index just past the string that starts at
// b[i] (a quote) in a valid document.
func skipJSONString(b []byte, i int) int {
	for i++; b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// skipJSONValue returns the index just past the value that starts at b[i]
// in a valid document.
func skipJSONValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipJSONString(b, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = skipJSONString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	default: // a number or a literal
		for ; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return i
			}
		}
		return i
	}
}

// objectMembersDecoded is objectMembers through encoding/json's Decoder,
// which names the error in a document that is not valid.
func objectMembersDecoded(raw []byte) ([]Member, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errNotObject
	}
	var ms []Member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		ms = append(ms, Member{Name: tok.(string), Value: v})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the JSON object")
	}
	return ms, nil
}

// MemberNamed returns the value of the first member named name.
func MemberNamed(ms []Member, name string) (json.RawMessage, bool) {
	for _, m := range ms {
		if m.Name == name {
			return m.Value, true
		}
	}
	return nil, false
}

// EncodeMembers renders members as a JSON object, in order, values untouched.
func EncodeMembers(ms []Member) json.RawMessage {
	var b bytes.Buffer
	n := 2 // the braces
	for _, m := range ms {
		n += len(m.Name) + len(m.Value) + 4 // quotes, colon, comma
	}
	b.Grow(n) // exact for plain names: no slack is kept with the frame
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, m.Name)
		b.WriteByte(':')
		b.Write(m.Value)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// WithMember returns ms with name set to value, in place when present.
func WithMember(ms []Member, name string, value json.RawMessage) []Member {
	out := make([]Member, 0, len(ms)+1)
	found := false
	for _, m := range ms {
		if m.Name == name {
			m.Value, found = value, true
		}
		out = append(out, m)
	}
	if !found {
		out = append(out, Member{name, value})
	}
	return out
}
