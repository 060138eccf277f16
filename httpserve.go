package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Timeouts shared by the daemon's HTTP servers. There is deliberately no
// write timeout: net/http's write deadline covers the whole handler, broker
// write included, so a slow broker would make the server drop the response
// after the frame had already landed, and the sender would retry a frame
// that was accepted.
const (
	serverReadHeaderTimeout = 5 * time.Second
	serverReadTimeout       = 10 * time.Second
)

// newHTTPServer returns a server with the daemon's timeouts whose internal
// errors (failed handshakes, malformed requests) go to the log at debug.
func newHTTPServer(h http.Handler, idle time.Duration, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: serverReadHeaderTimeout,
		ReadTimeout:       serverReadTimeout,
		IdleTimeout:       idle,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

// errBodyTooLarge is what readCappedBody and readBodyUpTo return, wrapped
// in a *bodyTooLargeError that names the cap, for a body over the cap.
var errBodyTooLarge = errors.New("body over the size limit")

// bodyTooLargeError says what the cap was, so the answer can tell the
// sender.
type bodyTooLargeError struct{ limit int64 }

func (e *bodyTooLargeError) Error() string { return fmt.Sprintf("body larger than %d bytes", e.limit) }

func (e *bodyTooLargeError) Unwrap() error { return errBodyTooLarge }

// readCappedBody reads at most maxFrameBytes of the request body, the cap on
// a single frame. A body over the cap is errBodyTooLarge, whether or not it
// declared its length.
func readCappedBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	return readBodyUpTo(w, r, maxFrameBytes)
}

// readBodyUpTo is readCappedBody with the cap given: the peer port's batches
// have their own (peerBatchMaxBytes). A declared length over the cap is
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

// maxReasonBytes bounds the reason of a rejection. A reason may quote a
// value from the request (a state, an origin, a field name, the Host), and
// neither the log nor the answer may carry the body.
const maxReasonBytes = 256

// clipReason bounds a reason to maxReasonBytes, on a UTF-8 boundary.
func clipReason(s string) string {
	if len(s) <= maxReasonBytes {
		return s
	}
	return strings.ToValidUTF8(s[:maxReasonBytes], "") + "... (truncated)"
}

// answer writes a one-line plain-text answer.
func answer(w http.ResponseWriter, status int, text string) {
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

// statusCode is a status as its decimal text, the label of the responses
// counters; the common one without an allocation.
func statusCode(status int) string {
	if status == http.StatusOK {
		return "200"
	}
	return strconv.Itoa(status)
}
