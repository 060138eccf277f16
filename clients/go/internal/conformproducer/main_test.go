package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestABadFlagIsOneLineNamingItAndExit2(t *testing.T) {
	good := []string{"--addr", "127.0.0.1:1", "--producer", "p", "--outbox", "/tmp/x", "--lease", "10", "--jobs", "1", "--member", ""}
	for _, tc := range []struct {
		name string
		args []string
		flag string
	}{
		{"missing addr", good[2:], "--addr"},
		{"missing member", good[:10], "--member"},
		{"bad addr", append([]string{"--addr", "nope"}, good[2:]...), "--addr"},
		{"lease too short", append(append([]string{}, good...), "--lease", "4"), "--lease"},
		{"lease not a number", append(append([]string{}, good...), "--lease", "10s"), "--lease"},
		{"negative jobs", append(append([]string{}, good...), "--jobs", "-1"), "--jobs"},
		{"zero concurrency", append(append([]string{}, good...), "--concurrency", "0"), "--concurrency"},
		{"negative step delay", append(append([]string{}, good...), "--step-delay-ms", "-1"), "--step-delay-ms"},
		{"zero close timeout", append(append([]string{}, good...), "--close-timeout", "0"), "--close-timeout"},
		{"unknown flag", append(append([]string{}, good...), "--bogus"), "--bogus"},
		{"no value", append(append([]string{}, good...), "--seed"), "--seed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tc.args, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2; stderr %q", code, stderr.String())
			}
			msg := stderr.String()
			if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") || !strings.Contains(msg, tc.flag) {
				t.Errorf("stderr %q: want one line naming %s", msg, tc.flag)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q: want nothing", stdout.String())
			}
		})
	}
}

// selfID is the node id the stand-in ingress answers GET /v1/node with: a
// UUID, as the client takes no other.
const selfID = "0b5e7c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5b"

// ingress stands in for the daemon's ingress: it answers GET /v1/node and
// every POST 200, and records each job's frames in arrival order.
type ingress struct {
	mu     sync.Mutex
	frames map[string][]frame // job id -> frames in arrival order
}

type frame struct {
	Method string `json:"method"`
	Params struct {
		WorkloadID   string `json:"workloadId"`
		WorkloadInfo *struct {
			ID          string `json:"id"`
			Seq         int64  `json:"seq"`
			State       string `json:"state"`
			ScheduledOn string `json:"scheduledOn"`
		} `json:"workloadInfo"`
	} `json:"params"`
}

func (in *ingress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/node":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"nodeId":"`+selfID+`","limits":{},"members":[{"name":"self","nodeId":"`+selfID+`","self":true},{"name":"gpu-b","nodeId":"n-b","delivering":true}]}`)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/workloads/events":
		var f frame
		if err := json.NewDecoder(r.Body).Decode(&f); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := f.Params.WorkloadID
		if f.Params.WorkloadInfo != nil {
			id = f.Params.WorkloadInfo.ID
		}
		in.mu.Lock()
		in.frames[id] = append(in.frames[id], f)
		in.mu.Unlock()
		io.WriteString(w, "ok\n")
	default:
		http.NotFound(w, r)
	}
}

