package httpguard

import (
	"regexp"
	"strings"
	"testing"
)

// The fuzz target's seed corpus lives in testdata/fuzz/FuzzHostCheck: the
// Host forms of issue 5. .ci/run runs it for a bounded time after the
// tests.

// canonicalLoopbackHost is the accepted Host set written independently of
// hostAllowed: localhost in any case, a canonical 127/8 dotted quad, or
// [::1], each with the bound port.
var canonicalLoopbackHost = regexp.MustCompile(`^[lL][oO][cC][aA][lL][hH][oO][sS][tT]$|^127\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$|^\[::1\]$`)

// FuzzHostCheck: hostAllowed never accepts a Host outside the canonical set.
func FuzzHostCheck(f *testing.F) {
	const port = "14324"
	f.Fuzz(func(t *testing.T, host string) {
		got := hostAllowed(host, port)
		name, hasPort := strings.CutSuffix(host, ":"+port)
		want := hasPort && canonicalLoopbackHost.MatchString(name)
		if got != want {
			t.Fatalf("hostAllowed(%q) = %v, want %v", host, got, want)
		}
	})
}
