package statetable

import (
	"encoding/json"
	"strings"
	"testing"
)

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
		if json.Unmarshal(p, &m) != nil || MayHoldResync(p) {
			return
		}
		for k := range m {
			if strings.EqualFold(k, "resync") {
				t.Fatalf("MayHoldResync missed %q in %s", k, p)
			}
		}
	})
}
