package peerwire

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryAfterCap is the longest wait a peer's Retry-After can impose.
// A peer asking for more is tried again after this: a wait is advice from
// a peer that may recover sooner, and 30 s is the default heartbeat
// interval, by which a pass would have been due anyway.
const RetryAfterCap = 30 * time.Second

// ParseRetryAfter reads a Retry-After value (RFC 9110, 10.2.3): whole
// seconds, or an HTTP-date. It returns the wait asked for, at least 1 s (a
// date less than a second away; the header's resolution is a second) and
// at most RetryAfterCap, and false for a value that asks for no wait
// (0, a date not in the future) or is not one (a sign, a fraction, text):
// such an answer is a failed attempt with the sender's own backoff, as it
// always was.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" {
		n, err := strconv.ParseUint(v, 10, 64)
		switch {
		case err != nil: // all digits: only too large to hold, past the cap
			return RetryAfterCap, true
		case n == 0:
			return 0, false
		case n >= uint64(RetryAfterCap/time.Second):
			return RetryAfterCap, true
		}
		return time.Duration(n) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := at.Sub(now)
	if d <= 0 {
		return 0, false
	}
	return min(max(d, time.Second), RetryAfterCap), true
}

// RetryAfterOf is the wait an answer asks for, or 0 when it asks for none
// that the sender honours: only a 503 or a 429 with a valid Retry-After.
func RetryAfterOf(resp *http.Response) time.Duration {
	if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusTooManyRequests {
		return 0
	}
	d, ok := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	if !ok {
		return 0
	}
	return d
}
