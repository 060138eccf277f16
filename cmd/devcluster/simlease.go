package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// The ingress path's producer leases its jobs, as a well-behaved producer
// does (README, "Leases"): its queued and running frames carry
// Workload-Lease, it renews each live job's lease at a third of its length,
// and now and then it "crashes" on a job: it stops reporting it, and node
// 1's daemon retires the job as failed when its lease runs out. The
// producer learns of that from the read-back (GET /v1/workloads), as a
// restarted producer would.

const (
	leaseHeader     = "Workload-Lease"
	simLeaseSeconds = 5 // the shortest lease the daemon takes, so an expiry shows within seconds
	simRenewEvery   = simLeaseSeconds * time.Second / 3
	// simCrashShare is the share of the ingress path's steps that would
	// move a live job on where the producer crashes on it instead.
	simCrashShare = 0.08
)

// leased reports whether a frame of method carries a lease: the live ones.
func leased(method string) bool {
	return method == "workload:submitted" || method == "workload:started"
}

// simLeaseStats counts the ingress producer's crashes and the expiries
// that retired them; guarded by simStats.mu.
type simLeaseStats struct {
	crashed, expired int
}

func (l simLeaseStats) String() string {
	if l.crashed == 0 {
		return ""
	}
	return fmt.Sprintf("; producer crashed on %d jobs, %d retired by their lease", l.crashed, l.expired)
}

// crash stops reporting j, as a producer killed while running it would.
func (p *simPath) crash(j *simJob) {
	j.crashed = true
	p.s.stats.add(func(s *simStats) { s.leases.crashed++ })
	p.s.c.cfg.logf("node1's producer crashed while %s was %s: its %d s lease will retire it", j.info.ID, j.info.State, simLeaseSeconds)
}

// tendLeases renews the lease of every job the ingress producer still
// runs whose last frame is a third of a lease old, by sending that frame
// again, and asks the read-back which of the jobs it crashed on the node
// has retired.
func (p *simPath) tendLeases(ctx context.Context, now time.Time) {
	pending := 0
	for _, j := range p.jobs {
		switch {
		case j.terminal():
		case j.crashed:
			pending++
		case now.Sub(j.sentAt) >= p.s.renewEvery:
			method := "workload:submitted"
			if j.info.State == "running" {
				method = "workload:started"
			}
			raw, err := json.Marshal(j.info)
			if err == nil && p.s.post(ctx, method, workloadParams(raw)) {
				j.sentAt = now
			}
		}
	}
	if pending > 0 {
		p.learnExpiries(now)
	}
}

// learnExpiries reads back this producer's jobs and marks those it crashed
// on that the node now shows failed as finished.
func (p *simPath) learnExpiries(now time.Time) {
	listed, err := p.s.readBack()
	if err != nil {
		p.s.stats.add(func(s *simStats) { s.lastProblem = "read-back: " + err.Error() })
		return
	}
	for _, j := range p.jobs {
		w, ok := listed[j.info.ID]
		if !j.crashed || j.terminal() || !ok || w.State != "failed" {
			continue
		}
		j.info.State, j.doneAt = "failed", now
		p.s.stats.add(func(s *simStats) { s.leases.expired++ })
		p.s.c.cfg.logf("node1 retired %s: %s", j.info.ID, w.Error)
	}
}

// readBackWorkload is what the simulator reads of a listed workload.
type readBackWorkload struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Error string `json:"error"`
}

// readBack lists the workloads node 1's ingress holds for this producer,
// page by page.
func (s *simulator) readBack() (map[string]readBackWorkload, error) {
	base := strings.TrimSuffix(s.url, "/events")
	out := map[string]readBackWorkload{}
	cursor := ""
	for {
		u := base + "?requesterId=devcluster-sim"
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		// The read-back answers only a request that carries this header,
		// which no web page can send (see the README's read-back section).
		req.Header.Set("Workload-Read-Back", "1")
		resp, err := s.client.Do(req)
		if err != nil {
			return nil, err
		}
		var page struct {
			Workloads []struct {
				WorkloadInfo readBackWorkload `json:"workloadInfo"`
			} `json:"workloads"`
			Next *string `json:"next"`
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		}
		if err == nil {
			err = json.Unmarshal(body, &page)
		}
		if err != nil {
			return nil, err
		}
		for _, w := range page.Workloads {
			out[w.WorkloadInfo.ID] = w.WorkloadInfo
		}
		if page.Next == nil {
			return out, nil
		}
		cursor = *page.Next
	}
}
