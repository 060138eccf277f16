package httpguard

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Timeouts shared by the daemon's HTTP servers. There is deliberately no
// server-wide write timeout: net/http's WriteTimeout runs from the end of
// the request's headers, so it would cover the handler's broker write too,
// and a slow broker would make the server drop the answer of a frame that
// had already landed (the sender would then retry a frame that was
// accepted). The write deadline is instead armed when the answer starts
// (AnswerWriteTimeout), on the client's side of the socket only.
const (
	serverReadHeaderTimeout = 5 * time.Second
	ServerReadTimeout       = 10 * time.Second
	// AnswerWriteTimeout bounds how long a client may take to take an
	// answer, from its first byte: a refusal or a frame's answer is a few
	// hundred bytes and a metrics page some tens of KiB, so on loopback or
	// a LAN it is written in milliseconds. A client that does not read
	// (a receive window of 0) loses its connection at the deadline, and
	// with it its connection slot, its body reservation and its broker
	// waiter slot, all of which are given back when the handler returns.
	AnswerWriteTimeout = 5 * time.Second
)

// HTTP1Only is the set of protocols every listener of the daemon serves:
// HTTP/1.1 and HTTP/1.0, never HTTP/2 (neither negotiated by ALPN on the
// peer port nor spoken in plaintext, by prior knowledge or by upgrade, on
// the loopback listeners). HTTP/2 multiplexes streams with their own flow
// control under one connection, so one connection could hold many stuck
// answers and the connection caps (3.7) would count it once; the daemon's
// peers and producers send one small request at a time, which HTTP/1.1
// serves as well. spec.md 3.7 lists the protocols per listener.
var HTTP1Only = func() *http.Protocols {
	var p http.Protocols
	p.SetHTTP1(true)
	return &p
}()

// PeerALPN is what the peer port offers by ALPN: HTTP/1.1 alone, so a
// client that offers only h2 fails the handshake (no_application_protocol)
// rather than being served a protocol the spec does not name. A client
// that offers no ALPN at all (a stock daemon's net/http client offers
// h2 and http/1.1) is served HTTP/1.1.
var PeerALPN = []string{"http/1.1"}

// NewHTTPServer returns a server with the daemon's timeouts and protocols
// whose internal errors (failed handshakes, malformed requests) go to the
// log at debug.
func NewHTTPServer(h http.Handler, idle time.Duration, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           HTTP1Answers(h),
		ReadHeaderTimeout: serverReadHeaderTimeout,
		ReadTimeout:       ServerReadTimeout,
		IdleTimeout:       idle,
		Protocols:         HTTP1Only,
		// A non-nil map without "h2" is the older way to say the same as
		// Protocols; set too, so no configuration path can bring h2 back.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

// HTTP1Answers wraps every listener's handler: it answers a request that
// is not HTTP/1.x (net/http hands its handlers the HTTP/2 preface,
// "PRI * HTTP/2.0", for them to take over) with 505 and closes the
// connection, and it puts a write deadline on every answer.
func HTTP1Answers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// No deadline is left over from a keep-alive connection's previous
		// answer: net/http clears the write deadline after every request
		// (conn.serve, go1.26), so a "100 Continue" written while this
		// request reads its body is not cut off by it.
		dw := deadlineWriter{ResponseWriter: w}
		if r.ProtoMajor != 1 {
			dw.Header().Set("Connection", "close")
			Answer(&dw, http.StatusHTTPVersionNotSupported, "this listener speaks HTTP/1.1 only")
			return
		}
		next.ServeHTTP(&dw, r)
		// An answer the handler left to net/http (none does today) is
		// still written under a deadline.
		dw.arm()
	})
}

// deadlineWriter arms the connection's write deadline when the answer
// starts: at its header or first byte, whichever comes first, and not
// before, so the time the handler spends on the broker does not count
// against the client.
type deadlineWriter struct {
	http.ResponseWriter
	armed bool
}

func (w *deadlineWriter) arm() {
	if !w.armed {
		w.armed = true
		w.setDeadline(time.Now().Add(AnswerWriteTimeout))
	}
}

func (w *deadlineWriter) setDeadline(t time.Time) {
	if c := connOf(w.ResponseWriter); c != nil {
		_ = c.SetWriteDeadline(t)
	}
}

func (w *deadlineWriter) WriteHeader(status int) {
	w.arm()
	w.ResponseWriter.WriteHeader(status)
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	w.arm()
	return w.ResponseWriter.Write(b)
}

// WriteString passes a string on as a string: net/http's writer takes it
// without a copy, where io.WriteString through a writer without this
// method would convert it to a new []byte, one allocation per answer.
func (w *deadlineWriter) WriteString(s string) (int, error) {
	w.arm()
	return io.WriteString(w.ResponseWriter, s)
}

// SetWriteDeadline lets a handler whose answer is long (the read-back)
// set a deadline of its own through http.ResponseController; it then
// replaces the default one.
func (w *deadlineWriter) SetWriteDeadline(t time.Time) error {
	w.armed = true
	c := connOf(w.ResponseWriter)
	if c == nil {
		return http.ErrNotSupported
	}
	return c.SetWriteDeadline(t)
}

