package peerwire

import (
	"net/http"
	"testing"
	"time"
)

func TestParseRetryAfterHonoursSecondsAndDatesWithinTheCapAndIgnoresTheRest(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	for _, c := range []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"2", 2 * time.Second, true},
		{" 7 ", 7 * time.Second, true},
		{"30", 30 * time.Second, true},
		{"31", RetryAfterCap, true},
		{"86400", RetryAfterCap, true},
		{"99999999999999999999999", RetryAfterCap, true}, // too large for any integer: past the cap
		{date(10 * time.Second), 10 * time.Second, true},
		{now.Add(10 * time.Second).Format(time.RFC850), 10 * time.Second, true},
		{now.Add(10 * time.Second).Format(time.ANSIC), 10 * time.Second, true},
		{date(time.Hour), RetryAfterCap, true},
		// Asking for no wait: the answer is a failed attempt, as before.
		{"0", 0, false},
		{"000", 0, false},
		{date(0), 0, false},
		{date(-time.Hour), 0, false},
		// Not a Retry-After: ignored, the sender's own backoff applies.
		{"", 0, false},
		{"-1", 0, false},
		{"+2", 0, false},
		{"1.5", 0, false},
		{"2s", 0, false},
		{"soon", 0, false},
		{"Thu, 03 Dec 2026 10:00:10", 0, false},
	} {
		got, ok := ParseRetryAfter(c.value, now)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", c.value, got, ok, c.want, c.ok)
		}
	}
	// A date less than a second away waits the header's resolution.
	if got, ok := ParseRetryAfter(date(0), now.Add(-300*time.Millisecond)); !ok || got != time.Second {
		t.Errorf("a date 300 ms away = %v, %v; want 1s, true", got, ok)
	}
}
