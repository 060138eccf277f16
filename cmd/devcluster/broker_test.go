package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// daemonEnd plays the daemon's stdin: it records every frame the broker
// writes to it.
type daemonEnd struct {
	w      *io.PipeWriter // given to the broker as the daemon's stdin
	mu     sync.Mutex
	frames []recorded
	done   chan struct{}
}

type recorded struct {
	Method string          `json:"method"`
	ID     json.RawMessage `json:"id"`
	Params json.RawMessage `json:"params"`
	Error  *struct {
		Code int `json:"code"`
	} `json:"error"`
	line string
}

func newDaemonEnd(t *testing.T) *daemonEnd {
	r, w := io.Pipe()
	d := &daemonEnd{w: w, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			var f recorded
			if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
				t.Errorf("the broker wrote a line that is not JSON: %q", sc.Text())
				continue
			}
			f.line = sc.Text()
			d.mu.Lock()
			d.frames = append(d.frames, f)
			d.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Close(); r.Close() })
	return d
}

func (d *daemonEnd) got() []recorded {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]recorded(nil), d.frames...)
}

func (d *daemonEnd) methods() []string {
	var out []string
	for _, f := range d.got() {
		out = append(out, f.Method)
	}
	return out
}

// info renders a workload object with a field the broker does not know, to
// check it is carried as it came. It carries no seq, so the state rank
// orders two events of one job (pairbroker's merge).
func info(origin, id, state string, createdAt int64) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"id":%q,"model":"m","engine":"e","state":%q,"originatedFrom":%q,"createdAt":%d,"x-extra":{"kept":true}}`,
		id, state, origin, createdAt))
}

func upsertLine(i json.RawMessage) []byte {
	return []byte(`{"jsonrpc":"2.0","method":"workloads:upsert","params":{"workloadInfo":` + string(i) + `}}`)
}

const (
	self  = "11111111-1111-4111-8111-111111111111"
	other = "22222222-2222-4222-8222-222222222222"
)

// A (re)started daemon gets the replay as soon as it starts, before its
// ready, as PAIR's broker rehydrates a restarted workload manager; the
// discovery snapshot follows its discovery:subscribe.
func TestBrokerReplaysItsOwnOriginWorkloadsBeforeTheDaemonIsReady(t *testing.T) {
	b := newBroker(self, "node1", 0)
	// Its store holds: a local job, an ingress job (an upsert from its own
	// daemon), a failed one, and a peer's job, which it must not replay.
	if err := b.local("workload:submitted", info(self, "local-q", "queued", 300)); err != nil {
		t.Fatal(err)
	}
	b.handle(upsertLine(info(self, "ingress-done", "completed", 100)), nil, nil)
	b.handle(upsertLine(info(self, "local-failed", "failed", 200)), nil, nil)
	b.handle(upsertLine(info(other, "peer-run", "running", 50)), nil, nil)

	d := newDaemonEnd(t)
	n, err := b.attach(d.w)
	if err != nil || n != 3 {
		t.Fatalf("attach = %d, %v; want 3 replayed", n, err)
	}
	eventually(t, "3 frames at the daemon", func() bool { return len(d.got()) == 3 })
	want := []struct{ method, id, state string }{
		{"workload:completed", "ingress-done", "completed"},
		{"workload:errored", "local-failed", "failed"},
		{"workload:submitted", "local-q", "queued"},
	}
	got := d.got()
	for i, w := range want {
		f := got[i]
		var p struct{ WorkloadInfo json.RawMessage }
		json.Unmarshal(f.Params, &p)
		if f.Method != w.method || string(p.WorkloadInfo) != string(info(self, w.id, w.state, map[string]int64{"ingress-done": 100, "local-failed": 200, "local-q": 300}[w.id])) {
			t.Errorf("replay frame %d = %s %s, want %s with the workload object as stored", i, f.Method, p.WorkloadInfo, w.method)
		}
	}
	snap := json.RawMessage(`{"nodes":[]}`)
	b.discovery(snap) // not subscribed yet: not written
	if err := b.subscribed(snap); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the discovery snapshot", func() bool { return len(d.got()) == 4 })
	if f := d.got()[3]; f.Method != "discovery:nodes" || string(f.Params) != string(snap) {
		t.Errorf("frame after the replay %s %s, want the snapshot once, on the subscription", f.Method, f.Params)
	}
}

func TestBrokerSendsLocalFramesAfterTheReplayAndInOrder(t *testing.T) {
	b := newBroker(self, "node1", 0)
	// Before a daemon is attached, a local frame goes to the store only;
	// the replay carries it.
	if err := b.local("workload:started", info(self, "early", "running", 1)); err != nil {
		t.Fatal(err)
	}
	d := newDaemonEnd(t)
	if _, err := b.attach(d.w); err != nil {
		t.Fatal(err)
	}
	if err := b.local("workload:completed", info(self, "early", "completed", 1)); err != nil {
		t.Fatal(err)
	}
	b.localRemove("early")
	eventually(t, "3 frames", func() bool { return len(d.got()) == 3 })
	want := "workload:started workload:completed workloads:remove"
	if got := strings.Join(d.methods(), " "); got != want {
		t.Fatalf("frames %q, want %q (replay first, then each local frame once)", got, want)
	}
	var rm map[string]string
	json.Unmarshal(d.got()[2].Params, &rm)
	if rm["workloadId"] != "early" || rm["originatedFrom"] != self {
		t.Errorf("removal params %v, want workloadId and originatedFrom set", rm)
	}
	if _, ok := b.get(self, "early"); ok {
		t.Error("the removed job is still in the store")
	}

	// Detached (the daemon died): local frames still change the store.
	b.detach()
	if err := b.local("workload:submitted", info(self, "while-down", "queued", 2)); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.get(self, "while-down"); !ok {
		t.Error("a local frame while no daemon runs did not reach the store")
	}
}

func TestBrokerRefusesALocalFrameOfAnotherOrigin(t *testing.T) {
	b := newBroker(self, "node1", 0)
	if err := b.local("workload:started", info(other, "x", "running", 1)); err == nil {
		t.Fatal("a local frame naming another node was accepted")
	}
	if len(b.snapshot()) != 0 {
		t.Error("the refused frame reached the store")
	}
}

func TestBrokerStoreFollowsTheDaemonsUpsertsAndRemovals(t *testing.T) {
	b := newBroker(self, "node1", 0)
	lines := []string{
		string(upsertLine(info(other, "job-1", "queued", 1))),
		string(upsertLine(info(self, "job-1", "running", 1))), // same id, other origin: another job
		string(upsertLine(info(other, "job-1", "running", 1))),
		`not json`,
		`{"jsonrpc":"2.0","method":"workloads:upsert","params":{"workloadInfo":{"id":"no-origin","state":"queued"}}}`,
		`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-1","originatedFrom":"` + self + `"}}`,
		`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"unknown","originatedFrom":"` + other + `"}}`,
		`{"jsonrpc":"2.0","method":"ready","params":{"version":"v","nodeId":"` + self + `"}}`,
		`{"jsonrpc":"2.0","method":"discovery:subscribe","params":{"services":["wl"]}}`,
	}
	var ready string
	subscribed := 0
	err := b.serve(strings.NewReader(strings.Join(lines, "\n")+"\n"),
		func(id string) { ready = id }, func() { subscribed++ })
	if err != nil {
		t.Fatal(err)
	}
	js := b.snapshot()
	if len(js) != 1 || js[0].Origin != other || js[0].ID != "job-1" || js[0].State != "running" {
		t.Fatalf("store %+v, want only %s/job-1 running", js, other)
	}
	if ready != self || subscribed != 1 {
		t.Errorf("ready %q subscribed %d, want %q and 1", ready, subscribed, self)
	}
}

