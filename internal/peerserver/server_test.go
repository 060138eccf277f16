package peerserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/wireframe"
)

// flakyBroker fails every write while fail is set and records the rest.
type flakyBroker struct {
	mu    sync.Mutex // guards fail and lines
	fail  bool
	lines []string
}

func (b *flakyBroker) send(method string, v any) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail {
		return errors.New("broken pipe")
	}
	line, _ := json.Marshal(v)
	b.lines = append(b.lines, method+" "+string(line))
	return nil
}

func (b *flakyBroker) SendUpsert(info json.RawMessage) error {
	return b.send(wireframe.MethodUpsert, info)
}
func (b *flakyBroker) SendRemove(r *wireframe.Removal) error {
	return b.send(wireframe.MethodRemove, r.Ref)
}

func (b *flakyBroker) setFail(fail bool) {
	b.mu.Lock()
	b.fail = fail
	b.mu.Unlock()
}

func (b *flakyBroker) written() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.lines...)
}

// newTestServer is a Server writing to broker, with no pins to check.
func newTestServer(broker Broker) *Server {
	return New(Config{
		Self: "this-node", WorkloadMaxBytes: wireframe.DefaultWorkloadMaxBytes, Broker: broker,
		Bodies: httpguard.NewRequestBodies().Peer, Waiters: brokerio.NewWaiters("peer", brokerio.WaitersMax),
		FramesReceived: promtext.NewCounterVec(), FieldBoundRefusals: promtext.NewCounterVec(), WorkloadBoundRefusals: promtext.NewCounterVec(),
		Log: slog.New(slog.DiscardHandler),
	})
}

// A failed broker write records nothing in the dedup, so the sender's
// retry is written, once.
func TestPeerEventAfterFailedBrokerWriteIsDeliveredOnRetry(t *testing.T) {
	info := `{"id":"job-retry","runId":"run-1","model":"m","engine":"e","state":"running","originatedFrom":"other-node","seq":1}`
	cases := []struct{ name, body, method string }{
		{"lifecycle", fmt.Sprintf(`{"jsonrpc":"2.0","method":%q,"params":{"workloadInfo":%s}}`, wireframe.MethodStarted, info), wireframe.MethodUpsert},
		{"removal", `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"job-retry","originatedFrom":"other-node"}}`, wireframe.MethodRemove},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			broker := &flakyBroker{fail: true}
			s := newTestServer(broker)
			ev, err := ParseFrame([]byte(c.body), wireframe.DefaultWorkloadMaxBytes)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.relayPeerEvent(&ev); err == nil {
				t.Fatal("relay to a failing broker reported success")
			}
			broker.setFail(false)
			for i, wantDup := range []bool{false, true} {
				dup, err := s.relayPeerEvent(&ev)
				if err != nil || dup != wantDup {
					t.Fatalf("attempt %d after the failure: duplicate=%v err=%v, want duplicate=%v", i+2, dup, err, wantDup)
				}
			}
			if lines := broker.written(); len(lines) != 1 || !strings.HasPrefix(lines[0], c.method+" ") {
				t.Fatalf("broker lines after the retry = %q, want one %s", lines, c.method)
			}
		})
	}
}
