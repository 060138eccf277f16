package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// The fuzz targets' seed corpora live in testdata/fuzz/<target>/: the Host
// forms of issue 5. The frame format's targets, with every bypass the
// ingress design names, live beside it (internal/wireframe). .ci/run runs
// each target for a bounded time after the tests.

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

// The targets below hold the ingress's fast paths to the slow ones they
// replace: the member scanner to encoding/json's Decoder, the inline
// spelling check to the map one, and the resync pre-check to a full decode.

// FuzzMayHoldResyncIsConservative: when the pre-check says params cannot
// hold a resync member, encoding/json finds none.
func FuzzMayHoldResyncIsConservative(f *testing.F) {
	for _, s := range []string{`{"resync":true}`, `{"ReSyNc":1}`, `{"reſync":1}`, `{"r\u0065sync":1}`, `{"workloadInfo":{}}`, `{"x":"resync"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var m map[string]json.RawMessage
		if json.Unmarshal(p, &m) != nil || mayHoldResync(p) {
			return
		}
		for k := range m {
			if strings.EqualFold(k, "resync") {
				t.Fatalf("mayHoldResync missed %q in %s", k, p)
			}
		}
	})
}
