package wireframe

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// The single pass over a frame (issue 14). Every path reads a frame once:
// Scan walks the text a single time, validating its grammar exactly as
// encoding/json does (json.Valid's grammar and its nesting limit), and
// records the members of the three objects the daemon interprets, in
// document order, repeats included: the envelope, its params, and the
// params' workloadInfo. The members are byte ranges of the text itself:
// nothing is copied or decoded while scanning, and what the daemon relays
// is the text as it arrived.
//
// Which object is "the" params (or workloadInfo) follows encoding/json,
// which the stock daemons decode with: the last member whose name folds to
// params (foldKey) is the one decoded. So the scan descends into every such
// member that holds an object, and a later one replaces what an earlier
// one recorded; a later one that is not an object leaves none.
//
// A whole frame is checked for UTF-8 first (CheckUTF8, on every path),
// so that no byte that is not UTF-8 is ever relayed; the scanner marks such
// bytes inside a string too (scanString.badUTF8), so that params scanned on
// their own hold the typed fields to the same rule.

// maxJSONDepth is encoding/json's nesting limit: a text nested deeper is
// refused there, so it is refused here.
const maxJSONDepth = 10000

// scanString describes a string token.
type scanString struct {
	escaped bool // the token holds a backslash escape
	// loneSurrogate: a \u escape of a surrogate that is not a high one
	// followed by an escaped low one. encoding/json decodes it to U+FFFD
	// without an error; the broker refuses it (workloadtypes.go).
	loneSurrogate bool
	// badUTF8: raw bytes that are not UTF-8 (or encode a surrogate), which
	// encoding/json also turns into U+FFFD. A whole frame is checked
	// before it is scanned; params handed to ParseLifecycle on their own
	// are checked here.
	badUTF8 bool
}

// wellFormed reports whether the string decodes without a substitution.
func (s scanString) wellFormed() bool { return !s.loneSurrogate && !s.badUTF8 }

// scanMember is one member of a scanned object.
type scanMember struct {
	name    []byte // the name's token, quotes included
	value   []byte // the value's text
	off     int    // where value starts in the scanned text
	nameOff int    // where name starts in the scanned text
	nameS   scanString
	valS    scanString // for a string value
}

// nameString returns the member's name as encoding/json decodes it.
func (m *scanMember) nameString() string {
	if !m.nameS.escaped {
		return string(m.name[1 : len(m.name)-1])
	}
	return string(appendUnquoted(nil, m.name))
}

// isString reports whether the value is a string token.
func (m *scanMember) isString() bool { return m.value[0] == '"' }

// foldedName appends the member's name folded (foldKey) to dst.
func (m *scanMember) foldedName(dst []byte) []byte {
	if !m.nameS.escaped {
		return appendFold(dst, m.name[1:len(m.name)-1])
	}
	return appendFold(dst, appendUnquoted(nil, m.name))
}

// scanLevel is one scanned object: its text and its members.
type scanLevel struct {
	present bool // an object was scanned here
	raw     []byte
	off     int // where raw starts in the scanned text
	n       int
	inline  [16]scanMember
	more    []scanMember // members past the inline ones
}

func (l *scanLevel) reset() {
	l.present, l.raw, l.off, l.n, l.more = false, nil, 0, 0, l.more[:0]
}

func (l *scanLevel) add(m scanMember) {
	if l.n < len(l.inline) {
		l.inline[l.n] = m
	} else {
		l.more = append(l.more, m)
	}
	l.n++
}

// member returns the i-th member.
func (l *scanLevel) member(i int) *scanMember {
	if i < len(l.inline) {
		return &l.inline[i]
	}
	return &l.more[i-len(l.inline)]
}

// The three levels a frame is interpreted at.
const (
	levelEnvelope = iota
	levelParams
	levelInfo
)

// Scan is the result of one pass over a frame.
type Scan struct {
	b      []byte
	levels [3]scanLevel
	depth  int
}

