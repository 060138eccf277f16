package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// ingressRecord is one request the fake ingress received.
type ingressRecord struct {
	contentType, origin, path, httpMethod string
	method                                string
	info                                  map[string]any // lifecycle frames
	removedID                             string         // workloads:remove
	status                                int
}

// fakeIngress answers like node 1's ingress, with a 500 on every fifth
// request so the producer's retries are exercised.
type fakeIngress struct {
	mu   sync.Mutex
	recs []ingressRecord
	n    int
}

func (f *fakeIngress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var frame struct {
		Method string `json:"method"`
		Params struct {
			WorkloadInfo map[string]any `json:"workloadInfo"`
			WorkloadID   string         `json:"workloadId"`
		} `json:"params"`
	}
	json.Unmarshal(body, &frame)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	status := http.StatusOK
	if f.n%5 == 0 {
		status = http.StatusInternalServerError
	}
	f.recs = append(f.recs, ingressRecord{r.Header.Get("Content-Type"), strings.Join(r.Header.Values("Origin"), ","), r.URL.Path, r.Method,
		frame.Method, frame.Params.WorkloadInfo, frame.Params.WorkloadID, status})
	w.WriteHeader(status)
}

func (f *fakeIngress) accepted() []ingressRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ingressRecord
	for _, r := range f.recs {
		if r.status == http.StatusOK {
			out = append(out, r)
		}
	}
	return out
}

func TestSimulatorReportsLikeAWellBehavedProducer(t *testing.T) {
	fake := &fakeIngress{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	c := paperCluster(t, 2)
	n1, n2 := c.nodes[0], c.nodes[1]
	n1.ingress = strings.TrimPrefix(srv.URL, "http://")
	s := newSimulator(c)
	s.step = [2]time.Duration{time.Millisecond, 3 * time.Millisecond}
	s.start()
	eventually(t, "80 accepted ingress events with removals among them", func() bool {
		recs, removals := fake.accepted(), 0
		for _, r := range recs {
			if r.method == "workloads:remove" {
				removals++
			}
		}
		return len(recs) >= 80 && removals >= 2
	})
	s.stop()

	next := map[string]string{"queued": "running cancelled", "running": "completed failed cancelled"}
	methodOf := map[string]string{"queued": "workload:submitted", "running": "workload:started",
		"completed": "workload:completed", "failed": "workload:errored", "cancelled": "workload:errored"}
	type seen struct {
		state   string
		seq     float64
		removed bool
	}
	jobs := map[string]*seen{}
	live, runID := 0, ""
	for i, r := range fake.accepted() {
		if r.httpMethod != http.MethodPost || r.path != "/v1/workloads/events" || r.contentType != "application/json" || r.origin != "" {
			t.Fatalf("request %d: %s %s Content-Type %q Origin %q", i, r.httpMethod, r.path, r.contentType, r.origin)
		}
		if r.method == "workloads:remove" {
			j := jobs[r.removedID]
			if j == nil || j.removed || next[j.state] != "" {
				t.Fatalf("request %d removes %q, which is not a finished job (%+v)", i, r.removedID, j)
			}
			j.removed = true
			continue
		}
		id, _ := r.info["id"].(string)
		state, _ := r.info["state"].(string)
		seq, _ := r.info["seq"].(float64)
		if _, ok := r.info["originatedFrom"]; ok {
			t.Fatalf("request %d carries originatedFrom; the ingress stamps it", i)
		}
		if rid, _ := r.info["runId"].(string); runID == "" {
			runID = rid
		} else if rid != runID {
			t.Fatalf("request %d runId %q, want the producer's one nonce %q", i, rid, runID)
		}
		if methodOf[state] != r.method {
			t.Fatalf("request %d: method %s for state %s", i, r.method, state)
		}
		j := jobs[id]
		switch {
		case j == nil && (state != "queued" || seq != 1):
			t.Fatalf("request %d: %s starts as %s seq %v, want queued seq 1", i, id, state, seq)
		case j == nil:
			jobs[id] = &seen{state: state, seq: seq}
			live++
		case j.removed || !strings.Contains(next[j.state], state) || seq != j.seq+1:
			t.Fatalf("request %d: %s went %s seq %v -> %s seq %v (removed %v)", i, id, j.state, j.seq, state, seq, j.removed)
		default:
			if next[state] == "" {
				live--
			}
			j.state, j.seq = state, seq
		}
		if live > maxLive {
			t.Fatalf("request %d: %d jobs live, want at most %d", i, live, maxLive)
		}
	}
	st := &s.stats
	st.mu.Lock()
	retried := st.ingressRetry
	st.mu.Unlock()
	if retried == 0 {
		t.Error("no 500 was retried")
	}
	// The broker path went to node 2's store, stamped with node 2's id.
	js := n2.broker.snapshot()
	if len(js) == 0 {
		t.Fatal("node 2's broker path entered no job")
	}
	for _, j := range js {
		if j.Origin != n2.id {
			t.Errorf("node 2's local job %s has origin %s", j.ID, j.Origin)
		}
	}
}

func TestSimulatorRetriesA500AndGivesUpOnA4xx(t *testing.T) {
	var mu sync.Mutex
	answers := []int{500, 500, 200, 400}
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		status := answers[calls]
		calls++
		mu.Unlock()
		w.WriteHeader(status)
		if status == 400 {
			io.WriteString(w, "workloadInfo.state: \"bogus\" is not a known state\n")
		}
	}))
	defer srv.Close()
	s := &simulator{client: srv.Client(), url: srv.URL + "/v1/workloads/events"}
	if !s.post(t.Context(), "workload:submitted", json.RawMessage(`{}`)) {
		t.Fatal("post gave up although the third attempt was answered 200")
	}
	if s.post(t.Context(), "workload:submitted", json.RawMessage(`{}`)) {
		t.Fatal("post reported a 400 as accepted")
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 4 {
		t.Errorf("%d requests, want 3 for the 500s and the 200, and 1 for the 400 (never retried)", calls)
	}
	if s.stats.ingressOK != 1 || s.stats.ingressRetry != 2 || s.stats.ingressRefuse != 1 ||
		!strings.Contains(s.stats.lastProblem, "is not a known state") {
		t.Errorf("stats %s, want 1 accepted, 2 retried, 1 refused with the daemon's reason", s.stats.String())
	}
}

func TestSimulatorHoldsRemovalsWhenAsked(t *testing.T) {
	fake := &fakeIngress{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	c := paperCluster(t, 2)
	c.nodes[0].ingress = strings.TrimPrefix(srv.URL, "http://")
	s := newSimulator(c)
	s.step = [2]time.Duration{time.Millisecond, 3 * time.Millisecond}
	s.start()
	eventually(t, "a removal", func() bool { return len(s.removedJobs()) > 0 })
	s.holdRemovals()
	held := len(fake.accepted())
	before := len(s.removedJobs())
	// Barrier: more finished jobs than a path keeps, which would have
	// forced a removal were every node up.
	eventually(t, "more finished ingress jobs than a path keeps", func() bool {
		finished := 0
		for _, r := range fake.accepted()[held:] {
			if st, _ := r.info["state"].(string); st == "completed" || st == "failed" || st == "cancelled" {
				finished++
			}
		}
		return finished > keepTerminal+2
	})
	s.stop()
	for _, r := range fake.accepted()[held:] {
		if r.method == "workloads:remove" {
			t.Fatalf("removed %s after holdRemovals returned", r.removedID)
		}
	}
	if len(s.removedJobs()) != before {
		t.Errorf("%d removals recorded after the hold, want none", len(s.removedJobs())-before)
	}
}