func TestBrokerAnswersOnlyRequestsItDoesNotServe(t *testing.T) {
	b := newBroker(self, "node1", 0)
	d := newDaemonEnd(t)
	b.attach(d.w)
	b.handle([]byte(`{"jsonrpc":"2.0","method":"some/notification","params":{}}`), nil, nil)
	b.handle([]byte(`{"jsonrpc":"2.0","id":1,"result":null}`), nil, nil)
	b.handle([]byte(`{"jsonrpc":"2.0","id":7,"method":"some/request","params":{}}`), nil, nil)
	eventually(t, "one answer", func() bool { return len(d.got()) >= 1 })
	b.detach()
	<-d.done
	got := d.got()
	if len(got) != 1 || string(got[0].ID) != "7" || got[0].Error == nil || got[0].Error.Code != -32601 {
		t.Fatalf("frames %+v, want one -32601 answer to request 7 and nothing else", got)
	}
}

func TestBrokerSweepFailsOnlyRemoteLiveWorkloadsNobodyReasserted(t *testing.T) {
	now := time.Unix(1000, 0)
	b := newBrokerAt(self, "node1", 10*time.Second, func() time.Time { return now }, nil)
	b.handle(upsertLine(info(other, "silent-live", "running", 1)), nil, nil)
	b.handle(upsertLine(info(other, "silent-done", "completed", 1)), nil, nil)
	b.handle(upsertLine(info(self, "own-live", "queued", 1)), nil, nil)
	b.handle(upsertLine(info(other, "reasserted", "running", 1)), nil, nil)

	now = now.Add(9 * time.Second)
	if got := b.sweep(); len(got) != 0 {
		t.Fatalf("failed %v before the budget", got)
	}
	b.handle(upsertLine(info(other, "reasserted", "running", 1)), nil, nil) // a heartbeat
	now = now.Add(time.Second)
	got := b.sweep()
	if len(got) != 1 || got[0].ID != "silent-live" || got[0].State != "failed" || !got[0].Inferred {
		t.Fatalf("swept %+v, want only silent-live, failed by inference", got)
	}
	for _, w := range []struct{ origin, id, state string }{{other, "silent-done", "completed"}, {self, "own-live", "queued"}, {other, "reasserted", "running"}} {
		if j, ok := b.get(w.origin, w.id); !ok || j.State != w.state {
			t.Errorf("%s is %+v, want %s", w.id, j, w.state)
		}
	}
	// The origin speaks again: its word undoes the guess.
	b.handle(upsertLine(info(other, "silent-live", "running", 1)), nil, nil)
	if j, _ := b.get(other, "silent-live"); j.State != "running" || j.Inferred {
		t.Errorf("after the origin's re-assertion: %+v", j)
	}
}

