package brokerio

import (
	"encoding/json"
	"testing"
)

// The ingress mark is the workload object's last member on the broker's
// line, on one line whatever line breaks the object came with, and the
// object is otherwise the one UpsertLine writes.
func TestUpsertLineWithAddsTheMemberLastOnOneLine(t *testing.T) {
	const member = `"wlmIngress":"30.x"`
	for _, tc := range []struct{ name, info, want string }{
		{"compact", `{"id":"j","state":"running"}`, `{"id":"j","state":"running","wlmIngress":"30.x"}`},
		{"line breaks", "{\n  \"id\": \"j\",\n  \"state\": \"running\"\n}", `{"id":"j","state":"running","wlmIngress":"30.x"}`},
		{"empty", `{}`, `{"wlmIngress":"30.x"}`},
	} {
		b := UpsertLineWith(json.RawMessage(tc.info), []byte(member))
		line := b.String()
		PutLine(b)
		plain := UpsertLine(json.RawMessage(tc.want))
		want := plain.String()
		PutLine(plain)
		if line != want || !json.Valid([]byte(line[:len(line)-1])) {
			t.Errorf("%s: %q, want %q", tc.name, line, want)
		}
	}
}