// errScanSyntax is what the scanner reports for a text encoding/json would
// refuse; scanSyntaxError replaces it with encoding/json's own wording.
var errScanSyntax = errors.New("invalid JSON")

// ScanFrame scans a whole frame: an envelope object with params and their
// workloadInfo.
func (s *Scan) ScanFrame(b []byte) error {
	return s.scanTop(b, levelEnvelope)
}

// scanParams scans a params object on its own (a frame whose envelope was
// decoded elsewhere).
func (s *Scan) scanParams(b []byte) error {
	return s.scanTop(b, levelParams)
}

// Params returns the text of the scanned frame's params object, nil when
// it has none.
func (s *Scan) Params() json.RawMessage { return s.levels[levelParams].raw }

// Lifecycle reads the lifecycle frame a scan holds (lifecycleFromScan).
func (s *Scan) Lifecycle(method string) (Lifecycle, error) {
	return lifecycleFromScan(method, s, "")
}

// Removal reads the removal a scan holds (removalFromScan).
func (s *Scan) Removal() (Removal, error) { return removalFromScan(s, nil) }

func (s *Scan) scanTop(b []byte, level int) error {
	s.b = b
	for i := range s.levels {
		s.levels[i].reset()
	}
	s.depth = 0
	i := skipJSONSpace(b, 0)
	if i == len(b) {
		return scanSyntaxError(b)
	}
	var end int
	var err error
	if b[i] == '{' {
		end, err = s.scanObject(i, level)
	} else {
		end, err = s.skipValue(i)
	}
	if err != nil {
		return scanSyntaxError(b)
	}
	if skipJSONSpace(b, end) != len(b) {
		return scanSyntaxError(b)
	}
	return nil
}

// scanSyntaxError returns encoding/json's error for a text the scanner
// refused, so a producer reads the wording it always did. Only a refused
// frame pays for the second reading.
func scanSyntaxError(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	return errScanSyntax // not reached while the two grammars agree
}

// scanObject scans the object at b[i] and, at a level the daemon
// interprets, records its members and descends into the member that opens
// the next level.
func (s *Scan) scanObject(i, level int) (int, error) {
	// Only the three interpreted levels come here, so the nesting limit is
	// for skipContainer to hold; the depth counts them.
	s.depth++
	defer func() { s.depth-- }()
	b := s.b
	s.clearFrom(level) // an earlier object at this level is replaced
	lvl := &s.levels[level]
	lvl.present, lvl.off = true, i
	start := i
	i = skipJSONSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		lvl.raw = b[start : i+1]
		return i + 1, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return 0, errScanSyntax
		}
		nameEnd, nameS, err := scanStringToken(b, i)
		if err != nil {
			return 0, err
		}
		m := scanMember{name: b[i:nameEnd], nameOff: i, nameS: nameS}
		i = skipJSONSpace(b, nameEnd)
		if i >= len(b) || b[i] != ':' {
			return 0, errScanSyntax
		}
		i = skipJSONSpace(b, i+1)
		if i >= len(b) {
			return 0, errScanSyntax
		}
		var vEnd int
		child := childLevel(level, &m)
		switch {
		case child >= 0 && b[i] == '{':
			vEnd, err = s.scanObject(i, child)
		case child >= 0:
			s.clearFrom(child) // the last such member is not an object
			vEnd, err = s.skipValue(i)
		case b[i] == '"':
			vEnd, m.valS, err = scanStringToken(b, i)
		default:
			vEnd, err = s.skipValue(i)
		}
		if err != nil {
			return 0, err
		}
		m.value, m.off = b[i:vEnd:vEnd], i
		lvl.add(m)
		i = skipJSONSpace(b, vEnd)
		if i >= len(b) {
			return 0, errScanSyntax
		}
		switch b[i] {
		case '}':
			lvl.raw = b[start : i+1]
			return i + 1, nil
		case ',':
			i = skipJSONSpace(b, i+1)
		default:
			return 0, errScanSyntax
		}
	}
}

