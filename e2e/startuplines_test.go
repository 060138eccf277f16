package e2e

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/testkit"
)

// TestStartupLinesNameEveryBoundAddress starts the binary with every
// listener on port 0 and reaches each at the address its startup line
// names (spec 3.8): the stable keys are how a caller learns a port it
// did not pick.
func TestStartupLinesNameEveryBoundAddress(t *testing.T) {
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0", "--metrics", "127.0.0.1:0")
	d.WaitMethod("ready", 1)
	peer := d.loggedValue("started", "peerAddr")
	ingress := d.loggedValue("local ingress listening", "addr")
	metrics := d.loggedValue("metrics endpoint listening", "addr")
	for _, addr := range []string{peer, ingress, metrics} {
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "0" || port == "" {
			t.Fatalf("a startup line gave %q, want a bound HOST:PORT", addr)
		}
	}
	if got := d.loggedValue("started", "nodeId"); got != nodes[0].ID {
		t.Fatalf("started nodeId=%s, want %s", got, nodes[0].ID)
	}
	if !strings.HasSuffix(peer, ":"+itoa(d.port)) {
		t.Fatalf("peerAddr %s does not end in the port startNode read, %d", peer, d.port)
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatalf("metrics at the logged address: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics at the logged address: %d", resp.StatusCode)
	}
	if st, body := testkit.PostIngress(t, ingress, liFrame("startup-lines")); st != http.StatusOK {
		t.Fatalf("a frame to the logged ingress address: %d %s", st, body)
	}
	d.WaitUpserts("startup-lines", 1)
	c, err := net.Dial("tcp", "127.0.0.1:"+itoa(d.port))
	if err != nil {
		t.Fatalf("the logged peer port does not accept: %v", err)
	}
	c.Close()
}
