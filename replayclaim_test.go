package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/dev/pairbroker"
	"nvpair-workload-manager/internal/dev/pairshadow"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/ingressmark"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// The ingress mark (spec 3.5.3): an ingress frame's broker line carries
// it, its line to the peers does not, and the broker's replay of a job
// the journal lost (a crash between the broker write and the journal
// record) is the producer's again, while a mark this node did not make
// for that run hands nothing to anyone.

// markKey is a node's ingress mark key; fill tells two keys apart.
func markKey(fill byte) []byte { return bytes.Repeat([]byte{fill}, 32) }

// withMarkKey gives the node an ingress mark key, as main does from the
// app dir's file.
func withMarkKey(key []byte) nodeOption { return func(c *Config) { c.IngressMarkKey = key } }

// withNodeID gives the node id: the node started again after a crash is
// the same node.
func withNodeID(id string) nodeOption { return func(c *Config) { c.NodeID = id } }

// markedPost is a producer's queued frame of id, leased for 30 s.
func markedPost(id string) []byte {
	return testframe.Lifecycle(leasedInfo(id, "queued", 1), nil)
}

// replayOf is what PAIR's broker replays to the node's next daemon of
// what n wrote to it: the Jobs store's records of the node, as
// workloadstore.ReplayForNode gives them (through the model, judged by
// PAIR's own store where it is beside the repository).
func replayOf(t *testing.T, n *testNode) []string {
	t.Helper()
	var lines []string
	for _, r := range n.broker.JobsList().Replay(n.id, pairbroker.ReplayWindow) {
		lines = append(lines, string(wireframe.EncodeNotification(pairbroker.ReplayMethod(r.State), json.RawMessage(`{"workloadInfo":`+string(r.Info)+`}`))))
	}
	return lines
}

// crashed posts id on a node with key and returns the node id and the
// broker's replay of the job: the frame reached the broker, and the node
// is taken to have crashed before its journal record was durable (the
// next node starts with an empty table).
func crashed(t *testing.T, key []byte, id string) (string, []string) {
	t.Helper()
	a, _ := ifxNode(t, withMarkKey(key))
	if _, err := a.m.ingestLocalLeased(markedPost(id), []string{"30"}); err != nil {
		t.Fatal(err)
	}
	a.broker.WaitUpserts(id, 1)
	replay := replayOf(t, a)
	if len(replay) != 1 || !strings.Contains(replay[0], `"`+wireframe.IngressMarkName+`":"30.`) {
		t.Fatalf("the broker replays %q, want the job with its mark", replay)
	}
	return a.id, replay
}

// The producer's whole job after the restart, each frame as a producer
// retries and goes on: the queued frame again, running, completed, the
// removal.
func producerGoesOn(t *testing.T, n *testNode, id string) []error {
	t.Helper()
	var errs []error
	for _, f := range []struct {
		body  []byte
		lease []string
	}{
		{markedPost(id), []string{"30"}},
		{testframe.Lifecycle(leasedInfo(id, "running", 2), nil), []string{"30"}},
		{testframe.Lifecycle(leasedInfo(id, "completed", 3), nil), nil},
		{testframe.Removal(id, ""), nil},
	} {
		_, err := n.m.ingestLocalLeased(f.body, f.lease)
		errs = append(errs, err)
	}
	return errs
}