// childLevel returns the level a member's object value opens, or -1.
func childLevel(level int, m *scanMember) int {
	var name string
	switch level {
	case levelEnvelope:
		name = "params"
	case levelParams:
		name = "workloadInfo"
	default:
		return -1
	}
	var buf [64]byte
	if string(m.foldedName(buf[:0])) == foldedNames[name] {
		return level + 1
	}
	return -1
}

// foldedNames holds foldKey of the names the scanner matches.
var foldedNames = map[string]string{
	"params":       foldKey("params"),
	"workloadInfo": foldKey("workloadInfo"),
}

// clearFrom resets level and the levels below it.
func (s *Scan) clearFrom(level int) {
	for l := level; l < len(s.levels); l++ {
		s.levels[l].reset()
	}
}

// skipValue validates the value at b[i] and returns the index past it,
// without recording anything. Nested containers are walked iteratively,
// with their count held to encoding/json's nesting limit.
func (s *Scan) skipValue(i int) (int, error) {
	if c := s.b[i]; c == '{' || c == '[' {
		return s.skipContainer(i)
	}
	return s.skipScalar(i)
}

// skipContainer validates the object or array at b[i]. Its open
// containers are kept on a stack of bits (1: object), inline for the
// depths any real frame has.
func (s *Scan) skipContainer(i int) (int, error) {
	b := s.b
	var inline [8]uint64
	stack := inline[:]
	base := s.depth
	depth := 0
	push := func(obj bool) bool {
		if base+depth+1 > maxJSONDepth {
			return false
		}
		w, bit := depth/64, uint(depth%64)
		if w == len(stack) {
			stack = append(stack, 0)
		}
		if obj {
			stack[w] |= 1 << bit
		} else {
			stack[w] &^= 1 << bit
		}
		depth++
		return true
	}
	inObject := func() bool {
		d := depth - 1
		return stack[d/64]&(1<<uint(d%64)) != 0
	}
	// Expecting a value: at its start (after '[', ',' in an array, or ':').
	for {
		// A value starts at i.
		if i >= len(b) {
			return 0, errScanSyntax
		}
		switch c := b[i]; c {
		case '{', '[':
			if !push(c == '{') {
				return 0, errScanSyntax
			}
			i = skipJSONSpace(b, i+1)
			if i >= len(b) {
				return 0, errScanSyntax
			}
			if (c == '{' && b[i] == '}') || (c == '[' && b[i] == ']') {
				depth--
				i++
				break
			}
			if c == '{' {
				var err error
				if i, err = scanMemberName(b, i); err != nil {
					return 0, err
				}
			}
			continue
		default:
			end, err := s.skipScalar(i)
			if err != nil {
				return 0, err
			}
			i = end
		}
		// A value ended at i: close what ends here, then find the next.
		for {
			if depth == 0 {
				return i, nil
			}
			i = skipJSONSpace(b, i)
			if i >= len(b) {
				return 0, errScanSyntax
			}
			obj := inObject()
			switch b[i] {
			case ',':
				i = skipJSONSpace(b, i+1)
				if obj {
					var err error
					if i, err = scanMemberName(b, i); err != nil {
						return 0, err
					}
				}
			case '}', ']':
				if (b[i] == '}') != obj {
					return 0, errScanSyntax
				}
				depth--
				i++
				continue
			default:
				return 0, errScanSyntax
			}
			break
		}
	}
}

// scanMemberName validates `"name" :` at b[i] and returns the index of the
// value after it.
func scanMemberName(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return 0, errScanSyntax
	}
	end, _, err := scanStringToken(b, i)
	if err != nil {
		return 0, err
	}
	i = skipJSONSpace(b, end)
	if i >= len(b) || b[i] != ':' {
		return 0, errScanSyntax
	}
	return skipJSONSpace(b, i+1), nil
}

