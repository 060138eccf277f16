package main

import (
	"net/http"
	"strings"
	"testing"

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
			body := lifecycleFrameJSON(workloadJSON("", tc.member))
			status, reason := postIngress(t, addr, body)
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
	status, reason := postIngress(t, addr, `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-\udc00"}}`)
	if status != http.StatusBadRequest || !strings.Contains(reason, "params.workloadId") {
		t.Fatalf("removal of a lone surrogate id: status %d (%q), want 400 naming params.workloadId", status, reason)
	}
	ifxBrokerBarrier(t, n)
	if got := n.broker.withMethod(wireframe.MethodUpsert); len(got) != 0 {
		t.Fatalf("refused frames reached the broker: %v", got)
	}
	if got := n.broker.withMethod(wireframe.MethodRemove); len(got) != 0 {
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
			`workloadInfo.createdAt must be an integer (epoch milliseconds) (sent as "CreatedAt")`},
		struct{ name, member, reason string }{"a repeat whose second value is bad", `"seq":1,"seq":null`,
			"workloadInfo.seq must be an integer from 0 to 9223372036854775807"},
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, reason := netPostAnswer(t, h.c, h.addr, []byte(lifecycleFrameJSON(workloadJSON(origin, tc.member))))
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
			n.m.handleLine([]byte(lifecycleFrameJSON(workloadJSON(n.id, tc.member))))
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
