package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

// The bridge's decisions, one poll at a time, against a scripted view of
// Slurm and an ingress that records what it is sent (and answers the
// read-back as the daemon does, spec 3.5.2). The real Slurm and the real
// daemon are e2e/slurm_test.go's.

// ingress records the frames the bridge's client sends, in order.
type ingress struct {
	mu       sync.Mutex
	frames   []sent
	readBack []map[string]any // the read-back's workloads; nil answers 500
}

// sent is one frame: a lifecycle frame's workload, or a removal's id.
type sent struct {
	Method  string
	Info    map[string]any
	Removed string
	Lease   string
}

func (in *ingress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if r.Method == http.MethodGet {
		if in.readBack == nil {
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		items := []map[string]any{}
		for _, info := range in.readBack {
			items = append(items, map[string]any{"workloadInfo": info, "leaseDeadline": nil})
		}
		json.NewEncoder(w).Encode(map[string]any{"workloads": items, "next": nil})
		return
	}
	var f struct {
		Method string `json:"method"`
		Params struct {
			WorkloadInfo map[string]any `json:"workloadInfo"`
			WorkloadID   string         `json:"workloadId"`
		} `json:"params"`
	}
	b, _ := io.ReadAll(r.Body)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	dec.Decode(&f)
	in.frames = append(in.frames, sent{Method: f.Method, Info: f.Params.WorkloadInfo, Removed: f.Params.WorkloadID, Lease: r.Header.Get("Workload-Lease")})
	io.WriteString(w, "ok")
}

// of returns the frames sent for workload id (its removals included).
func (in *ingress) of(id string) []sent {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []sent
	for _, f := range in.frames {
		if f.Removed == id || (f.Info != nil && f.Info["id"] == id) {
			out = append(out, f)
		}
	}
	return out
}

// count is how many frames were sent.
func (in *ingress) count() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.frames)
}

// rig is a bridge, its ingress and the view of Slurm it reads next.
type rig struct {
	t    *testing.T
	in   *ingress
	addr string
	b    *bridge
	log  *bytes.Buffer
	view []sjob
	fail error // the next polls' squeue error
	cfg  bridgeConfig
}

func newRig(t *testing.T, cfg bridgeConfig, in *ingress) *rig {
	t.Helper()
	if in == nil {
		in = &ingress{readBack: []map[string]any{}}
	}
	srv := httptest.NewServer(in)
	t.Cleanup(srv.Close)
	if cfg.statePath == "" {
		cfg.statePath = filepath.Join(t.TempDir(), "state.json")
	}
	cfg.node = cmpStr(cfg.node, "n1")
	cfg.maxJobs = max(cfg.maxJobs, 1)
	if cfg.maxJobs == 1 {
		cfg.maxJobs = defaultMaxJobs
	}
	r := &rig{t: t, in: in, addr: strings.TrimPrefix(srv.URL, "http://"), log: &bytes.Buffer{}, cfg: cfg}
	r.start()
	return r
}

