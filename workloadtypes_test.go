package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// --- every path ----------------------------------------------------------------

func TestIngressRefusesMembersTheBrokerCannotDecode(t *testing.T) {
	n, q := ifxNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	addr := n.m.IngressAddr()
	for _, tc := range typeViolations {
		t.Run(tc.name, func(t *testing.T) {
			tracked := ifxTrackedCount(n)
			body := testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", "", tc.member))
			status, reason := testkit.PostIngress(t, addr, body)
			if status != http.StatusBadRequest || !strings.Contains(reason, tc.reason) {
				t.Errorf("status %d (%q), want 400 naming %q", status, reason, tc.reason)
			}
			if got := ifxTrackedCount(n); got != tracked {
				t.Errorf("the re-sync set went from %d to %d entries, want no change", tracked, got)
			}
			if got := ifxDrain(q); len(got) != 0 {
				t.Errorf("queued for peers: %s", ifxDescribe(got))
			}
		})
	}
	// A removal is held to the same rule: its workloadId is a string the
	// broker can decode.
	status, reason := testkit.PostIngress(t, addr, `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-\udc00"}}`)
	if status != http.StatusBadRequest || !strings.Contains(reason, "params.workloadId") {
		t.Fatalf("removal of a lone surrogate id: status %d (%q), want 400 naming params.workloadId", status, reason)
	}
	ifxBrokerBarrier(t, n)
	if got := n.broker.WithMethod(wireframe.MethodUpsert); len(got) != 0 {
		t.Fatalf("refused frames reached the broker: %v", got)
	}
	if got := n.broker.WithMethod(wireframe.MethodRemove); len(got) != 0 {
		t.Fatalf("a refused removal reached the broker: %v", got)
	}
}

func TestPeerServerRefusesMembersTheBrokerCannotDecode(t *testing.T) {
	h := newNetPeerHarness(t)
	origin := h.client.Principal
	cases := append(typeViolations[:len(typeViolations):len(typeViolations)],
		// The ingress refuses these spellings outright; from a peer they
		// are read as encoding/json reads them, and typed all the same.
		struct{ name, member, reason string }{"a case variant", `"CreatedAt":"x"`,
			`workloadInfo.createdAt must be an integer (epoch milliseconds) or null (sent as "CreatedAt")`},
		struct{ name, member, reason string }{"a repeat whose second value is bad", `"seq":1,"seq":"x"`,
			"workloadInfo.seq must be an integer from 0 to 9223372036854775807"},
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, reason := netPostAnswer(t, h.c, h.addr, []byte(testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", origin, tc.member))))
			if status != http.StatusBadRequest || !strings.Contains(reason, tc.reason) {
				t.Fatalf("status %d (%q), want 400 naming %q", status, reason, tc.reason)
			}
		})
	}
	h.barrier(t)
	if ids := netUpsertIDs(h.n); len(ids) != h.barriers {
		t.Fatalf("refused frames reached the broker: %v", ids)
	}
}

