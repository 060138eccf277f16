package e2e

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// leaseProcPair starts node A with its ingress and node B as its pinned
// peer, real processes on ports they pick, and returns them with A's
// ingress address once each has the other as its target.
func leaseProcPair(t *testing.T, extraA ...string) (a, b *daemonProc, nodes []devpki.Node, ingress string) {
	t.Helper()
	nodes = writeCluster(t, 2)
	a = startDaemon(t, nodeArgs(nodes[0], 0, append([]string{"--local-ingress", "127.0.0.1:0"}, extraA...)...)...)
	b = startDaemon(t, nodeArgs(nodes[1], 0)...)
	a.port, b.port = a.boundPeerPort(), b.boundPeerPort()
	a.WaitMethod("discovery:subscribe", 1)
	b.WaitMethod("discovery:subscribe", 1)
	a.discover(nodes[1], b.port)
	b.discover(nodes[0], a.port)
	a.waitLog("broadcast targets changed", "total=1")
	b.waitLog("broadcast targets changed", "total=1")
	return a, b, nodes, a.loggedValue("local ingress listening", "addr")
}

// procTerminalStates is terminalStates for a daemon process's broker.
func procTerminalStates(d *daemonProc, id string) []string {
	var out []string
	for _, w := range d.Upserts() {
		s, _ := w["state"].(string)
		if w["id"] == id && wireframe.IsTerminalState(s) && (len(out) == 0 || out[len(out)-1] != s) {
			out = append(out, s)
		}
	}
	return out
}

// procExpiry returns the expiry of id at a daemon process's broker.
func procExpiry(d *daemonProc, id string) map[string]any {
	for _, w := range d.Upserts() {
		if w["id"] == id && w["state"] == "failed" && w["error"] == leaseExpiryError(statetable.MinLeaseSeconds) {
			return w
		}
	}
	return nil
}

func postProc(t *testing.T, ingress string, w map[string]any, seconds int) {
	t.Helper()
	var h []string
	if seconds > 0 {
		h = []string{leaseHeader, itoa(seconds)}
	}
	if st, text := testkit.PostIngress(t, ingress, string(testframe.Lifecycle(w, nil)), h...); st != http.StatusOK {
		t.Fatalf("post %s %s: %d %s", w["id"], w["state"], st, text)
	}
}

func TestProcessALeasedJobNotRenewedTurnsFailedAtItsBrokerAndAPeerWithinItsLeasePlusOneSecond(t *testing.T) {
	t.Parallel()
	a, b, nodes, ingress := leaseProcPair(t)

	// closed is finished before its lease runs out; renewed is renewed every
	// second; crashed, posted after closed, is never heard of again.
	postProc(t, ingress, leasedInfo("closed", "running", 1), statetable.MinLeaseSeconds)
	postProc(t, ingress, leasedInfo("renewed", "running", 1), statetable.MinLeaseSeconds)
	postProc(t, ingress, leasedInfo("crashed", "running", 1), statetable.MinLeaseSeconds)
	accepted := time.Now()
	postProc(t, ingress, leasedInfo("closed", "completed", 2), 0)

	stop := make(chan struct{})
	var renewals sync.WaitGroup
	renewals.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				st, _ := testkit.PostIngress(t, ingress, string(testframe.Lifecycle(leasedInfo("renewed", "running", 1), nil)), leaseHeader, itoa(statetable.MinLeaseSeconds))
				if st != http.StatusOK {
					t.Errorf("renewal: %d", st)
					return
				}
			}
		}
	})
	defer func() { close(stop); renewals.Wait() }()

	for _, d := range []*daemonProc{a, b} {
		testkit.Eventually(t, "the expiry of crashed", func() bool { return procExpiry(d, "crashed") != nil })
	}
	took := time.Since(accepted)
	if took > (statetable.MinLeaseSeconds+1)*time.Second {
		t.Fatalf("the expiry reached both brokers %s after the post, over the lease plus 1 s", took)
	}
	t.Logf("a %d s lease ran out; the job was failed at its broker and the peer's %s after it was posted", statetable.MinLeaseSeconds, took.Round(time.Millisecond))
	for _, d := range []*daemonProc{a, b} {
		w := procExpiry(d, "crashed")
		if w["originatedFrom"] != nodes[0].ID || w["seq"] != 2.0 || w["harnessSlot"] != 3.0 || w["requesterId"] != "lease-test" {
			t.Errorf("the expiry %v does not carry the job's fields", w)
		}
		if got := procTerminalStates(d, "closed"); !slices.Equal(got, []string{"completed"}) {
			t.Errorf("the job closed before its lease ran out got terminal states %v, want completed alone", got)
		}
		if got := procTerminalStates(d, "renewed"); len(got) != 0 {
			t.Errorf("the renewed job got terminal states %v", got)
		}
	}

	// The read-back shows the failed job unleased and the renewed one with
	// its deadline ahead.
	st, _, body := testkit.GetReadBack(t, ingress, "requesterId=lease-test")
	var answer testkit.ReadBackAnswer
	if st != http.StatusOK || json.Unmarshal(body, &answer) != nil {
		t.Fatalf("read-back: %d %s", st, body)
	}
	seen := map[string]bool{}
	for _, w := range answer.Workloads {
		id := w.WorkloadInfo["id"].(string)
		seen[id] = true
		switch id {
		case "renewed":
			if w.LeaseDeadline == nil || *w.LeaseDeadline <= time.Now().UnixMilli() {
				t.Errorf("renewed listed with deadline %v, want one ahead", w.LeaseDeadline)
			}
		case "crashed", "closed":
			if w.LeaseDeadline != nil || !wireframe.IsTerminalState(w.WorkloadInfo["state"].(string)) {
				t.Errorf("%s listed as %v with deadline %v, want terminal and unleased", id, w.WorkloadInfo["state"], w.LeaseDeadline)
			}
		}
	}
	if len(seen) != 3 {
		t.Errorf("the read-back listed %v, want the three jobs", answer.IDs())
	}
}

