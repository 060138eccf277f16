package wireframe

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// MaxBytes bounds one frame on every channel: a stdio line, a peer
// request body and an ingress request body.
const MaxBytes = 1 << 20

// JSON-RPC 2.0 error codes the daemon answers with.
const (
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
)

// RPC is one JSON-RPC 2.0 message: a request (method and id), a
// notification (method, no id) or a response (id with result or error).
// Params and results stay raw so that nothing the daemon does not know about
// is lost on the way through.
type RPC struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *RPCError       `json:"error,omitempty"`
}

// RPCError is a JSON-RPC 2.0 error object.
type RPCError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// IsRequest reports whether the frame expects an answer. encoding/json hands
// a present "id": null to RawMessage as "null", so presence is what counts.
func (f *RPC) IsRequest() bool { return f.Method != "" && f.ID != nil }

// IsResponse reports whether the frame answers a request of ours.
func (f *RPC) IsResponse() bool { return f.Method == "" && f.ID != nil }

// Envelope is what the daemon reads of a scanned frame's envelope, as
// encoding/json would decode it into RPC: each member the last whose
// name folds to it, a null jsonrpc or method leaving it as it was.
type Envelope struct {
	JSONRPC, Method string
	ID              json.RawMessage // nil when absent
}

// The folded names of the envelope members the daemon reads.
var (
	foldedJSONRPC = foldKey("jsonrpc")
	foldedMethod  = foldKey("method")
	foldedID      = foldKey("id")
)

// EnvelopeOf reads the envelope of a frame scanned whole (Scan). A
// frame that is not an object, or whose jsonrpc or method is neither a
// string nor null, is refused, as encoding/json refuses it. The other
// members of an envelope (a response's result or error) are not read: a
// frame the daemon acts on is a notification or a request.
func EnvelopeOf(s *Scan) (Envelope, error) {
	var env Envelope
	el := &s.levels[levelEnvelope]
	if !el.present {
		return env, errNotObject
	}
	var buf [64]byte
	for i := range el.n {
		m := el.member(i)
		switch string(m.foldedName(buf[:0])) {
		case foldedJSONRPC:
			if err := envelopeString(m, "jsonrpc", &env.JSONRPC); err != nil {
				return env, err
			}
		case foldedMethod:
			if err := envelopeString(m, "method", &env.Method); err != nil {
				return env, err
			}
		case foldedID:
			env.ID = m.value
		}
	}
	return env, nil
}

// envelopeString sets *dst to a string member's value, leaves it for null
// and refuses any other value. The method names and "2.0" are the common
// values: they are returned as constants, with no allocation.
func envelopeString(m *scanMember, name string, dst *string) error {
	switch {
	case isJSONNull(m.value):
		return nil
	case !m.isString():
		return fmt.Errorf("%s must be a string", name)
	}
	var stack [64]byte
	v := appendUnquoted(stack[:0], m.value)
	switch string(v) {
	case "2.0":
		*dst = "2.0"
	case MethodSubmitted:
		*dst = MethodSubmitted
	case MethodStarted:
		*dst = MethodStarted
	case MethodCompleted:
		*dst = MethodCompleted
	case MethodErrored:
		*dst = MethodErrored
	case MethodRemove:
		*dst = MethodRemove
	default:
		*dst = string(v)
	}
	return nil
}

// EncodeNotification renders one notification line without its newline.
func EncodeNotification(method string, params json.RawMessage) []byte {
	var b bytes.Buffer
	b.Grow(len(method) + len(params) + 48)
	WriteNotification(&b, method, params)
	return b.Bytes()
}

// WriteNotification writes one notification line, without its newline, to
// b: the one encoding of a notification, for the peers and the broker alike.
func WriteNotification(b *bytes.Buffer, method string, params json.RawMessage) {
	b.WriteString(`{"jsonrpc":"2.0","method":`)
	writeJSONString(b, method)
	if params != nil {
		b.WriteString(`,"params":`)
		WriteOneLine(b, params)
	}
	b.WriteByte('}')
}

// WriteOneLine writes a JSON value to b on one line. A frame is one line.
// JSON allows line breaks only as whitespace between tokens, and a producer
// or a peer may send pretty-printed JSON: compacting drops that whitespace
// and changes no value. A value that does not compact is written as it is.
func WriteOneLine(b *bytes.Buffer, v json.RawMessage) {
	// Two byte searches: each is vectorized, where ContainsAny walks the
	// value a byte at a time, on every frame.
	if bytes.IndexByte(v, '\n') >= 0 || bytes.IndexByte(v, '\r') >= 0 {
		n := b.Len()
		if err := json.Compact(b, v); err == nil {
			return
		}
		b.Truncate(n)
	}
	b.Write(v)
}

