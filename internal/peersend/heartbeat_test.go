package peersend

import (
	"encoding/json"
	"fmt"
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
	h := newHeartbeatStream(tb, 2500*time.Millisecond, &Stats{}, 0)
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