// start makes a bridge (again: a restart) on the rig's state file.
func (r *rig) start() {
	r.t.Helper()
	log := slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := wlmclient.New(wlmclient.Config{Addr: r.addr, Producer: "slurm", Lease: 30 * time.Second, Logger: log,
		OutboxPath: r.cfg.statePath + ".outbox", BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { c.Close(context.Background()) })
	r.b = newBridge(r.cfg, c, log)
	r.b.squeue = func(context.Context) (squeueView, error) {
		if r.fail != nil {
			return squeueView{}, r.fail
		}
		return squeueView{Jobs: append([]sjob(nil), r.view...)}, nil
	}
	r.b.recover(context.Background())
}

// poll runs one poll on view, waits until the client has sent every
// frame it queued (the poll queues them before it returns) and checks
// that the ingress has n frames in all.
func (r *rig) poll(n int, view ...sjob) {
	r.t.Helper()
	r.view = view
	r.b.poll(context.Background())
	r.sent(n)
}

// sent waits until the client has nothing queued and the ingress has n
// frames in all, and fails unless it has exactly n.
func (r *rig) sent(n int) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.in.count() < n || r.b.c.Stats().Queued > 0 {
		if time.Now().After(deadline) {
			r.t.Fatalf("%d frames sent, want %d; log:\n%s", r.in.count(), n, r.log)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if got := r.in.count(); got != n {
		r.t.Fatalf("%d frames sent, want %d; log:\n%s", got, n, r.log)
	}
}

// T0 is the scripted Slurm's clock: its jobs' times count from it.
var T0 = time.Unix(1_800_000_000, 0)

func at(s int) time.Time { return T0.Add(time.Duration(s) * time.Second) }

func pending(key string, submit int) sjob {
	return sjob{Key: key, JobID: 1, TaskID: -1, Name: "train", User: "alice", Cluster: "c1", State: "PENDING", Reason: "Resources", Submit: at(submit)}
}

func running(key string, submit, start int, host string) sjob {
	j := pending(key, submit)
	j.State, j.Reason, j.Start, j.BatchHost = "RUNNING", "None", at(start), host
	return j
}

func ended(key string, submit, start, end int, state string, exit exitStatus) sjob {
	j := running(key, submit, start, "n1")
	j.State, j.End, j.Exit = state, at(end), exit
	return j
}

// states are the states of frames, "removed" for a removal.
func states(fs []sent) []string {
	var out []string
	for _, f := range fs {
		if f.Removed != "" {
			out = append(out, "removed")
			continue
		}
		out = append(out, f.Info["state"].(string))
	}
	return out
}

func num(v any) int64 {
	n, _ := v.(json.Number).Int64()
	return n
}

// idOf is the id the bridge gave the job keyed key with that submit time.
func idOf(key string, submit int) string {
	return fmt.Sprintf("slurm-c1-%s-%s", key, strconv.FormatInt(at(submit).Unix(), 36))
}

func wantStates(t *testing.T, fs []sent, want ...string) {
	t.Helper()
	got := states(fs)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("states %v, want %v", got, want)
	}
}

func TestBridgeWalksEachJobThroughItsStatesInOrderWithSlurmsOwnTimes(t *testing.T) {
	r := newRig(t, bridgeConfig{pending: true}, nil)
	r.poll(1, pending("1", 0))
	r.poll(2, running("1", 0, 5, "n1"))
	// Job 2 ran and ended between two polls: every state it went through.
	r.poll(5, running("1", 0, 5, "n1"), ended("2", 1, 6, 7, "COMPLETED", exitStatus{Known: true}))
	r.poll(6, ended("1", 0, 5, 9, "FAILED", exitStatus{Known: true, Code: 3}), ended("2", 1, 6, 7, "COMPLETED", exitStatus{Known: true}))

	one, two := r.in.of(idOf("1", 0)), r.in.of(idOf("2", 1))
	wantStates(t, one, "queued", "running", "failed")
	wantStates(t, two, "queued", "running", "completed")
	for i, f := range one {
		if num(f.Info["seq"]) != int64(i+1) || num(f.Info["createdAt"]) != at(0).UnixMilli() {
			t.Errorf("job 1 frame %d: seq %v createdAt %v", i, f.Info["seq"], f.Info["createdAt"])
		}
	}
	if num(one[1].Info["startedAt"]) != at(5).UnixMilli() || num(one[2].Info["completedAt"]) != at(9).UnixMilli() {
		t.Errorf("job 1's times are not Slurm's: %v", one)
	}
	if e := one[2].Info["error"]; e != "Slurm job 1 ended FAILED (reason None, exit code 3)" {
		t.Errorf("job 1's error %q", e)
	}
	if num(two[1].Info["startedAt"]) != at(6).UnixMilli() || num(two[2].Info["completedAt"]) != at(7).UnixMilli() {
		t.Errorf("job 2's times are not Slurm's: %v", two)
	}
	if one[0].Lease != "30" || one[2].Lease != "" || one[0].Info[keyField] != "1" || one[0].Info["requesterId"] != "slurm/alice" {
		t.Errorf("job 1's first frame %+v, its last %+v: want leased live frames naming the Slurm job", one[0], one[2])
	}
}

func TestBridgeSettlesAJobThatLeftSlurmsViewAsFailedNeverCompleted(t *testing.T) {
	r := newRig(t, bridgeConfig{}, nil)
	r.poll(2, running("7", 0, 1, "n1"))
	r.poll(3) // an empty view: the job is gone
	fs := r.in.of(idOf("7", 0))
	wantStates(t, fs, "queued", "running", "failed")
	if e, _ := fs[2].Info["error"].(string); !strings.Contains(e, "left Slurm's view unobserved") || !strings.Contains(e, "its end is unknown") {
		t.Errorf("the settled job's error: %q", e)
	}
}

func TestBridgeNothingIsDecidedWhileSqueueFails(t *testing.T) {
	r := newRig(t, bridgeConfig{}, nil)
	r.poll(2, running("7", 0, 1, "n1"))
	r.fail = errors.New("squeue --json: exit status 1: slurm_load_jobs error: Unable to contact slurm controller")
	r.poll(2)
	r.poll(2)
	r.fail = nil
	r.poll(2, running("7", 0, 1, "n1"))
	if n := strings.Count(r.log.String(), "squeue failed"); n != 1 {
		t.Errorf("the outage was logged %d times, want once:\n%s", n, r.log)
	}
	if !strings.Contains(r.log.String(), "squeue answers again") {
		t.Errorf("the end of the outage was not logged:\n%s", r.log)
	}
}

func TestBridgeGivesAJobAfterASlurmStateWipeANewIDAndSettlesTheOldOne(t *testing.T) {
	r := newRig(t, bridgeConfig{pending: true}, nil)
	r.poll(2, running("1", 0, 1, "n1"))
	// Slurm's state was wiped: job ids start again, and job 1 is another job.
	r.poll(4, pending("1", 100))
	wantStates(t, r.in.of(idOf("1", 0)), "queued", "running", "failed")
	wantStates(t, r.in.of(idOf("1", 100)), "queued")
	if e, _ := r.in.of(idOf("1", 0))[2].Info["error"].(string); !strings.Contains(e, "names another job now") {
		t.Errorf("the old job's error: %q", e)
	}
}

func TestBridgeKeepsARequeuedJobsIDAndReportsItQueuedAgain(t *testing.T) {
	r := newRig(t, bridgeConfig{pending: true}, nil)
	r.poll(2, running("3", 0, 1, "n1"))
	requeued := pending("3", 50) // a requeue moves the submit time and counts a restart
	requeued.Restarts = 1
	r.poll(3, requeued)
	again := running("3", 50, 60, "n1")
	again.Restarts = 1
	r.poll(4, again)
	fs := r.in.of(idOf("3", 0))
	wantStates(t, fs, "queued", "running", "queued", "running")
	if fs[2].Info["startedAt"] != nil || num(fs[3].Info["seq"]) != 4 {
		t.Errorf("the requeue: %+v then %+v", fs[2].Info, fs[3].Info)
	}
}

func TestBridgeHandsAPendingJobOverToTheNodeThatRunsIt(t *testing.T) {
	in := &ingress{readBack: []map[string]any{}}
	p := newRig(t, bridgeConfig{pending: true, node: "n1"}, in)
	p.poll(1, pending("4", 0))
	p.poll(2, running("4", 0, 3, "n2")) // it runs on another node: that node reports it
	wantStates(t, in.of(idOf("4", 0)), "queued", "removed")
	p.poll(2, ended("4", 0, 3, 9, "COMPLETED", exitStatus{Known: true}))

	other := newRig(t, bridgeConfig{node: "n2"}, nil)
	other.poll(0, pending("4", 0)) // not this node's: no node runs it, and n2 does not report pending jobs
	other.poll(2, running("4", 0, 3, "n2"))
	wantStates(t, other.in.of(idOf("4", 0)), "queued", "running")
}

func TestBridgeTracksAtMostMaxJobsAndSaysSo(t *testing.T) {
	r := newRig(t, bridgeConfig{maxJobs: 2}, nil)
	r.poll(4, running("1", 0, 1, "n1"), running("2", 0, 1, "n1"), running("3", 0, 1, "n1"))
	if len(r.in.of(idOf("3", 0))) != 0 {
		t.Error("a third job was reported at --max-jobs 2")
	}
	if !strings.Contains(r.log.String(), "over --max-jobs") || !strings.Contains(r.log.String(), "notReported=1") {
		t.Errorf("the bound was not logged:\n%s", r.log)
	}
	r.poll(4, running("1", 0, 1, "n1"), running("2", 0, 1, "n1"), running("3", 0, 1, "n1"))
	if n := strings.Count(r.log.String(), "over --max-jobs"); n != 1 {
		t.Errorf("the bound was logged %d times over two polls, want once", n)
	}
}

func TestBridgeRestartedGoesOnWithEachJobFromItsStateFileAndTheReadBack(t *testing.T) {
	in := &ingress{readBack: []map[string]any{}}
	r := newRig(t, bridgeConfig{}, in)
	r.poll(2, running("5", 0, 1, "n1"))
	// The node shows what it got; the bridge restarts on its state file.
	id := idOf("5", 0)
	in.mu.Lock()
	in.readBack = []map[string]any{r.in.frames[1].Info}
	in.mu.Unlock()
	r.start()
	if !strings.Contains(r.log.String(), "recovered") || !strings.Contains(r.log.String(), "readBack=true") {
		t.Fatalf("no recovery logged:\n%s", r.log)
	}
	r.sent(3) // the resumed job's lease, renewed at once
	r.poll(4, ended("5", 0, 1, 8, "COMPLETED", exitStatus{Known: true}))
	fs := in.of(id)
	wantStates(t, fs, "queued", "running", "running", "completed")
	if num(fs[2].Info["seq"]) != 2 || num(fs[3].Info["seq"]) != 3 || fs[2].Lease != "30" {
		t.Errorf("after the restart: the renewal %+v, the end %+v", fs[2], fs[3])
	}
}

func TestBridgeRestartedWithoutAReadBackSaysEachLiveJobsStateAgain(t *testing.T) {
	in := &ingress{readBack: []map[string]any{}}
	r := newRig(t, bridgeConfig{}, in)
	r.poll(2, running("5", 0, 1, "n1"))
	in.mu.Lock()
	in.readBack = nil // the read-back fails
	in.mu.Unlock()
	r.start()
	r.sent(3)                           // the resumed job's lease, renewed at once
	r.poll(4, running("5", 0, 1, "n1")) // the state said again
	fs := in.of(idOf("5", 0))
	wantStates(t, fs, "queued", "running", "running", "running")
	if num(fs[3].Info["seq"]) != 3 {
		t.Errorf("the state said again has seq %v, want 3", fs[3].Info["seq"])
	}
}

func TestBridgeReRunsAJobWhoseLeaseRanOutWhileNoBridgeReportedIt(t *testing.T) {
	in := &ingress{readBack: []map[string]any{}}
	r := newRig(t, bridgeConfig{}, in)
	r.poll(2, running("6", 0, 1, "n1"))
	expired := map[string]any{}
	for k, v := range r.in.frames[1].Info {
		expired[k] = v
	}
	expired["state"], expired["seq"], expired["error"] = "failed", json.Number("3"), "producer stopped reporting: lease of 30 s expired"
	in.mu.Lock()
	in.readBack = []map[string]any{expired}
	in.mu.Unlock()
	r.start()
	r.poll(6, ended("6", 0, 1, 20, "COMPLETED", exitStatus{Known: true}))
	fs := in.of(idOf("6", 0))
	wantStates(t, fs, "queued", "running", "removed", "queued", "running", "completed")
	if run := fs[3].Info["runId"]; run != idOf("6", 0)+"~1" || num(fs[5].Info["completedAt"]) != at(20).UnixMilli() {
		t.Errorf("the new run %v ended %v", run, fs[5].Info)
	}
}

func TestBridgeStateFileTornStartsFromTheReadBack(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	os.WriteFile(state, []byte(`{"version":1,"jobs":[{"key":"5","id":`), 0o600)
	id := idOf("5", 0)
	in := &ingress{readBack: []map[string]any{{"id": id, "runId": id, "state": "running", "seq": json.Number("2"),
		"engine": "slurm", "model": "train", keyField: "5", "createdAt": json.Number("1800000000000"), "requesterId": "slurm/alice"}}}
	r := newRig(t, bridgeConfig{statePath: state}, in)
	if !strings.Contains(r.log.String(), "state file not read") {
		t.Fatalf("the torn file was not logged:\n%s", r.log)
	}
	r.sent(1) // the resumed job's lease, renewed at once
	r.poll(2, ended("5", 0, 1, 8, "COMPLETED", exitStatus{Known: true}))
	wantStates(t, in.of(id), "running", "completed")
	if num(in.of(id)[1].Info["seq"]) != 3 {
		t.Errorf("the end's seq %v, want 3 (after the node's 2)", in.of(id)[1].Info["seq"])
	}
	jobs, err := loadState(state)
	if err != nil || len(jobs) != 1 || jobs[0].ID != id || jobs[0].State != "completed" {
		t.Errorf("the state file after the poll: %v %v", jobs, err)
	}
}

func TestBridgeSendsAnEndItsFileRecordedThatTheNodeNeverGot(t *testing.T) {
	in := &ingress{readBack: []map[string]any{}}
	r := newRig(t, bridgeConfig{}, in)
	r.poll(2, running("8", 0, 1, "n1"))
	// The bridge wrote the end to its file and died before the client
	// sent it: the file says completed, the node still shows running.
	jobs, err := loadState(r.cfg.statePath)
	if err != nil || len(jobs) != 1 {
		t.Fatal(jobs, err)
	}
	jobs[0].State, jobs[0].Seq, jobs[0].Ended = "completed", 3, at(7).UnixMilli()
	if err := saveState(r.cfg.statePath, jobs); err != nil {
		t.Fatal(err)
	}
	in.mu.Lock()
	in.readBack = []map[string]any{r.in.frames[1].Info}
	in.mu.Unlock()
	r.start()
	r.sent(3) // the resumed job's lease, renewed at once
	r.poll(4) // the job has left Slurm's view since: its recorded end, not "unknown"
	fs := in.of(idOf("8", 0))
	wantStates(t, fs, "queued", "running", "running", "completed")
	if num(fs[3].Info["completedAt"]) != at(7).UnixMilli() || fs[3].Info["error"] != nil {
		t.Errorf("the end sent: %+v, want the recorded one", fs[3].Info)
	}
}

func TestBridgeReportsEachTaskOfAPendingArrayUnderTheIDItKeepsWhenSplit(t *testing.T) {
	r := newRig(t, bridgeConfig{pending: true}, nil)
	arr := pending("9", 0)
	arr.JobID, arr.ArrayJobID, arr.Tasks = 9, 9, "0-2"
	r.poll(3, arr) // one record in Slurm, three jobs here
	task0 := running("9_0", 0, 2, "n1")
	task0.JobID, task0.ArrayJobID, task0.TaskID = 10, 9, 0
	rest := arr
	rest.Tasks = "1-2"
	r.poll(4, task0, rest) // Slurm split task 0 off, with a job id of its own
	wantStates(t, r.in.of(idOf("9_0", 0)), "queued", "running")
	wantStates(t, r.in.of(idOf("9_1", 0)), "queued")
	wantStates(t, r.in.of(idOf("9_2", 0)), "queued")
}
