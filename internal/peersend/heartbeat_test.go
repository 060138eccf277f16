package peersend

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// running commits a running broker workload of node "self" to tb.
func running(t *testing.T, tb *statetable.Table, id string) {
	t.Helper()
	info := fmt.Sprintf(`{"id":%q,"model":"m","engine":"e","runId":"r-%s","state":"running","originatedFrom":"self"}`, id, id)
	ev, err := wireframe.ParseLifecycle(wireframe.MethodStarted, json.RawMessage(`{"workloadInfo":`+info+`}`))
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := tb.Commit(&statetable.Frame{Source: statetable.FromBroker, Life: &ev}); o != statetable.Applied {
		t.Fatalf("%s not committed: %v", id, o)
	}
}

func TestHeartbeatPacesEveryPassOverMostOfTheInterval(t *testing.T) {
	tb := statetable.New(statetable.Config{Self: "self", Retention: time.Minute, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour})
	for i := range 100 {
		running(t, tb, fmt.Sprintf("p-%03d", i))
	}
	h := newHeartbeatStream(tb, 2500*time.Millisecond, &Stats{}, 0, defaultRand)
	defer h.close()
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	h.begin(t0)
	if w := h.paceWait(t0); w != 0 {
		t.Fatalf("a pass waits %v before its first slice, want none", w)
	}
	if lines, _ := tb.TakePass(&h.pass, 50, wireframe.MaxBytes); len(lines) != 50 {
		t.Fatalf("took %d, want 50", len(lines))
	}
	// Half the runs sent: the rest is due over the second half of the
	// pass's span, passShare of the interval = 2 s.
	if w := h.paceWait(t0); w != time.Second {
		t.Fatalf("after half the runs at once, the pass waits %v, want 1s", w)
	}
	if w := h.paceWait(t0.Add(1100 * time.Millisecond)); w > 0 {
		t.Fatalf("a pass behind its pace waits %v, want none", w)
	}
}

// seeded is a fixed random source, so a test of the jitter sees the same
// draws at every run; locked, as senders draw from their goroutines.
func seeded() randN {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(37, 6))
	return func(n int64) int64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Int64N(n)
	}
}

// passSpread is the earliest and latest of times, and how many distinct.
func passSpread(times []time.Time) (first, last time.Time, distinct int) {
	seen := map[time.Time]bool{}
	first, last = times[0], times[0]
	for _, x := range times {
		seen[x] = true
		if x.Before(first) {
			first = x
		}
		if x.After(last) {
			last = x
		}
	}
	return first, last, len(seen)
}

// The streams of one snapshot (every node's, created at one instant) start
// their first passes spread over the second half of the interval, not
// together; a member that
// joins with a mark is still re-asserted at once.
func TestHeartbeatFirstPassesOfOneSnapshotSpreadOverTheInterval(t *testing.T) {
	tb := statetable.New(statetable.Config{Self: "self", Retention: time.Minute, MaxLive: 10, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour})
	const interval, n = 30 * time.Second, 64
	rnd := seeded()
	t0 := time.Now()
	var firsts []time.Time
	for range n {
		h := newHeartbeatStream(tb, interval, &Stats{}, 0, rnd)
		firsts = append(firsts, h.next)
	}
	t1 := time.Now()
	first, last, distinct := passSpread(firsts)
	if distinct < n*9/10 {
		t.Fatalf("%d streams created together have %d distinct first passes", n, distinct)
	}
	if first.Sub(t0) < interval/2 || first.Sub(t1) > interval*5/8 || last.Sub(t0) < interval*7/8 || last.Sub(t1) > interval {
		t.Fatalf("first passes from %v to %v after creation, want spread over (%v, %v]", first.Sub(t0), last.Sub(t0), interval/2, interval)
	}
	if h := newHeartbeatStream(tb, interval, &Stats{}, 5, rnd); !h.prompt || h.next.After(time.Now()) {
		t.Fatalf("a member that joins with a mark is re-asserted at %v, want at once", h.next.Sub(time.Now()))
	}
}

// Passes that started together start their next ones an interval later,
// give or take passJitter, not together: they drift apart.
func TestHeartbeatNextPassesDriftApartWithinTheirJitter(t *testing.T) {
	tb := statetable.New(statetable.Config{Self: "self", Retention: time.Minute, MaxLive: 10, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour})
	const interval, n = 30 * time.Second, 64
	rnd := seeded()
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	var nexts []time.Time
	for range n {
		h := newHeartbeatStream(tb, interval, &Stats{}, 0, rnd)
		h.begin(t0)
		h.finish(t0.Add(time.Second))
		nexts = append(nexts, h.next)
		h.close()
	}
	first, last, distinct := passSpread(nexts)
	if distinct < n*9/10 {
		t.Fatalf("%d passes begun together have %d distinct next passes", n, distinct)
	}
	lo, hi := t0.Add(interval*(100-passJitter)/100), t0.Add(interval*(100+passJitter)/100)
	if first.Before(lo) || last.After(hi) {
		t.Fatalf("next passes from %v to %v, want within %v ± %d %%", first.Sub(t0), last.Sub(t0), interval, passJitter)
	}
	if last.Sub(first) < interval*passJitter/100 {
		t.Fatalf("next passes within %v of each other, want spread over most of ± %d %%", last.Sub(first), passJitter)
	}
}
