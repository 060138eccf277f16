package wireframe

import (
	"encoding/json"
	"strings"
	"testing"
)

// A producer may not send the ingress mark, in any spelling: its value
// would reach the broker beside the daemon's, and the peers without it.
func TestTheIngressRefusesAWorkloadWithTheIngressMarksName(t *testing.T) {
	for _, name := range []string{IngressMarkName, "WLMINGRESS", "wlmingress", "wlmIngreſs", `wlm\u0049ngress`} {
		body := `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","model":"m","engine":"e","state":"running","` + name + `":"5.x"}}}`
		_, err := ParseIngress([]byte(body), benchNodeID, DefaultWorkloadMaxBytes)
		if err == nil || !strings.Contains(err.Error(), "reserved for the mark the daemon adds for its broker") {
			t.Errorf("a workload with %q: %v, want the mark's refusal", name, err)
		}
	}
	// Beside the workload object the name means nothing to the broker.
	body := `{"jsonrpc":"2.0","method":"workload:started","params":{"wlmIngress":1,"workloadInfo":{"id":"j","model":"m","engine":"e","state":"running"}}}`
	if _, err := ParseIngress([]byte(body), benchNodeID, DefaultWorkloadMaxBytes); err != nil {
		t.Fatalf("the name beside the workload object: %v", err)
	}
}

func scanned(t *testing.T, frame string) *Scan {
	t.Helper()
	var s Scan
	if err := s.ScanFrame([]byte(frame)); err != nil {
		t.Fatal(err)
	}
	return &s
}

// The mark is cut out of the broker's frame wherever it stands, every
// other member kept byte for byte, and only a member spelt exactly so.
func TestTheIngressMarkIsCutOutOfABrokerFrameAndNothingElse(t *testing.T) {
	const mark = `"wlmIngress":"30.AAAAAAAAAAAAAAAAAAAAAA"`
	frame := func(info string) string {
		return `{"jsonrpc":"2.0","method":"workload:started","params":{"note":{"a":[1]},"workloadInfo":` + info + `,"trace":"t"}}`
	}
	for _, tc := range []struct{ name, info, want string }{
		{"last", `{"id":"j","state":"running",` + mark + `}`, `{"id":"j","state":"running"}`},
		{"first", `{` + mark + `,"id":"j","state":"running"}`, `{"id":"j","state":"running"}`},
		{"between", `{"id":"j",` + mark + `,"state":"running"}`, `{"id":"j","state":"running"}`},
		{"alone", `{` + mark + `}`, `{}`},
		{"twice", `{` + mark + `,"id":"j",` + mark + `}`, `{"id":"j"}`},
		{"escaped name", `{"id":"j","wlm\u0049ngress":"5.x"}`, `{"id":"j"}`},
		{"values kept as they came", `{"id":"j\u00e9","n":1.50,` + mark + `}`, `{"id":"j\u00e9","n":1.50}`},
	} {
		s := scanned(t, frame(tc.info))
		if _, n := s.InfoMember(IngressMarkName); n == 0 {
			t.Fatalf("%s: the mark was not found", tc.name)
		}
		got := string(s.ParamsWithoutInfoMember(IngressMarkName))
		if want := `{"note":{"a":[1]},"workloadInfo":` + tc.want + `,"trace":"t"}`; got != want {
			t.Errorf("%s: params %s, want %s", tc.name, got, want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("%s: %s is not JSON", tc.name, got)
		}
	}
	// Another spelling is not the daemon's: it stays, as any member of a
	// broker frame does.
	s := scanned(t, frame(`{"id":"j","WLMIngress":"30.x"}`))
	if _, n := s.InfoMember(IngressMarkName); n != 0 {
		t.Fatal("a case variant was taken for the mark")
	}
	if got, want := string(s.ParamsWithoutInfoMember(IngressMarkName)), `{"note":{"a":[1]},"workloadInfo":{"id":"j","WLMIngress":"30.x"},"trace":"t"}`; got != want {
		t.Fatalf("params %s, want them as they came %s", got, want)
	}
}

func TestInfoMemberCountsTheMarksAndReturnsTheFirst(t *testing.T) {
	s := scanned(t, `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"wlmIngress":"1.a","id":"j","wlmIngress":"2.b"}}}`)
	if v, n := s.InfoMember(IngressMarkName); n != 2 || string(v) != `"1.a"` {
		t.Fatalf("InfoMember = %s, %d", v, n)
	}
	s = scanned(t, `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"j"}}`)
	if _, n := s.InfoMember(IngressMarkName); n != 0 {
		t.Fatal("a removal has a mark")
	}
}