// connDeadlines sets a request's connection deadlines: net/http's own
// ResponseWriter does.
type connDeadlines interface {
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// connOf finds what sets w's connection deadlines, under any wrapper that
// unwraps, as http.ResponseController finds it; nil for a writer with
// none (a test's recorder). A ResponseController would do the same, but
// it escapes to the heap: one allocation per request, on every request.
func connOf(w http.ResponseWriter) connDeadlines {
	for {
		switch x := w.(type) {
		case connDeadlines:
			return x
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return nil
		}
	}
}

// Unwrap gives http.ResponseController the writer underneath, for the
// read deadlines and flushes handlers ask of it.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// errBodyTooLarge is what readBodyUpTo returns, wrapped
// in a *bodyTooLargeError that names the cap, for a body over the cap.
var errBodyTooLarge = errors.New("body over the size limit")

// bodyTooLargeError says what the cap was, so the answer can tell the
// sender.
type bodyTooLargeError struct{ limit int64 }

func (e *bodyTooLargeError) Error() string { return fmt.Sprintf("body larger than %d bytes", e.limit) }

func (e *bodyTooLargeError) Unwrap() error { return errBodyTooLarge }

// readBodyUpTo reads at most limit bytes of the request body: the cap of
// a single frame or of a batch, which the caller names (BodyBudget.ReadBody
// calls it once the body's room is reserved). A declared length over the cap is
// refused before anything is read; an undeclared one (chunked) is cut off
// at the cap by http.MaxBytesReader, so no more than limit bytes are ever
// buffered.
func readBodyUpTo(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &bodyTooLargeError{limit}
	}
	if r.ContentLength >= 0 {
		// A declared length, the common case: net/http ends the body there,
		// so it is read into one buffer of exactly that size.
		b := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, b); err != nil {
			return nil, fmt.Errorf("read body: %w", err)
		}
		return b, nil
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, &bodyTooLargeError{limit}
	}
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	return b, nil
}

// MaxReasonBytes bounds the reason of a rejection. A reason may quote a
// value from the request (a state, an origin, a field name, the Host), and
// neither the log nor the answer may carry the body.
const MaxReasonBytes = 256

// ClipReason bounds a reason to MaxReasonBytes, on a UTF-8 boundary.
func ClipReason(s string) string {
	if len(s) <= MaxReasonBytes {
		return s
	}
	return strings.ToValidUTF8(s[:MaxReasonBytes], "") + "... (truncated)"
}

// MaxQuotedField bounds a value quoted inside a reason, so the reason keeps
// its ending whatever the request held.
const MaxQuotedField = 96

// ClipField shortens a value from a request for quoting in a reason.
func ClipField(s string) string {
	if len(s) <= MaxQuotedField {
		return s
	}
	return strings.ToValidUTF8(s[:MaxQuotedField], "") + "..."
}

// ClipLogged bounds a value for a log line: it keeps the longest start of
// s that takes at most MaxReasonBytes once the log's text format has
// quoted it, cut on a character boundary and marked as ClipReason marks
// it. ClipReason counts bytes, which is enough for values that cannot hold
// control characters (a request's path or Host); a value decoded from a
// JSON string can, and quoted, a control character takes four bytes
// (\x01): 256 of them clipped by bytes would be a kilobyte of log line.
func ClipLogged(s string) string {
	w := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if w += quotedWidth(r, size); w > MaxReasonBytes {
			return s[:i] + "... (truncated)"
		}
		i += size
	}
	return s
}

// ClipLoggedBytes is ClipLogged for a value held as bytes (a raw JSON id),
// without converting more of it than can be kept: every byte takes at
// least one byte quoted, so no more than MaxReasonBytes+1 of them are
// looked at.
func ClipLoggedBytes(b []byte) string {
	return ClipLogged(string(b[:min(len(b), MaxReasonBytes+1)]))
}

// quotedWidth is how many bytes strconv.Quote, which slog's text handler
// uses, writes for the character r that takes size bytes of a string: at
// least size.
func quotedWidth(r rune, size int) int {
	switch {
	case r == utf8.RuneError && size == 1:
		return 4 // an invalid byte: \xff
	case r == '"' || r == '\\':
		return 2
	case r == '\a' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t' || r == '\v':
		return 2
	case r < ' ' || r == 0x7f:
		return 4 // \x01
	case strconv.IsPrint(r):
		return size
	case r < 0x10000:
		return 6 // \u0085
	default:
		return 10 // \U000e0001
	}
}

// Answer writes a one-line plain-text answer.
func Answer(w http.ResponseWriter, status int, text string) {
	h := w.Header()
	h["Content-Type"] = textPlainUTF8
	h["X-Content-Type-Options"] = noSniff
	w.WriteHeader(status)
	io.WriteString(w, text)
	io.WriteString(w, "\n")
}

// Header values every answer carries, shared rather than allocated per
// answer (Header.Set allocates a slice each time). net/http only reads a
// header's values, and Header.Add appends to a copy (len and cap are 1),
// so no answer can change them.
var (
	textPlainUTF8 = []string{"text/plain; charset=utf-8"}
	noSniff       = []string{"nosniff"}
)

// StatusCode is a status as its decimal text, the label of the responses
// counters; the common one without an allocation.
func StatusCode(status int) string {
	if status == http.StatusOK {
		return "200"
	}
	return strconv.Itoa(status)
}
