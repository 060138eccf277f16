package main

import (
	"encoding/json"
	"fmt"
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
	lease                                 string // the Workload-Lease header's values, joined
	at                                    time.Time
}

// fakeIngress answers like node 1's ingress, with a 500 on every fifth
// request so the producer's retries are exercised.
type fakeIngress struct {
	mu   sync.Mutex
	recs []ingressRecord
	n    int
	// expireAfter, when set, makes the read-back list as failed by their
	// lease every job whose last frame is older than this: a stand-in for
	// the daemon's expiry, at the test's pace.
	expireAfter time.Duration
	readBacks   int
}

func (f *fakeIngress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/v1/workloads" {
		f.serveReadBack(w, r)
		return
	}
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
		frame.Method, frame.Params.WorkloadInfo, frame.Params.WorkloadID, status, strings.Join(r.Header.Values("Workload-Lease"), ","), time.Now()})
	w.WriteHeader(status)
}

// serveReadBack answers GET /v1/workloads?requesterId=devcluster-sim with
// the jobs whose last accepted frame is older than expireAfter, failed by
// their lease.
func (f *fakeIngress) serveReadBack(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readBacks++
	if r.URL.Query().Get("requesterId") != "devcluster-sim" {
		http.Error(w, "want requesterId=devcluster-sim", http.StatusBadRequest)
		return
	}
	if got := r.Header.Values("Workload-Read-Back"); len(got) != 1 || got[0] != "1" {
		http.Error(w, "the read-back requires the header Workload-Read-Back: 1", http.StatusBadRequest)
		return
	}
	last := map[string]ingressRecord{}
	for _, rec := range f.recs {
		if rec.status == http.StatusOK && rec.info != nil {
			last[rec.info["id"].(string)] = rec
		}
	}
	type item struct {
		WorkloadInfo map[string]any `json:"workloadInfo"`
	}
	var items []item
	for id, rec := range last {
		if st := rec.info["state"]; f.expireAfter > 0 && (st == "queued" || st == "running") && time.Since(rec.at) > f.expireAfter {
			items = append(items, item{map[string]any{"id": id, "state": "failed", "error": "producer stopped reporting: lease of 5 s expired"}})
		}
	}
	json.NewEncoder(w).Encode(map[string]any{"workloads": items, "next": nil})
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
	s.crashShare, s.renewEvery = 0, 15*time.Millisecond // a producer that never crashes, renewing at the test's pace
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
	live, runID, renewals := 0, "", 0
	for i, r := range fake.accepted() {
		if r.httpMethod != http.MethodPost || r.path != "/v1/workloads/events" || r.contentType != "application/json" || r.origin != "" {
			t.Fatalf("request %d: %s %s Content-Type %q Origin %q", i, r.httpMethod, r.path, r.contentType, r.origin)
		}
		// A queued or running frame carries the lease; a terminal frame
		// and a removal may not.
		if st, _ := r.info["state"].(string); (st == "queued" || st == "running") != (r.lease == "5") || strings.Contains(r.lease, ",") {
			t.Fatalf("request %d: %s %s with Workload-Lease %q", i, r.method, st, r.lease)
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
		if j != nil && !j.removed && state == j.state && seq == j.seq && next[state] != "" {
			renewals++ // the job's last frame again: its lease renewed
			continue
		}
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
	if renewals == 0 {
		t.Error("no lease was renewed")
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

func TestSimulatorCrashesOnJobsNowAndThenAndLearnsOfTheirExpiryFromTheReadBack(t *testing.T) {
	fake := &fakeIngress{expireAfter: 100 * time.Millisecond}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	c := paperCluster(t, 1)
	var notes []string
	var notesMu sync.Mutex
	c.cfg.logf = func(f string, a ...any) {
		notesMu.Lock()
		notes = append(notes, fmt.Sprintf(f, a...))
		notesMu.Unlock()
	}
	c.nodes[0].ingress = strings.TrimPrefix(srv.URL, "http://")
	s := newSimulator(c)
	s.step = [2]time.Duration{time.Millisecond, 3 * time.Millisecond}
	s.crashShare, s.renewEvery = 0.3, 15*time.Millisecond
	s.start()
	eventually(t, "a crashed job retired by its lease", func() bool {
		s.stats.mu.Lock()
		defer s.stats.mu.Unlock()
		return s.stats.leases.expired >= 2
	})
	s.stop()
	if !strings.Contains(s.stats.String(), "retired by their lease") {
		t.Errorf("the traffic line does not tell of the expiries: %s", s.stats.String())
	}
	notesMu.Lock()
	defer notesMu.Unlock()
	var crashed, retired int
	for _, n := range notes {
		if strings.HasPrefix(n, "node1's producer crashed while ") {
			crashed++
		}
		if strings.HasPrefix(n, "node1 retired ") && strings.HasSuffix(n, ": producer stopped reporting: lease of 5 s expired") {
			retired++
		}
	}
	if crashed == 0 || retired < 2 {
		t.Fatalf("notes tell of %d crashes and %d expiries:\n%s", crashed, retired, strings.Join(notes, "\n"))
	}
	// A job the producer crashed on is never moved on.
	for _, n := range notes {
		rest, ok := strings.CutPrefix(n, "node1's producer crashed while ")
		if !ok {
			continue
		}
		id, lastState := strings.Fields(rest)[0], ""
		for _, r := range fake.accepted() {
			if r.info != nil && r.info["id"] == id {
				lastState, _ = r.info["state"].(string)
			}
		}
		if lastState != "queued" && lastState != "running" {
			t.Errorf("%s, crashed on, was reported %s afterwards", id, lastState)
		}
	}
}
