package httpguard

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// The longest a clipped value can be once quoted in a log line: the bound,
// the truncation mark and the two quotes.
const maxQuotedLogged = MaxReasonBytes + len("... (truncated)") + 2

func TestClipLoggedKeepsAValueWithinTheBoundOnceQuoted(t *testing.T) {
	for name, s := range map[string]string{
		"letters":       strings.Repeat("A", 900_000),
		"controls":      strings.Repeat("\x01", 900_000),
		"quotes":        strings.Repeat(`"\`, 450_000),
		"C1 controls":   strings.Repeat("\u0085", 450_000),
		"invalid bytes": strings.Repeat("\xff", 900_000),
		"tags":          strings.Repeat("\U000e0001", 225_000),
		"mixed":         strings.Repeat("é\x01€\"\U0001F600\xfe\t", 60_000),
	} {
		clipped := ClipLogged(s)
		if q := strconv.Quote(clipped); len(q) > maxQuotedLogged {
			t.Errorf("%s: quoted, the clipped value is %d bytes, over %d", name, len(q), maxQuotedLogged)
		}
		if !strings.HasSuffix(clipped, "... (truncated)") || !strings.HasPrefix(s, strings.TrimSuffix(clipped, "... (truncated)")) {
			t.Errorf("%s: clipped to %.40q..., want a start of the value and the truncation mark", name, clipped)
		}
		if got := ClipLoggedBytes([]byte(s)); got != clipped {
			t.Errorf("%s: ClipLoggedBytes %.40q..., want what ClipLogged gives", name, got)
		}
	}
	for _, s := range []string{"", "log/set-level", `"an id"`, strings.Repeat("x", MaxReasonBytes), strings.Repeat("\x01", MaxReasonBytes/4)} {
		if got := ClipLogged(s); got != s {
			t.Errorf("a value within the bound was changed: %q -> %q", s, got)
		}
	}
}

// stringWriter is a ResponseWriter that takes strings as net/http's does,
// with its header map made already, so that what an answer allocates is
// the answer's own.
type stringWriter struct {
	h       http.Header
	written int
}

func (w *stringWriter) Header() http.Header         { return w.h }
func (w *stringWriter) WriteHeader(int)             {}
func (w *stringWriter) Write(b []byte) (int, error) { w.written += len(b); return len(b), nil }
func (w *stringWriter) WriteString(s string) (int, error) {
	w.written += len(s)
	return len(s), nil
}

// An answer written through the deadline writer every listener wraps its
// handler's writer in passes its text on as a string: without its own
// WriteString the text was copied to a new []byte, once an answer.
func TestAnAnswerThroughTheDeadlineWriterAllocatesNothing(t *testing.T) {
	w := &stringWriter{h: http.Header{"Content-Type": nil, "X-Content-Type-Options": nil}}
	dw := &deadlineWriter{ResponseWriter: w}
	reason := strings.Repeat("r", 40)
	if n := testing.AllocsPerRun(100, func() { Answer(dw, http.StatusOK, reason) }); n != 0 {
		t.Fatalf("an answer allocates %.1f times, want 0", n)
	}
	if want := 101 * (len(reason) + 1); w.written != want {
		t.Fatalf("%d bytes written, want %d", w.written, want)
	}
}
