package httpguard

import (
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
