package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// ingress is a stand-in for the daemon's loopback ingress: it answers with
// the statuses it is given, then 200, and records what it got.
type ingress struct {
	mu       sync.Mutex
	answers  []int
	reason   string
	requests []request
}

type request struct {
	method, path, contentType, origin string
	lease                             []string // the Workload-Lease header's values
	frame                             struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  struct {
			WorkloadInfo map[string]any `json:"workloadInfo"`
		} `json:"params"`
	}
}

func (in *ingress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req request
	req.method, req.path, req.contentType, req.origin = r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.Header.Get("Origin")
	req.lease = r.Header.Values("Workload-Lease")
	body, _ := io.ReadAll(r.Body)
	json.Unmarshal(body, &req.frame)
	in.mu.Lock()
	in.requests = append(in.requests, req)
	status := http.StatusOK
	if len(in.answers) > 0 {
		status, in.answers = in.answers[0], in.answers[1:]
	}
	in.mu.Unlock()
	w.WriteHeader(status)
	if status != http.StatusOK {
		io.WriteString(w, in.reason+"\n")
	}
}

func start(t *testing.T, in *ingress) string {
	srv := httptest.NewServer(in)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestProducerRetriesA500WithBackoffAndReportsTheLifecycleInOrder(t *testing.T) {
	in := &ingress{answers: []int{500, 500}, reason: "broker write failed"}
	var stdout, stderr bytes.Buffer
	code := run([]string{"--addr", start(t, in), "--id", "job-7", "--work", "0", "--backoff", "1ms"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "job-7: 3 frames sent, 2 retries, 0 refused, 0 dropped") {
		t.Errorf("stdout does not count the two retries:\n%s", stdout.String())
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.requests) != 5 {
		t.Fatalf("%d requests, want 5 (the first event three times, then one each)", len(in.requests))
	}
	want := []struct {
		method, state string
		seq           float64
	}{
		{"workload:submitted", "queued", 1}, {"workload:submitted", "queued", 1}, {"workload:submitted", "queued", 1},
		{"workload:started", "running", 2}, {"workload:completed", "completed", 3},
	}
	var runID any
	for i, r := range in.requests {
		w := r.frame.Params.WorkloadInfo
		if r.method != http.MethodPost || r.path != "/v1/workloads/events" || r.contentType != "application/json" || r.origin != "" {
			t.Errorf("request %d: %s %s Content-Type %q Origin %q", i, r.method, r.path, r.contentType, r.origin)
		}
		if r.frame.JSONRPC != "2.0" || r.frame.Method != want[i].method || w["state"] != want[i].state || w["seq"] != want[i].seq || w["id"] != "job-7" {
			t.Errorf("request %d: %s %v, want %s state %s seq %v", i, r.frame.Method, w, want[i].method, want[i].state, want[i].seq)
		}
		if _, ok := w["originatedFrom"]; ok {
			t.Errorf("request %d names originatedFrom; the daemon stamps it", i)
		}
		if i == 0 {
			runID = w["runId"]
		} else if w["runId"] != runID {
			t.Errorf("request %d runId %v, want the same %v", i, w["runId"], runID)
		}
	}
}

func TestProducerTreatsA4xxAsABugAndPrintsTheReason(t *testing.T) {
	reason := `workloadInfo.state: "bogus" is not one of queued, running, completed, failed, cancelled`
	in := &ingress{answers: []int{400}, reason: reason}
	var stdout, stderr bytes.Buffer
	code := run([]string{"--addr", start(t, in), "--work", "0", "--backoff", "1ms"}, &stdout, &stderr)
	if code != 2 {
		t.Fatalf("exit status %d after a 400, want 2", code)
	}
	if !strings.Contains(stderr.String(), reason) || !strings.Contains(stderr.String(), "400") {
		t.Errorf("stderr %q does not carry the status and the daemon's reason", stderr.String())
	}
	if !strings.Contains(stdout.String(), "0 retries, 1 refused") {
		t.Errorf("stdout %q: a 4xx is never retried", stdout.String())
	}
}

func TestProducerGivesUpAfterItsAttempts(t *testing.T) {
	in := &ingress{answers: []int{500, 503, 500, 500, 500, 500, 500, 500, 500}, reason: "broker write failed"}
	var stdout, stderr bytes.Buffer
	code := run([]string{"--addr", start(t, in), "--work", "0", "--backoff", "1ms", "--attempts", "3"}, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit status %d, want 1 after the attempts ran out; stderr:\n%s", code, stderr.String())
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.requests) != 9 || !strings.Contains(stderr.String(), "giving up") || !strings.Contains(stdout.String(), "0 frames sent, 6 retries, 0 refused, 3 dropped") {
		t.Errorf("%d requests, stdout %q, stderr %q; want 3 tries of each of 3 frames and a give-up line", len(in.requests), stdout.String(), stderr.String())
	}
}

func TestProducerLeasesItsLiveFramesRenewsWhileTheJobRunsAndEndsTheLeaseWithTheTerminalFrame(t *testing.T) {
	in := &ingress{}
	var stdout, stderr bytes.Buffer
	// A 5 s lease is renewed every 5/3 s: once in 2.5 s of work, with a
	// third of a second to spare on either side.
	code := run([]string{"--addr", start(t, in), "--id", "job-8", "--lease", "5s", "--work", "2500ms"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, stderr.String())
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	want := []struct {
		method string
		seq    float64
		lease  string
	}{{"workload:submitted", 1, "5"}, {"workload:started", 2, "5"}, {"workload:started", 2, "5"}, {"workload:completed", 3, ""}}
	if len(in.requests) != len(want) {
		t.Fatalf("%d requests, want %d (submitted, started, one renewal, completed)", len(in.requests), len(want))
	}
	for i, r := range in.requests {
		lease := strings.Join(r.lease, ",")
		if r.frame.Method != want[i].method || r.frame.Params.WorkloadInfo["seq"] != want[i].seq || lease != want[i].lease {
			t.Errorf("request %d: %s seq %v lease %q, want %s seq %v lease %q", i, r.frame.Method, r.frame.Params.WorkloadInfo["seq"], lease, want[i].method, want[i].seq, want[i].lease)
		}
	}
}

func TestProducerThatAbandonsItsJobLeavesItToItsLease(t *testing.T) {
	in := &ingress{}
	var stdout, stderr bytes.Buffer
	code := run([]string{"--addr", start(t, in), "--id", "job-9", "--lease", "5s", "--abandon"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, stderr.String())
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.requests) != 2 || in.requests[1].frame.Params.WorkloadInfo["state"] != "running" {
		t.Fatalf("%d requests, want queued and running only", len(in.requests))
	}
	if !strings.Contains(stdout.String(), "abandoned job-9 while running") {
		t.Errorf("stdout: %s", stdout.String())
	}
}

func TestProducerRefusesALeaseTheDaemonWouldRefuse(t *testing.T) {
	for _, lease := range []string{"4s", "25h", "5500ms"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"--addr", "127.0.0.1:1", "--attempts", "1", "--lease", lease}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "--lease") {
			t.Errorf("--lease %s: exit %d, stderr %q; want 2 naming the flag", lease, code, stderr.String())
		}
	}
}

// Every flag with a bad value is one line naming the flag with two dashes,
// and exit status 2, before anything is sent; --help is exit 0.
func TestProducerRefusesABadFlagWithStatus2AndOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--addr", "14324"}, `--addr "14324": not HOST:PORT`},
		{[]string{"--addr"}, "--addr needs a value"},
		{[]string{"--id"}, "--id needs a value"},
		{[]string{"--model"}, "--model needs a value"},
		{[]string{"--engine"}, "--engine needs a value"},
		{[]string{"--work", "1"}, `--work: "1" is not a duration`},
		{[]string{"--work", "-1s"}, "--work -1s: must not be negative"},
		{[]string{"--attempts", "many"}, `--attempts: "many" is not a whole number`},
		{[]string{"--backoff", "fast"}, `--backoff: "fast" is not a duration`},
		{[]string{"--backoff", "-1s"}, "--backoff -1s: must not be negative"},
		{[]string{"--lease", "30"}, `--lease: "30" is not a duration`},
		{[]string{"--lease", "1s"}, "--lease 1s"},
		{[]string{"--abandon=sometimes"}, `--abandon: "sometimes" is not true or false`},
		{[]string{"--bogus"}, "unknown flag --bogus (--help lists the flags)"},
		{[]string{"stray"}, `unexpected argument "stray"`},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit status %d, want 2", tc.args, code)
		}
		if got := stderr.String(); strings.Count(got, "\n") != 1 || !strings.HasPrefix(got, "producer: ") || !strings.Contains(got, tc.want) {
			t.Errorf("%v: stderr %q, want one line naming the flag: %q", tc.args, got, tc.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("%v: stdout %q, want nothing", tc.args, stdout.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "-lease") {
		t.Errorf("--help: exit %d, stdout %q", code, stdout.String())
	}
}