func TestAReplayOfAnIngressJobTheJournalLostIsItsProducersAgain(t *testing.T) {
	key := markKey(1)
	id, replay := crashed(t, key, "lost-1")
	b, q := ifxNode(t, withMarkKey(key), withNodeID(id))
	b.m.handleLine([]byte(replay[0]))
	if got := ifxDrain(q); len(got) != 1 || bytes.Contains(got[0].line, []byte(wireframe.IngressMarkName)) {
		t.Fatalf("the peers are sent %s, want the job without the mark", ifxDescribe(got))
	}
	if err := b.m.table.CheckProducer(wireframe.WorkloadRef{Origin: id, ID: "lost-1"}); err != nil {
		t.Fatalf("after the replay the job is not its producer's: %v", err)
	}
	k := wireframe.WorkloadKey{Origin: id, Engine: "llamacpp", RunID: "run-lost-1", ID: "lost-1"}
	if at := b.m.table.LeaseOf(k); at.IsZero() {
		t.Fatal("the job's 30 s lease was not armed again: a producer that crashed with the node would leave it live for good")
	}
	for i, err := range producerGoesOn(t, b, "lost-1") {
		if err != nil {
			t.Fatalf("the producer's frame %d after the restart: %v, want it taken", i, err)
		}
	}
	if n := b.m.replayClaims.Load(); n != 1 {
		t.Fatalf("%d replay claims counted, want 1", n)
	}
	if !b.logs.Contains("the job is its producer's again", "id=lost-1", "leaseSeconds=30") {
		t.Fatalf("no line for the claim: %s", b.logs.String())
	}
}

// Without the mark (a node with no key: the frames before it, or a key
// that could not be made) the same replay makes the job the broker's and
// the producer is refused: what the mark is for.
func TestWithoutTheMarkTheReplayOfALostIngressJobIsTheBrokers(t *testing.T) {
	a, _ := ifxNode(t)
	if _, err := a.m.ingestLocalLeased(markedPost("lost-2"), []string{"30"}); err != nil {
		t.Fatal(err)
	}
	a.broker.WaitUpserts("lost-2", 1)
	replay := replayOf(t, a)
	if strings.Contains(replay[0], wireframe.IngressMarkName) {
		t.Fatalf("a node without a key marked its frame: %s", replay[0])
	}
	b, _ := ifxNode(t, withMarkKey(markKey(1)), withNodeID(a.id))
	b.m.handleLine([]byte(replay[0]))
	if err := producerGoesOn(t, b, "lost-2")[0]; !statetable.IsBrokerOwned(err) {
		t.Fatalf("the producer's retry: %v, want the broker's 409", err)
	}
}

// A mark this node did not make for the replayed run is not its word: it
// is cut out before the peers, counted, and the job is the broker's.
func TestAMarkOfAnotherKeyOrAnotherJobHandsNothingToAProducer(t *testing.T) {
	id, replay := crashed(t, markKey(1), "lost-3")
	other := strings.Replace(replay[0], `"id":"lost-3"`, `"id":"other-3"`, 1)
	mark := regexp.MustCompile(`"` + wireframe.IngressMarkName + `":"[^"]*"`).FindString(replay[0])
	twice := strings.Replace(replay[0], mark, mark+","+mark, 1)
	for _, tc := range []struct {
		name, job, line string
		key             []byte
	}{
		{"another key", "lost-3", replay[0], markKey(2)},
		{"another job", "other-3", other, markKey(1)},
		{"a node without a key", "lost-3", replay[0], nil},
		{"the mark twice", "lost-3", twice, markKey(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []nodeOption{withNodeID(id)}
			if tc.key != nil {
				opts = append(opts, withMarkKey(tc.key))
			}
			b, q := ifxNode(t, opts...)
			b.m.handleLine([]byte(tc.line))
			if got := ifxDrain(q); len(got) != 1 || bytes.Contains(got[0].line, []byte(wireframe.IngressMarkName)) {
				t.Fatalf("the peers are sent %s, want the job without the mark", ifxDescribe(got))
			}
			if err := b.m.table.CheckProducer(wireframe.WorkloadRef{Origin: id, ID: tc.job}); !statetable.IsBrokerOwned(err) {
				t.Fatalf("the job after the replay: %v, want the broker's", err)
			}
			if b.m.marksUnchecked.Load() != 1 || !b.logs.Contains("an ingress mark this node did not make") {
				t.Fatalf("the unchecked mark was not counted (%d) or logged", b.m.marksUnchecked.Load())
			}
		})
	}
}