// A node that leaves the discovery snapshot has its live workloads failed
// by inference at every broker that saw it go.
func TestBrokerFailsADepartedNodesLiveWorkloads(t *testing.T) {
	b := newBroker(self, "node1", 0)
	b.handle(upsertLine(info(other, "live", "running", 1)), nil, nil)
	b.handle(upsertLine(info(other, "done", "completed", 1)), nil, nil)
	both := json.RawMessage(`{"nodes":[{"hostUuid":"` + self + `"},{"hostUuid":"` + other + `"}]}`)
	if got := b.discovery(both); len(got) != 0 {
		t.Fatalf("the first snapshot failed %v", got)
	}
	got := b.discovery(json.RawMessage(`{"nodes":[{"hostUuid":"` + self + `"}]}`))
	if len(got) != 1 || got[0].ID != "live" || got[0].State != "failed" {
		t.Fatalf("failed %+v, want the departed node's live job", got)
	}
	if j, _ := b.get(other, "done"); j.State != "completed" {
		t.Errorf("a finished job of the departed node became %s", j.State)
	}
	if got := b.discovery(both); len(got) != 0 {
		t.Errorf("the node's return failed %v", got)
	}
}

func TestLifecycleMethodOfEachState(t *testing.T) {
	for state, want := range map[string]string{
		"queued": "workload:submitted", "running": "workload:started", "completed": "workload:completed",
		"failed": "workload:errored", "cancelled": "workload:errored",
	} {
		if got := lifecycleMethod(state); got != want {
			t.Errorf("lifecycleMethod(%q) = %q, want %q", state, got, want)
		}
	}
}