func TestARunPrintsTheProtocolAndEachJobsFramesArriveInSeqOrder(t *testing.T) {
	in := &ingress{frames: map[string][]frame{}}
	srv := httptest.NewServer(in)
	defer srv.Close()
	var stdout, stderr bytes.Buffer
	args := []string{"--addr", strings.TrimPrefix(srv.URL, "http://"), "--producer", "conf-test",
		"--outbox", filepath.Join(t.TempDir(), "outbox"), "--lease", "10", "--jobs", "12",
		"--concurrency", "4", "--member", "gpu-b", "--step-delay-ms", "5", "--seed", "1"}
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}

	var lines []map[string]any
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	if len(lines) < 2 || lines[0]["event"] != "node" || lines[len(lines)-1]["event"] != "done" {
		t.Fatalf("want a node line first and a done line last, got %v", lines)
	}
	if n := lines[0]; n["nodeId"] != selfID || n["member"] != "gpu-b" || n["memberId"] != "n-b" {
		t.Errorf("node line %v", n)
	}
	if d := lines[len(lines)-1]; d["closeErr"] != "" {
		t.Errorf("done line %v: want no close error", d)
	}
	if s := lines[len(lines)-2]; s["event"] != "stats" || s["queued"] != 0.0 || s["sent"].(float64) < 36-2 ||
		s["refused"] != 0.0 || s["dropped"] != 0.0 || s["outboxPending"] != 0.0 {
		// 12 jobs: 12 submitted, 10 started (k%6 == 5 skips it), 12 ended;
		// a lease renewal (after 10/3 s on a slow machine) adds one more.
		t.Errorf("final stats line %v", s)
	}
	submitted := map[string]string{} // id -> scheduledOn
	meant := map[string]string{}     // id -> final
	ending := map[string]string{}    // id -> final, said before the end call
	for _, l := range lines[1 : len(lines)-1] {
		id, _ := l["id"].(string)
		switch l["event"] {
		case "submitted":
			submitted[id], _ = l["scheduledOn"].(string)
		case "ending":
			ending[id], _ = l["final"].(string)
		case "meant":
			if _, ok := submitted[id]; !ok {
				t.Errorf("meant before submitted: %v", l)
			}
			meant[id], _ = l["final"].(string)
			if ending[id] != meant[id] {
				t.Errorf("meant %q without an ending line for it first (%q)", meant[id], ending[id])
			}
		case "stats":
		default:
			t.Errorf("unexpected line %v", l)
		}
	}
	if len(submitted) != 12 || len(meant) != 12 {
		t.Fatalf("%d submitted and %d meant, want 12 each", len(submitted), len(meant))
	}
	// k = 0..11 by k%6: 0 completed, 1 failed, 2 cancelled, 3 removed,
	// 4 completed, 5 completed; k%4 == 3 (3, 7, 11) scheduled on gpu-b.
	finals := map[string]int{}
	scheduled := 0
	for id, fin := range meant {
		finals[fin]++
		if submitted[id] == "n-b" {
			scheduled++
		}
	}
	if want := map[string]int{"completed": 6, "failed": 2, "cancelled": 2, "removed": 2}; !equal(finals, want) {
		t.Errorf("finals %v, want %v", finals, want)
	}
	if scheduled != 3 {
		t.Errorf("%d jobs scheduled on n-b, want 3", scheduled)
	}

	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.frames) != 12 {
		t.Errorf("the ingress saw %d jobs, want 12", len(in.frames))
	}
	for id, fs := range in.frames {
		var seq int64
		for i, f := range fs {
			if f.Method == "workloads:remove" {
				if i != len(fs)-1 || meant[id] != "removed" {
					t.Errorf("job %s: a removal at %d of %d frames, meant %q", id, i, len(fs), meant[id])
				}
				continue
			}
			wi := f.Params.WorkloadInfo
			if wi.Seq < seq {
				t.Errorf("job %s: seq %d after %d: %v", id, wi.Seq, seq, fs)
			}
			seq = wi.Seq
			if wi.ScheduledOn != submitted[id] {
				t.Errorf("job %s: scheduledOn %q, submitted with %q", id, wi.ScheduledOn, submitted[id])
			}
			if i == len(fs)-1 && wi.State != meant[id] {
				t.Errorf("job %s: last state %q, meant %q", id, wi.State, meant[id])
			}
		}
	}
}

func equal(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestAMemberTheNodeDoesNotListHasNoID: the member's id comes from the
// client's own lookup (Client.MemberID); a name the node does not list
// leaves the node line's memberId empty and says so on stderr, and the run
// goes on.
func TestAMemberTheNodeDoesNotListHasNoID(t *testing.T) {
	in := &ingress{frames: map[string][]frame{}}
	srv := httptest.NewServer(in)
	defer srv.Close()
	var stdout, stderr bytes.Buffer
	args := []string{"--addr", strings.TrimPrefix(srv.URL, "http://"), "--producer", "conf-test",
		"--outbox", filepath.Join(t.TempDir(), "outbox"), "--lease", "10", "--jobs", "0", "--member", "gpu-z"}
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
	first, _, _ := strings.Cut(stdout.String(), "\n")
	var n map[string]any
	if err := json.Unmarshal([]byte(first), &n); err != nil || n["event"] != "node" || n["member"] != "gpu-z" || n["memberId"] != "" {
		t.Errorf("node line %q (%v): want memberId empty", first, err)
	}
	if !strings.Contains(stderr.String(), `no member named "gpu-z"`) {
		t.Errorf("stderr does not name the missing member:\n%s", stderr.String())
	}
}