// A job the broker owns stays the broker's whatever its replay carries: a
// mark of this node's (its producer's frame lost the race to the broker's
// own, spec 3.5.3) does not hand it over.
func TestAMarkInABrokerOwnedJobsReplayDoesNotHandItToAProducer(t *testing.T) {
	key := markKey(1)
	id, replay := crashed(t, key, "proxy-4")
	b, _ := ifxNode(t, withMarkKey(key), withNodeID(id))
	b.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("proxy-4", "running", id))))
	b.m.handleLine([]byte(replay[0]))
	if err := producerGoesOn(t, b, "proxy-4")[0]; !statetable.IsBrokerOwned(err) {
		t.Fatalf("a producer's frame for the broker's job after a marked replay: %v, want 409", err)
	}
	if b.m.replayClaims.Load() != 0 {
		t.Fatal("a claim was counted")
	}
}

// A stock peer is sent exactly what it was sent before the mark: the
// frame as the producer posted it, from the table's line, never the
// broker's.
func TestThePeersAreSentAnIngressFrameWithoutItsMark(t *testing.T) {
	id := "11111111-2222-4333-8444-555555555555"
	sentBy := func(opts ...nodeOption) (broker map[string]any, peer []byte) {
		n, q := ifxNode(t, append(opts, withNodeID(id))...)
		if _, err := n.m.ingestLocalLeased(markedPost("job-5"), []string{"30"}); err != nil {
			t.Fatal(err)
		}
		n.broker.WaitUpserts("job-5", 1)
		got := ifxDrain(q)
		if len(got) != 1 {
			t.Fatalf("the peers are sent %s", ifxDescribe(got))
		}
		return n.broker.Upserts()[0], got[0].line
	}
	brokerMarked, peerMarked := sentBy(withMarkKey(markKey(1)))
	_, peerPlain := sentBy()
	if _, ok := brokerMarked[wireframe.IngressMarkName]; !ok {
		t.Fatalf("the broker's upsert has no mark: %v", brokerMarked)
	}
	if !bytes.Equal(peerMarked, peerPlain) {
		t.Fatalf("a marking node sends the peers\n%s\nwhere one without the mark sends\n%s", peerMarked, peerPlain)
	}
}

// A producer may not send the mark: it would reach the broker beside the
// node's own.
func TestAProducerMayNotSendTheIngressMark(t *testing.T) {
	n, q := ifxNode(t, withMarkKey(markKey(1)))
	w := leasedInfo("job-6", "queued", 1)
	w[wireframe.IngressMarkName] = "30.AAAAAAAAAAAAAAAAAAAAAA"
	_, err := n.m.ingestLocal(testframe.Lifecycle(w, nil))
	if err == nil || !strings.Contains(err.Error(), "reserved for the mark") {
		t.Fatalf("a producer's frame with the mark: %v, want 400", err)
	}
	if len(n.broker.All()) != 0 || len(ifxDrain(q)) != 0 {
		t.Fatal("something was written or relayed")
	}
}