func TestBrokerFramesTheBrokerCannotDecodeAreNotBroadcast(t *testing.T) {
	n, q := ifxNode(t)
	for _, tc := range typeViolations {
		t.Run(tc.name, func(t *testing.T) {
			logged, tracked := len(n.logs.String()), ifxTrackedCount(n)
			n.m.handleLine([]byte(testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", n.id, tc.member))))
			if got := ifxDrain(q); len(got) != 0 {
				t.Errorf("queued for peers: %s", ifxDescribe(got))
			}
			if got := ifxTrackedCount(n); got != tracked {
				t.Errorf("the re-sync set went from %d to %d entries, want no change", tracked, got)
			}
			// The first bad broker line of a kind is a warning; the limiter
			// holds back the next ones, which this node, at debug, still
			// writes at debug (spec 3.1).
			line := n.logs.String()[logged:]
			if !strings.Contains(line, "level=WARN") && !strings.Contains(line, "level=DEBUG") || !strings.Contains(line, tc.reason) {
				t.Fatalf("no line naming %q; logged:\n%s", tc.reason, line)
			}
		})
	}
}

// What the ingress refuses by its own rules (issue 21), the peer port and
// the broker's channel take as the stock peers do, and relay as it came: a
// null createdAt or seq (Go int64 fields upstream, which a null leaves at
// 0), a method its state does not agree with, a time in seconds.
var ingressOnlyRules = []struct{ name, frame, reason string }{
	{"createdAt null", testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", "", `"createdAt":null`)),
		"workloadInfo.createdAt must be an integer (epoch milliseconds); the ingress takes no null"},
	{"seq null", testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", "", `"createdAt":1789661457000`, `"seq":null`)),
		"workloadInfo.seq must be an integer from 0 to 9223372036854775807; the ingress takes no null"},
	{"workload:started carrying completed", testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", "", `"state":"completed"`)),
		`workloadInfo.state "completed" does not agree with method workload:started, which carries state running`},
	{"createdAt in seconds", testframe.LifecycleJSON(wireframe.MethodStarted, testframe.WorkloadJSON("job-1", "running", "", `"createdAt":1789661457`)),
		"workloadInfo.createdAt is 1789661457, below 1000000000000: it looks like seconds; send epoch milliseconds"},
}

func TestIngressRefusesWhatOnlyItsOwnRulesForbidAndThePeerPortAndStdinRelayItAsItCame(t *testing.T) {
	n, q := ifxNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	addr := n.m.IngressAddr()
	for i, tc := range ingressOnlyRules {
		t.Run("ingress "+tc.name, func(t *testing.T) {
			status, reason := testkit.PostIngress(t, addr, tc.frame)
			if status != http.StatusBadRequest || !strings.Contains(reason, tc.reason) {
				t.Fatalf("status %d (%q), want 400 naming %q", status, reason, tc.reason)
			}
			if got := ifxDrain(q); len(got) != 0 {
				t.Fatalf("queued for peers: %s", ifxDescribe(got))
			}
		})
		t.Run("stdin "+tc.name, func(t *testing.T) {
			// The broker stamps the origin on this channel. Each case is a
			// workload of its own: a terminal case's end would make a later
			// live frame of the same run stale, and a stale frame is sent to
			// no peer.
			line := strings.Replace(tc.frame, `"state":`, `"originatedFrom":"`+n.id+`","state":`, 1)
			line = strings.Replace(line, `"id":"job-1"`, `"id":"stdin-job-`+itoa(i)+`"`, 1)
			n.m.handleLine([]byte(line))
			got := ifxDrain(q)
			if len(got) != 1 || !strings.Contains(string(got[0].line), workloadParamsOf(t, line)) {
				t.Fatalf("queued for peers: %s, want the frame's params as they came", ifxDescribe(got))
			}
		})
	}
	h := newNetPeerHarness(t)
	for i, tc := range ingressOnlyRules {
		t.Run("peer port "+tc.name, func(t *testing.T) {
			frame := strings.Replace(tc.frame, `"id":"job-1"`, `"id":"job-`+itoa(i)+`","originatedFrom":"`+h.client.Principal+`"`, 1)
			if st, text := netPostAnswer(t, h.c, h.addr, []byte(frame)); st != http.StatusOK {
				t.Fatalf("POST = %d %q, want 200", st, text)
			}
		})
	}
	h.barrier(t)
	ups := h.n.broker.WithMethod(wireframe.MethodUpsert)
	for i, tc := range ingressOnlyRules {
		frame := strings.Replace(tc.frame, `"id":"job-1"`, `"id":"job-`+itoa(i)+`","originatedFrom":"`+h.client.Principal+`"`, 1)
		want := `{"workloadInfo":` + workloadObjectText(t, frame) + `}`
		if i >= len(ups) || string(ups[i].Params) != want {
			t.Fatalf("%s: the broker got %v, want params %s byte for byte", tc.name, ups, want)
		}
	}
}

// workloadParamsOf returns a lifecycle frame's params text as it stands.
func workloadParamsOf(t *testing.T, frame string) string {
	t.Helper()
	var f struct{ Params json.RawMessage }
	if err := json.Unmarshal([]byte(frame), &f); err != nil {
		t.Fatal(err)
	}
	return string(f.Params)
}

// workloadObjectText returns a lifecycle frame's workloadInfo text as it stands.
func workloadObjectText(t *testing.T, frame string) string {
	t.Helper()
	var f struct {
		Params struct{ WorkloadInfo json.RawMessage }
	}
	if err := json.Unmarshal([]byte(frame), &f); err != nil {
		t.Fatal(err)
	}
	return string(f.Params.WorkloadInfo)
}