// A producer's terminal frame that comes around its lease's deadline races
// the expiry: whichever the ingress takes first is written first, at the
// broker and at the peer, and the producer's frame, always the later word
// when it comes second, is where both end.
func TestProcessExpiryRacingALateTerminalFrameEndsInOneTerminalStateOnBothNodes(t *testing.T) {
	t.Parallel()
	a, b, _, ingress := leaseProcPair(t)
	const jobs = 12
	posted := make([]time.Time, jobs)
	for i := range jobs {
		postProc(t, ingress, leasedInfo("race-"+itoa(i), "running", 1), statetable.MinLeaseSeconds)
		posted[i] = time.Now()
	}
	// Each job's terminal frame is sent at its deadline plus an offset from
	// -165 ms to +165 ms, so some beat their expiry and some follow it.
	var wg sync.WaitGroup
	for i := range jobs {
		at := posted[i].Add(statetable.MinLeaseSeconds*time.Second + time.Duration(i*30-165)*time.Millisecond)
		wg.Go(func() {
			time.Sleep(time.Until(at))
			if st, text := testkit.PostIngress(t, ingress, string(testframe.Lifecycle(leasedInfo("race-"+itoa(i), "completed", 2), nil))); st != http.StatusOK {
				t.Errorf("the late terminal frame of race-%d: %d %s", i, st, text)
			}
		})
	}
	wg.Wait()

	outcomes := map[string]int{}
	for i := range jobs {
		id := "race-" + itoa(i)
		// The peer is sent each run at its latest state: when the expiry
		// and the producer's frame both commit before its sender reads
		// them, it is sent the completed run alone. So both brokers end on
		// completed, and the peer's states are the origin's or its last.
		var atA, atB []string
		if !testkit.HoldsWithin(testkit.WaitTimeout, func() bool {
			atA, atB = procTerminalStates(a, id), procTerminalStates(b, id)
			return len(atA) > 0 && atA[len(atA)-1] == "completed" && len(atB) > 0 && atB[len(atB)-1] == "completed"
		}) {
			t.Fatalf("%s: terminal states %v at the origin's broker, %v at the peer's; want both to end completed", id, atA, atB)
		}
		if !slices.Equal(atA, []string{"completed"}) && !slices.Equal(atA, []string{"failed", "completed"}) {
			t.Errorf("%s: terminal states %v, want completed, or the expiry then completed", id, atA)
		}
		if !slices.Equal(atB, atA) && !slices.Equal(atB, []string{"completed"}) {
			t.Errorf("%s: the peer's broker saw %v, the origin's %v: want the same, or the latest alone", id, atB, atA)
		}
		outcomes[atA[0][:1]+itoa(len(atA))]++
	}
	t.Logf("outcomes (c1: the producer's frame first, no expiry; f2: the expiry, then the producer's frame): %v", outcomes)
}
