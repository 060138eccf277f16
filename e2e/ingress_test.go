package e2e

import (
	"encoding/json"
	"net/http"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// curlFrame is the seed document's producer example, as a producer sends it:
// no originatedFrom, a field of the producer's own in workloadInfo.
const curlFrame = `{
  "jsonrpc": "2.0", "method": "workload:started",
  "params": {"workloadInfo": {"id": "job-42", "runId": "job-42", "seq": 1, "model": "qwen3.5-9b", "engine": "llamacpp",
             "state": "running", "createdAt": 1789661457000, "startedAt": 1789661457000,
             "completedAt": null, "error": null, "requesterId": "my-scheduler", "harnessSlot": 3}}}`

// TestIngressEndToEndAcrossProcesses runs node A with the ingress and node B
// as its pinned peer, both real processes: a producer's frame reaches A's
// broker stamped with A's id and B's broker; a producer's removal likewise;
// and the broker's replay of the removed workload into A never makes B hear
// of it again.
func TestIngressEndToEndAcrossProcesses(t *testing.T) {
	nodes := writeCluster(t, 2)
	a := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0", "--resync-interval", "300ms")
	ingressAddr := a.loggedValue("local ingress listening", "addr")
	b := startNode(t, nodes[1])
	a.WaitMethod("discovery:subscribe", 1)
	b.WaitMethod("discovery:subscribe", 1)
	a.discover(nodes[1], b.port)
	a.waitLog("broadcast targets changed", "total=1")

	if s, _ := testkit.PostIngress(t, ingressAddr, curlFrame); s != http.StatusOK {
		t.Fatalf("curl-shaped post: status %d", s)
	}
	var atA struct{ WorkloadInfo map[string]any }
	if err := json.Unmarshal(a.WaitMethod(wireframe.MethodUpsert, 1)[0].Params, &atA); err != nil {
		t.Fatal(err)
	}
	if atA.WorkloadInfo["originatedFrom"] != nodes[0].ID || atA.WorkloadInfo["harnessSlot"] != 3.0 {
		t.Fatalf("A's broker got %v, want A's id stamped and the producer's field kept", atA.WorkloadInfo)
	}
	b.WaitUpserts("job-42", 1)

	// A live workload entered through A's broker serves as the heartbeat
	// clock below.
	a.send(testframe.LifecycleLine("clock", "running", nodes[0].ID))
	b.WaitUpserts("clock", 1)

	if s, _ := testkit.PostIngress(t, ingressAddr, `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-42"}}`); s != http.StatusOK {
		t.Fatalf("removal: status %d", s)
	}
	for _, d := range []*daemonProc{a, b} {
		var rm struct{ WorkloadID, OriginatedFrom string }
		if err := json.Unmarshal(d.WaitMethod(wireframe.MethodRemove, 1)[0].Params, &rm); err != nil {
			t.Fatal(err)
		}
		if rm.WorkloadID != "job-42" || rm.OriginatedFrom != nodes[0].ID {
			t.Fatalf("removal at a broker = %+v", rm)
		}
	}
	atRemoval := b.UpsertCount("job-42")

	// The broker replays its store, as it does to a restarted daemon; the
	// replay holds the workload the producer removed.
	var replay map[string]any
	if err := json.Unmarshal([]byte(curlFrame), &replay); err != nil {
		t.Fatal(err)
	}
	info := replay["params"].(map[string]any)["workloadInfo"].(map[string]any)
	info["originatedFrom"] = nodes[0].ID
	line, _ := json.Marshal(replay)
	a.send(string(line))

	clock := b.UpsertCount("clock")
	b.WaitUpserts("clock", clock+3) // three heartbeats delivered after the replay
	if got := b.UpsertCount("job-42"); got != atRemoval {
		t.Fatalf("B heard of the removed workload again: %d upserts, %d at its removal", got, atRemoval)
	}
}
