package ingress

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// BenchmarkReadBackLimit1 is ?requesterId=X&limit=1 on a set of 100,000
// ingress jobs, when X's 1,000 jobs are at the head of the set ("hit") and
// when X has none ("none"): the two look at the same entries.
func BenchmarkReadBackLimit1(b *testing.B) {
	const self = "this-node"
	tb := statetable.New(statetable.Config{Self: self, Retention: time.Minute, MaxLive: ReadBackScanMax,
		MaxLiveBytes: 1 << 30, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour})
	for i := range ReadBackScanMax {
		requester := "x"
		if i >= 1000 {
			requester = "z"
		}
		info := fmt.Sprintf(`{"id":"w-%d","runId":"r","model":"m","engine":"e","state":"running","requesterId":%q,"originatedFrom":%q}`, i, requester, self)
		ev, err := wireframe.ParseLifecycle(wireframe.MethodStarted, json.RawMessage(`{"workloadInfo":`+info+`}`))
		if err != nil {
			b.Fatal(err)
		}
		if o, _ := tb.Commit(&statetable.Frame{Source: statetable.FromProducer, Life: &ev}); o != statetable.Applied {
			b.Fatalf("job %d not committed: %v", i, o)
		}
	}
	s := &Server{cfg: Config{Table: tb, Stats: &Stats{}}}
	for _, c := range []struct{ name, requester string }{{"hit", "x"}, {"none", "y"}} {
		b.Run(c.name, func(b *testing.B) {
			q := readBackQuery{limit: 1, requester: &c.requester}
			for b.Loop() {
				s.readBack(httptest.NewRecorder(), q)
			}
		})
	}
}
