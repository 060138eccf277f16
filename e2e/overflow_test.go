package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// overflowBurstDeadline bounds how long a burst that overflowed a peer's
// queue may take to reach it in its final state. It is generous for a
// loaded CI machine (the burst takes some 4 s here) and far below the
// --resync-interval of the test, an hour, so only the overflow recovery
// can be what delivers it: the periodic pass never runs.
const overflowBurstDeadline = 60 * time.Second

func TestProcessBurstToASingleFramePeerReachesItInItsFinalState(t *testing.T) {
	// A stand-in for a stock peer: real TLS, pinned by the daemon, one
	// frame per request, as fast as it can take them.
	nodes := writeCluster(t, 1)
	sink := testkit.NewHBSink(t, false, 0)
	testkit.Must(t, devpki.PinIdentity(nodes[0].ClusterDir, sink.Ident))
	d := startNode(t, nodes[0], "--resync-interval", "1h")
	d.WaitMethod("discovery:subscribe", 1)
	snapshot, err := json.Marshal(map[string]any{"nodes": []map[string]any{testkit.AddrEntry(sink.ID, sink.Ident.Principal, sink.Addr)}})
	testkit.Must(t, err)
	d.send(string(wireframe.EncodeNotification("discovery:nodes", snapshot)))
	d.waitLog("broadcast targets changed", "total=1")

	// 3,000 workloads entered at once, as a broker's replay after a
	// restart or a burst of jobs: each queued, then running; every third
	// then completed, every tenth then removed. One write, 7,300 lines.
	const workloads = 3000
	origin := nodes[0].ID
	want := make(map[string]string, workloads)
	id := func(i int) string { return fmt.Sprintf("burst-%04d", i) }
	var burst bytes.Buffer
	frames := 0
	add := func(line string) { burst.WriteString(line); burst.WriteByte('\n'); frames++ }
	for _, state := range []string{"queued", "running"} {
		for i := range workloads {
			add(testframe.LifecycleLine(id(i), state, origin))
			want[id(i)] = state
		}
	}
	for i := 0; i < workloads; i += 3 {
		add(testframe.LifecycleLine(id(i), "completed", origin))
		want[id(i)] = "completed"
	}
	for i := 0; i < workloads; i += 10 {
		add(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"` + id(i) + `","originatedFrom":"` + origin + `"}}`)
		want[id(i)] = "removed"
	}
	notFinal := func() (n int, example string) {
		for i := range workloads {
			if got := sink.FinalState(id(i)); got != want[id(i)] {
				if n == 0 {
					example = fmt.Sprintf("%s is %q, want %q", id(i), got, want[id(i)])
				}
				n++
			}
		}
		return n, example
	}

	start := time.Now()
	if _, err := d.stdin.Write(burst.Bytes()); err != nil {
		t.Fatal(err)
	}
	reached := testkit.HoldsWithin(overflowBurstDeadline, func() bool { n, _ := notFinal(); return n == 0 })
	took := time.Since(start)
	events := sink.Snapshot()
	recoveredStates := sink.Count("resync", "")
	t.Logf("%d workloads, %d frames in one write: %d requests at the peer (%d re-assertions); final states reached in %v",
		workloads, frames, len(events), recoveredStates, took.Round(10*time.Millisecond))
	if !reached || testing.Verbose() {
		for _, l := range strings.Split(d.stderr.String(), "\n") {
			if strings.Contains(l, "overflow") || strings.Contains(l, "queue full") {
				t.Log(l)
			}
		}
	}
	if !reached {
		n, example := notFinal()
		t.Fatalf("%d of %d workloads not in their final state at the peer %v after the burst (%s): overflow was lost, not recovered",
			n, workloads, overflowBurstDeadline, example)
	}
}