// A frame whose line fits the broker's limit only without the mark is
// written without it, as it was before the mark: the mark never turns a
// frame the node took into a 413.
func TestTheMarkIsLeftOutWhereItWouldTakeTheLinePastTheBrokersLimit(t *testing.T) {
	const lineMax = 4096
	n, _ := ifxNode(t, withMarkKey(markKey(1)), withBrokerLineMax(lineMax))
	plain := func(body []byte) int {
		fr, err := wireframe.ParseIngressAs(body, n.id, nil, wireframe.DefaultWorkloadMaxBytes)
		if err != nil {
			t.Fatal(err)
		}
		b := frameLine(&localFrame{method: fr.Method, params: fr.Params, life: fr.Life})
		defer brokerio.PutLine(b)
		return b.Len()
	}
	for _, tc := range []struct {
		name   string
		spare  int // bytes left under the limit without the mark
		marked bool
	}{
		{"room for the mark", ingressmark.MaxMemberBytes, true},
		{"no room for it", ingressmark.MaxMemberBytes - 10, false},
	} {
		w := leasedInfo("pad-"+tc.name[:2], "queued", 1)
		w["pad"] = ""
		over := plain(testframe.Lifecycle(w, nil))
		w["pad"] = strings.Repeat("x", lineMax-over-tc.spare)
		body := testframe.Lifecycle(w, nil)
		if got := plain(body); got != lineMax-tc.spare {
			t.Fatalf("%s: the frame's line is %d bytes, want %d", tc.name, got, lineMax-tc.spare)
		}
		if _, err := n.m.ingestLocal(body); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		n.broker.WaitUpserts(w["id"].(string), 1)
		last := n.broker.Line(len(n.broker.All()) - 1)
		has := strings.Contains(last, `"`+wireframe.IngressMarkName+`":`)
		if has != tc.marked || len(last)+1 > lineMax {
			t.Fatalf("%s: marked %v (want %v), a line of %d bytes with its newline", tc.name, has, tc.marked, len(last)+1)
		}
	}
}

// A lease's expiry is the ingress's own frame: it carries the mark too,
// with no lease, so the broker's replay of an expiry the journal lost is
// the producer's ended job.
func TestALeaseExpiryCarriesTheMark(t *testing.T) {
	n := leaseNode(t, withMarkKey(markKey(1)))
	n.start()
	postLeased(t, n, leasedInfo("expiring", "running", 1), minLeaseSeconds)
	testkit.Eventually(t, "the expiry at the broker", func() bool {
		for _, w := range n.broker.Upserts() {
			if w["id"] == "expiring" && w["state"] == "failed" {
				return true
			}
		}
		return false
	})
	for _, f := range n.broker.WithMethod(wireframe.MethodUpsert) {
		var s wireframe.Scan
		line := wireframe.EncodeNotification(f.Method, f.Params)
		if err := s.ScanFrame(line); err != nil {
			t.Fatal(err)
		}
		ev, _ := s.Lifecycle(wireframe.MethodErrored)
		if ev.Info.State != "failed" {
			continue
		}
		v, marks := s.InfoMember(wireframe.IngressMarkName)
		lease, ok := n.m.marker.Check(v, ev.Key())
		if marks != 1 || !ok || lease != 0 {
			t.Fatalf("the expiry's mark: %d marks, checks %v, lease %d; want one, checking, with no lease", marks, ok, lease)
		}
		return
	}
	t.Fatal("no expiry read")
}

// PAIR's store takes a marked object as it takes any other (the mark is a
// member it does not know), keeps it whole and replays it with the mark:
// the real store, where it is beside the repository.
func TestPAIRsStoreKeepsAndReplaysTheMark(t *testing.T) {
	shadow := testkit.StartShadow(t)
	if shadow == nil {
		t.Skip("PAIR's store is not beside the repository (../shared/upstream)")
	}
	j := pairshadow.NewJudged(nil, shadow)
	defer j.Close()
	_, replay := crashed(t, markKey(1), "kept-7")
	var env struct {
		Params struct{ WorkloadInfo json.RawMessage }
	}
	if err := json.Unmarshal([]byte(replay[0]), &env); err != nil {
		t.Fatal(err)
	}
	info := env.Params.WorkloadInfo
	if o, err := j.Upsert(info); err != nil || !o.Changed() {
		t.Fatalf("the store's merge of the marked object: %v, %v", o, err)
	}
	var origin struct{ OriginatedFrom string }
	_ = json.Unmarshal(info, &origin)
	recs, differ := j.Replay(origin.OriginatedFrom, time.Minute)
	if len(differ) != 0 || len(recs) != 1 {
		t.Fatalf("PAIR's replay: %d records, differences %q", len(recs), differ)
	}
	if !bytes.Contains(recs[0].Info, []byte(`"`+wireframe.IngressMarkName+`":"30.`)) {
		t.Fatalf("the replayed object lost its mark: %s", recs[0].Info)
	}
}