// writeJSONString writes s as encoding/json would marshal it. A string
// with nothing to escape, the common case, is written as it is.
func writeJSONString(b *bytes.Buffer, s string) {
	if jsonPlain(s) {
		b.WriteByte('"')
		b.WriteString(s)
		b.WriteByte('"')
		return
	}
	q, _ := json.Marshal(s) // a string always marshals
	b.Write(q)
}

// appendJSONString appends s as encoding/json would marshal it.
func appendJSONString(dst []byte, s string) []byte {
	if jsonPlain(s) {
		return append(append(append(dst, '"'), s...), '"')
	}
	q, _ := json.Marshal(s) // a string always marshals
	return append(dst, q...)
}

// jsonPlain reports whether json.Marshal writes s between quotes unchanged:
// printable ASCII other than the quote, the backslash and the three HTML
// characters encoding/json escapes.
func jsonPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// errFrameNotUTF8 refuses a frame with a byte that is not UTF-8 anywhere in
// it. encoding/json reads such a byte as U+FFFD without an error, but the
// frame travels as the text it arrived as: relayed, it would put bytes that
// are not UTF-8 on the broker's stdout, which the broker cannot decode.
var errFrameNotUTF8 = errors.New("frame is not valid UTF-8")

// CheckUTF8 refuses a frame that is not valid UTF-8 throughout.
func CheckUTF8(frame []byte) error {
	if !utf8.Valid(frame) {
		return errFrameNotUTF8
	}
	return nil
}

// ErrLineTooLong is returned, once per over-long line, by LineReader.Next
// after the whole line has been consumed, so the next call reads the next
// line.
var ErrLineTooLong = errors.New("line longer than the frame limit")

// LineReader splits a stream into newline-delimited frames of at most
// maxLine bytes without ever buffering more than that.
type LineReader struct {
	r       *bufio.Reader
	maxLine int
	buf     []byte
}

// NewLineReader reads r in lines of at most maxLine bytes.
func NewLineReader(r io.Reader, maxLine int) *LineReader {
	return &LineReader{r: bufio.NewReaderSize(r, 64<<10), maxLine: maxLine}
}

// Next returns the next line without its line terminator. The returned slice
// is valid until the next call. A final line without a newline is returned
// before io.EOF.
func (l *LineReader) Next() ([]byte, error) {
	l.buf = l.buf[:0]
	tooLong := false
	for {
		chunk, err := l.r.ReadSlice('\n')
		if !tooLong {
			l.buf = append(l.buf, chunk...)
			if len(l.buf) > l.maxLine+len("\r\n") {
				// Stop buffering: the rest of the line is read and dropped.
				tooLong, l.buf = true, l.buf[:0]
			}
		}
		switch {
		case err == nil, errors.Is(err, io.EOF) && (len(l.buf) > 0 || tooLong):
			line := trimEOL(l.buf)
			if tooLong || len(line) > l.maxLine {
				return nil, ErrLineTooLong
			}
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

// The broker reads the daemon's lines with a bounded buffer, and one line
// longer than that buffer stops it reading the daemon at all. A line written
// to the broker, its terminating newline included, is at most the line limit
// (Config.BrokerLineMax, --broker-line-max).
const (
	// DefaultBrokerLineMax is the line buffer of PAIR's broker: 256 KiB.
	DefaultBrokerLineMax = 256 << 10
	// MinBrokerLineMax leaves room for every frame of the daemon's own
	// (ready, discovery:subscribe, the answers to the broker's requests)
	// with a wide margin: they are all under 1 KiB.
	MinBrokerLineMax = 4 << 10
	// MaxBrokerLineMax is past the longest line the daemon can build: a
	// frame comes from a body of at most MaxBytes, and re-encoding a
	// string at most sextuples it (one byte to a \u escape). A larger limit
	// could never refuse anything.
	MaxBrokerLineMax = 16 << 20
)

// CheckBrokerLineMax reports whether n is a usable line limit.
func CheckBrokerLineMax(n int) error {
	if n < MinBrokerLineMax || n > MaxBrokerLineMax {
		return fmt.Errorf("must be between %d and %d bytes", MinBrokerLineMax, MaxBrokerLineMax)
	}
	return nil
}

// ErrLineOverLimit is what writeLine returns, wrapped in a
// *LineOverLimitError, for a frame whose line would exceed the line limit.
// Nothing is written and the broker channel stays usable: only that frame
// is refused.
var ErrLineOverLimit = errors.New("line over the broker's line limit")

// LineOverLimitError says how long the refused line would have been.
type LineOverLimitError struct {
	Size  int // the line with its newline
	Limit int
}

func (e *LineOverLimitError) Error() string {
	return fmt.Sprintf("frame would be a %d-byte line to the broker, over its %d-byte line limit (--broker-line-max)", e.Size, e.Limit)
}

func (e *LineOverLimitError) Unwrap() error { return ErrLineOverLimit }
