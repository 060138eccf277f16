package wlmclient

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A producer that mirrors a scheduler (nvpair-wlm slurm) reports the
// scheduler's times, takes its jobs back after its own restart, and starts
// a new run of a job whose run was ended for it.

func TestTheTimesGivenAreTheFramesTimes(t *testing.T) {
	f := &fakeIngress{}
	c := newClient(t, Config{Addr: serve(t, f), Lease: -1})
	created, started, ended := time.UnixMilli(1_800_000_000_000), time.UnixMilli(1_800_000_001_000), time.UnixMilli(1_800_000_009_000)
	job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "slurm", CreatedAt: created})
	if err != nil {
		t.Fatal(err)
	}
	job.StartAt(started)
	job.Requeue()
	job.StartAt(started.Add(time.Second))
	job.FailAt(ended, "TIMEOUT")
	closeWithin(t, c, 5*time.Second)
	rs := f.requests()
	if len(rs) != 5 {
		t.Fatalf("%d frames, want 5", len(rs))
	}
	want := []struct {
		state          string
		started, ended any
	}{{"queued", nil, nil}, {"running", float64(started.UnixMilli()), nil}, {"queued", nil, nil},
		{"running", float64(started.UnixMilli() + 1000), nil}, {"failed", float64(started.UnixMilli() + 1000), float64(ended.UnixMilli())}}
	for i, w := range want {
		info := rs[i].frame.Params.WorkloadInfo
		if info["state"] != w.state || info["startedAt"] != w.started || info["completedAt"] != w.ended ||
			info["createdAt"] != float64(created.UnixMilli()) || rs[i].seq() != int64(i+1) {
			t.Errorf("frame %d: %v, want state %s startedAt %v completedAt %v createdAt %d", i, info, w.state, w.started, w.ended, created.UnixMilli())
		}
	}
	if job.State() != "failed" || job.Seq() != 5 {
		t.Errorf("the job says state %q seq %d", job.State(), job.Seq())
	}
}

func TestAgainstTheDaemonAJobResumedAfterARestartGoesOnWithItsSeqAndLease(t *testing.T) {
	d := startDaemon(t)
	c1 := newClient(t, Config{Addr: d.addr, Producer: "mirror", Lease: 30 * time.Second})
	job, err := c1.Submit(context.Background(), JobSpec{Model: "m", Engine: "slurm", RequesterID: "mirror/alice"})
	if err != nil {
		t.Fatal(err)
	}
	job.Start()
	closeWithin(t, c1, 10*time.Second) // the producer stops; its job lives on, leased

	c2 := newClient(t, Config{Addr: d.addr, Producer: "mirror", Lease: 30 * time.Second})
	ws, err := c2.ReadBack(context.Background(), "mirror/alice")
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 || ws[0].ID() != job.ID() || ws[0].State() != "running" || ws[0].Seq() != 2 || ws[0].LeaseDeadline.IsZero() {
		t.Fatalf("the read-back lists %+v, want the running job with seq 2 and a lease", ws)
	}
	resumed, err := c2.Resume(ws[0])
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the resumed job's lease renewed at once (its frame again)", func() bool { return len(d.upserts(job.ID())) == 3 })
	resumed.Complete()
	closeWithin(t, c2, 10*time.Second)
	eventually(t, "the end at the broker", func() bool { return len(d.upserts(job.ID())) == 4 })
	ups := d.upserts(job.ID())
	if ups[2]["seq"] != 2.0 || ups[2]["state"] != "running" || ups[3]["seq"] != 3.0 || ups[3]["state"] != "completed" {
		t.Fatalf("after the resume the broker got %v then %v, want running seq 2 then completed seq 3", ups[2], ups[3])
	}
	if _, err := c2.Resume(Workload{Info: map[string]any{"id": "x", "state": "bogus"}}); err == nil {
		t.Error("a workload in no state was resumed")
	}
}

func TestAgainstTheDaemonARerunRemovesTheEndedRunBeforeTheNewOneStarts(t *testing.T) {
	d := startDaemon(t)
	c := newClient(t, Config{Addr: d.addr, Lease: 30 * time.Second})
	job, err := c.Submit(context.Background(), JobSpec{Model: "m", Engine: "slurm"})
	if err != nil {
		t.Fatal(err)
	}
	job.Fail("producer stopped reporting")
	if err := job.Rerun(job.ID()+"~1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := job.Rerun("again", time.Now()); err != ErrJobLive {
		t.Errorf("a rerun of a live job: %v, want ErrJobLive", err)
	}
	job.Start()
	job.Complete()
	closeWithin(t, c, 10*time.Second)
	var got []string
	eventually(t, "the rerun's frames at the broker", func() bool {
		got = got[:0]
		for _, f := range d.brokerFrames() {
			switch {
			case f.Method == "workloads:remove" && f.Params.WorkloadID == job.ID():
				got = append(got, "removed")
			case f.Method == "workloads:upsert" && f.Params.WorkloadInfo["id"] == job.ID():
				got = append(got, fmt.Sprintf("%v %v", f.Params.WorkloadInfo["state"], f.Params.WorkloadInfo["runId"]))
			}
		}
		return len(got) == 6
	})
	id := job.ID()
	want := []string{"queued " + id, "failed " + id, "removed", "queued " + id + "~1", "running " + id + "~1", "completed " + id + "~1"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("the broker got %q, want %q", got, want)
	}
}

func TestReadBackFollowsNextWaitsOutABusyNodeAndIsBounded(t *testing.T) {
	var calls atomic.Int64
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Workload-Read-Back") != "1" {
			http.Error(w, "the read-back requires the header Workload-Read-Back: 1", http.StatusBadRequest)
			return
		}
		switch n := calls.Add(1); {
		case n == 1:
			io.WriteString(w, `{"workloads":[{"workloadInfo":{"id":"a","state":"running","seq":9007199254740993},"leaseDeadline":1800000000000}],"next":"c1"}`)
		case n == 2:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "2 read-backs are in progress", http.StatusServiceUnavailable)
		case r.URL.Query().Get("cursor") == "c1":
			io.WriteString(w, `{"workloads":[{"workloadInfo":{"id":"b","state":"completed"},"leaseDeadline":null}],"next":null}`)
		}
	}))
	c := newClient(t, Config{Addr: addr})
	ws, err := c.ReadBack(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].ID() != "a" || ws[0].Seq() != 9007199254740993 || ws[0].LeaseDeadline.UnixMilli() != 1800000000000 ||
		ws[1].ID() != "b" || !ws[1].LeaseDeadline.IsZero() || calls.Load() != 3 {
		t.Fatalf("read back %+v in %d calls", ws, calls.Load())
	}
	big := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"workloads":[`)
		io.WriteString(w, strings.Repeat(" ", readBackPageMax))
		io.WriteString(w, `],"next":null}`)
	}))
	if _, err := newClient(t, Config{Addr: big}).ReadBack(context.Background(), ""); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("an answer over the page bound: %v", err)
	}
	for _, body := range []string{`{}`, `{"workloads":[{"workloadInfo":{}}]}`, `[]`} {
		odd := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
		if _, err := newClient(t, Config{Addr: odd}).ReadBack(context.Background(), ""); err == nil {
			t.Errorf("%s read back without an error", body)
		}
	}
}
