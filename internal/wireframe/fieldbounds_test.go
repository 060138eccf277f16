package wireframe

import (
	"encoding/json"
	"testing"
)

// The bound is on the decoded value, counted on the raw text without
// decoding: the count must be what encoding/json decodes, for every escape.
func TestDecodedJSONStringLenIsTheLengthEncodingJSONDecodes(t *testing.T) {
	for _, q := range []string{
		`""`, `"abc"`, `"é€🚀"`, `"\u00e9"`, `"\u20ac"`, `"\ud83d\ude80"`, `"\u0000"`, `"\u007f\u0080\u07ff\u0800\uffff"`,
		`"\"\\\/\b\f\n\r\t"`, `"a\u00e9\/b"`, `"\ud7ff\ue000"`, `"x\\u00e9"`, `"\\\\"`,
	} {
		var s string
		if err := json.Unmarshal([]byte(q), &s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if got := decodedJSONStringLen([]byte(q)); got != len(s) {
			t.Errorf("decodedJSONStringLen(%s) = %d, want %d", q, got, len(s))
		}
	}
}

// A peer's params may repeat a field in another spelling: the token kept is
// the member encoding/json decodes, so the removal the broker gets and the
// workload the daemon untracks are one and the same.
func TestRemovalKeepsTheTokenOfTheMemberEncodingJSONDecodes(t *testing.T) {
	for _, params := range []string{
		`{"workloadId":"first","WorkloadID":"a\u00e9","originatedFrom":"node-a"}`,
		`{"WORKLOADID":"first","workloadId":"a\u00e9","ORIGINATEDFROM":"x","originatedFrom":"node-a"}`,
		`{"originatedfrom":"node-a","workloadid":"a\u00e9"}`,
	} {
		var dec struct {
			WorkloadID     string `json:"workloadId"`
			OriginatedFrom string `json:"originatedFrom"`
		}
		if err := json.Unmarshal([]byte(params), &dec); err != nil {
			t.Fatal(err)
		}
		r, err := ParseRemove(json.RawMessage(params))
		if err != nil {
			t.Fatalf("%s: %v", params, err)
		}
		if r.Ref != (WorkloadRef{dec.OriginatedFrom, dec.WorkloadID}) || string(r.idToken) != `"a\u00e9"` || string(r.originToken) != `"node-a"` {
			t.Fatalf("%s: ref %+v, tokens %s %s; encoding/json decodes %+v", params, r.Ref, r.idToken, r.originToken, dec)
		}
	}
}