// skipScalar validates a string, number or literal at b[i].
func (s *Scan) skipScalar(i int) (int, error) {
	switch c := s.b[i]; {
	case c == '"':
		end, _, err := scanStringToken(s.b, i)
		return end, err
	case c == '-' || ('0' <= c && c <= '9'):
		return scanNumber(s.b, i)
	case c == 't':
		return scanLiteral(s.b, i, "true")
	case c == 'f':
		return scanLiteral(s.b, i, "false")
	case c == 'n':
		return scanLiteral(s.b, i, "null")
	}
	return 0, errScanSyntax
}

func scanLiteral(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, errScanSyntax
	}
	return i + len(lit), nil
}

// scanNumber validates a JSON number at b[i]:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = skipDigits(b, i)
	default:
		return 0, errScanSyntax
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return 0, errScanSyntax
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return 0, errScanSyntax
		}
		i = j
	}
	return i, nil
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// scanStringToken validates the string token at b[i] (a quote) and returns
// the index past it, with what it holds.
func scanStringToken(b []byte, i int) (int, scanString, error) {
	var s scanString
	i++
	for {
		// The common run of plain ASCII characters.
		for i < len(b) && b[i] >= 0x20 && b[i] < utf8.RuneSelf && b[i] != '"' && b[i] != '\\' {
			i++
		}
		if i < len(b) && b[i] >= utf8.RuneSelf {
			if r, n := utf8.DecodeRune(b[i:]); r == utf8.RuneError && n == 1 {
				s.badUTF8 = true
				i++
			} else {
				i += n
			}
			continue
		}
		if i >= len(b) || b[i] < 0x20 {
			return 0, s, errScanSyntax
		}
		if b[i] == '"' {
			return i + 1, s, nil
		}
		// An escape.
		s.escaped = true
		if i+1 >= len(b) {
			return 0, s, errScanSyntax
		}
		switch b[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
			continue
		case 'u':
		default:
			return 0, s, errScanSyntax
		}
		r, ok := hexRune(b, i+2)
		if !ok {
			return 0, s, errScanSyntax
		}
		i += 6
		switch {
		case isLowSurrogate(r):
			s.loneSurrogate = true
		case isHighSurrogate(r):
			if low, ok := escapedRuneAt(b, i); ok && isLowSurrogate(low) {
				i += 6
			} else {
				s.loneSurrogate = true
			}
		}
	}
}

// hexRune reads the four hex digits at b[i].
func hexRune(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// escapedRuneAt reads a \uXXXX escape at b[i], if there is one.
func escapedRuneAt(b []byte, i int) (rune, bool) {
	if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
		return 0, false
	}
	return hexRune(b, i+2)
}

// appendUnquoted appends the text a valid string token decodes to, as
// encoding/json decodes it: a surrogate escape that is not part of a pair
// becomes U+FFFD.
func appendUnquoted(dst, q []byte) []byte {
	s := q[1 : len(q)-1]
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			j := i + 1
			for j < len(s) && s[j] != '\\' {
				j++
			}
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		if s[i+1] != 'u' {
			dst, i = append(dst, unescapedByte(s[i+1])), i+2
			continue
		}
		r, _ := hexRune(s, i+2)
		i += 6
		if isHighSurrogate(r) {
			if low, ok := escapedRuneAt(s, i); ok && isLowSurrogate(low) {
				r = 0x10000 + (r-0xd800)<<10 + (low - 0xdc00)
				i += 6
			} else {
				r = utf8.RuneError
			}
		} else if isLowSurrogate(r) {
			r = utf8.RuneError
		}
		dst = utf8.AppendRune(dst, r)
	}
	return dst
}

// unescapedByte is the byte a one-character escape (the character after
// the backslash, not u) stands for.
func unescapedByte(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c // " \ /
}
