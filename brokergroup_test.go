package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/wireframe"
)

// groupWriter is a broker channel for the group-commit tests. It records
// every Write call (its size and the frames in it) and what reached the
// broker; it holds its first Write until released, so that the frames
// that arrive meanwhile form a group behind it; and it can fail one call
// after passing part of its bytes on, as a pipe that breaks mid-write does.
type groupWriter struct {
	mu     sync.Mutex // guards the fields below but the channels
	out    bytes.Buffer
	sizes  []int // bytes of each Write call
	frames []int // lines in each Write call
	// failCall, when not 0, is the (1-based) call that writes half its
	// bytes and fails.
	failCall int

	held    chan struct{} // closed when the first Write starts
	release chan struct{} // closed by the test to let the first Write go on
}

func newGroupWriter() *groupWriter {
	return &groupWriter{held: make(chan struct{}), release: make(chan struct{})}
}

func (g *groupWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	call := len(g.sizes) + 1
	g.sizes = append(g.sizes, len(p))
	g.frames = append(g.frames, bytes.Count(p, []byte("\n")))
	fail := call == g.failCall
	g.mu.Unlock()
	if call == 1 {
		close(g.held)
		<-g.release
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if fail {
		g.out.Write(p[:len(p)/2])
		return len(p) / 2, errors.New("broker pipe broke mid-write")
	}
	return g.out.Write(p)
}

// calls returns the bytes and the lines of every Write call so far.
func (g *groupWriter) calls() (sizes, frames []int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.sizes...), append([]int(nil), g.frames...)
}

// lines returns the complete lines that reached the broker, decoded.
func (g *groupWriter) lines(t *testing.T) []wireframe.RPC {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []wireframe.RPC
	for _, l := range bytes.SplitAfter(g.out.Bytes(), []byte("\n")) {
		if len(l) == 0 || l[len(l)-1] != '\n' {
			continue // a torn line's head: a broker would discard it
		}
		var f wireframe.RPC
		if err := json.Unmarshal(l, &f); err != nil {
			t.Fatalf("broker line is not JSON: %.200q", l)
		}
		out = append(out, f)
	}
	return out
}

// holdBroker gives n's broker writer a groupWriter and starts a write of
// the daemon's own that the writer holds, so every frame sent from now on
// waits in a group behind it until the writer is released. It returns the
// writer and a wait for the held write.
func holdBroker(t *testing.T, n *testNode) (*groupWriter, func()) {
	t.Helper()
	gw := newGroupWriter()
	n.m.out.SwapWriter(gw)
	held := make(chan error, 1)
	go func() { held <- n.m.out.Notify("test:hold", nil) }()
	<-gw.held
	t.Cleanup(func() {
		select {
		case <-gw.release:
		default:
			close(gw.release)
		}
	})
	return gw, func() {
		if err := <-held; err != nil {
			t.Errorf("the held write: %v", err)
		}
	}
}

// answeredWhileHeld runs post, which must be answered while the broker
// holds a write (a refusal), and returns its error; a post that waits for
// the broker instead fails the test (whose cleanup then lets it through).
func answeredWhileHeld(t *testing.T, what string, post func() error) error {
	t.Helper()
	answered := make(chan error, 1)
	go func() { answered <- post() }()
	select {
	case err := <-answered:
		return err
	case <-time.After(testkit.WaitTimeout):
		t.Fatalf("%s waited for the held broker write instead of being refused at once", what)
		return nil
	}
}

// peerPrincipals are pinned peers' identities as the peer port knows them
// once their handshake checked the pin: peerserver.Server.HandleFrame is
// what the peer port runs for each of their frames.
func peerPrincipals(k int) []string {
	out := make([]string, k)
	for i := range out {
		out[i] = devpki.NewUUID()
	}
	return out
}

func peerFrame(t *testing.T, principal, id string, seq int) []byte {
	t.Helper()
	return testframe.Lifecycle(testframe.Workload(id, "running", principal, map[string]any{"seq": seq}), nil)
}

// discardLog is a peer request's log that writes nothing.
func discardLog() *httpguard.RequestLog {
	l := httpguard.NewRequestLog(slog.New(slog.DiscardHandler), "peer", "test")
	return &l
}

// 64 ingress posts (16 workloads, four posts each with rising seq, all
// sent at once) and 4 pinned peers posting at the same time, while the
// broker holds a write: frames that are ready together go up in one write,
// every frame reaches the broker once, and the ingress frames reach the
// broker and the peer queue in one order, the order they were accepted in,
// with the re-sync set holding each workload's latest event.
func TestFramesReadyTogetherAreWrittenInOneWriteInTheOrderTheyWereAccepted(t *testing.T) {
	const workloads, postsEach, peers, peerFrames = 16, 4, 4, 8
	n, q := ifxNode(t)
	gw, heldDone := holdBroker(t, n)

	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, workloads*postsEach+peers*peerFrames)
	for w := range workloads {
		for seq := 1; seq <= postsEach; seq++ {
			body := testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON(fmt.Sprintf("job-%d", w), "running", "", fmt.Sprintf(`"seq":%d`, seq)))
			wg.Go(func() {
				<-start
				if _, err := n.m.ingestLocal([]byte(body)); err != nil {
					errs <- fmt.Errorf("ingress post: %w", err)
				}
			})
		}
	}
	principals := peerPrincipals(peers)
	for _, p := range principals {
		wg.Go(func() {
			<-start
			for i := range peerFrames {
				if st, reason := n.m.peers.HandleFrame(discardLog(), p, peerFrame(t, p, fmt.Sprintf("peer-%s-%d", p[:8], i), 1)); st != http.StatusOK {
					errs <- fmt.Errorf("peer frame %d: %d %s", i, st, reason)
				}
			}
		})
	}
	close(start)
	// Every ingress post and one frame of each peer wait behind the held
	// write: a group.
	testkit.Eventually(t, "every ingress post and each peer's first frame queued behind the held write", func() bool {
		return n.m.out.Queued() == workloads*postsEach+peers
	})
	close(gw.release)
	heldDone()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Grouping happened: fewer Write calls than frames.
	sizes, frames := gw.calls()
	total := 0
	for _, f := range frames {
		total += f
	}
	if want := 1 + workloads*postsEach + peers*peerFrames; total != want {
		t.Fatalf("%d frames written, want %d", total, want)
	}
	if len(sizes) >= total || frames[1] != workloads*postsEach+peers {
		t.Fatalf("%d Write calls for %d frames, the first group %d frames; want the %d frames that waited together in one write", len(sizes), total, frames[1], workloads*postsEach+peers)
	}

	// Every frame once; each peer's frames in the order it sent them.
	var ingressOrder []string
	perPeer := map[string][]string{}
	seen := map[string]int{}
	for _, f := range gw.lines(t) {
		if f.Method != wireframe.MethodUpsert {
			continue
		}
		id := ifxInfoString(t, f.Params, "id")
		seq := ifxInfoField(t, f.Params, "seq")
		seen[id+"/"+seq]++
		if strings.HasPrefix(id, "peer-") {
			perPeer[id[:len("peer-")+8]] = append(perPeer[id[:len("peer-")+8]], id)
		} else {
			ingressOrder = append(ingressOrder, id+"/"+seq)
		}
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("%s reached the broker %d times", k, c)
		}
	}
	if len(seen) != workloads*postsEach+peers*peerFrames {
		t.Fatalf("%d distinct frames at the broker, want %d", len(seen), workloads*postsEach+peers*peerFrames)
	}
	for p, ids := range perPeer {
		for i, id := range ids {
			if want := fmt.Sprintf("%s-%d", p, i); id != want {
				t.Fatalf("peer %s's frames reached the broker as %v, not in the order it sent them", p, ids)
			}
		}
	}
	if n.m.peers.DedupLen() != peers*peerFrames {
		t.Fatalf("the dedup holds %d keys, want the %d peer frames written", n.m.peers.DedupLen(), peers*peerFrames)
	}

	// The peers are sent each workload once, at its latest event.
	var queued []string
	for _, f := range ifxDrain(q) {
		p := ifxParams(t, f)
		queued = append(queued, ifxInfoString(t, p, "id")+"/"+ifxInfoField(t, p, "seq"))
	}
	slices.Sort(queued)
	var want []string
	for w := range workloads {
		want = append(want, fmt.Sprintf("job-%d/%d", w, postsEach))
	}
	slices.Sort(want)
	if !slices.Equal(queued, want) {
		t.Fatalf("the peers are sent %v, want each workload's latest %v", queued, want)
	}
	// The re-sync set holds each workload's latest event: the highest seq.
	for w := range workloads {
		held := resyncHeld(t, n, n.id, fmt.Sprintf("job-%d", w))
		if seq, _ := held["seq"].(float64); int(seq) != postsEach {
			t.Fatalf("the re-sync set holds job-%d at seq %v, want %d", w, held["seq"], postsEach)
		}
	}
	if got := n.m.ingressFlight.inFlight(); got != 0 {
		t.Fatalf("%d ingress frames still counted in flight", got)
	}
}

// A broker write that fails part-way through a group fails every frame of
// that group: each ingress post is a 500 (ingress.ErrBrokerWrite) and leaves
// nothing committed to the table; each peer frame is a 500 and is
// not recorded in the dedup, so its sender may send it again.
func TestAFailedGroupWriteFailsEveryFrameOfTheGroupAndCommitsNone(t *testing.T) {
	n, q := ifxNode(t)
	// A workload the group's removal is about: tracked before, and still
	// tracked after the failed removal.
	if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("kept", "running", "")))); err != nil {
		t.Fatal(err)
	}
	ifxDrain(q)
	tracked := ifxTrackedCount(n)

	gw, heldDone := holdBroker(t, n)
	gw.failCall = 2 // the group behind the held write
	bodies := []string{
		testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("new-1", "running", "")),
		testframe.LifecycleJSON(testframe.MethodFor("queued"), testframe.WorkloadJSON("new-2", "queued", "")),
		testframe.LifecycleJSON(testframe.MethodFor("completed"), testframe.WorkloadJSON("kept", "completed", "")),
		string(testframe.Removal("kept", "")),
	}
	principals := peerPrincipals(2)
	var wg sync.WaitGroup
	ingressErrs := make(chan error, len(bodies))
	peerStatus := make(chan int, len(principals))
	for _, b := range bodies {
		wg.Go(func() {
			_, err := n.m.ingestLocal([]byte(b))
			ingressErrs <- err
		})
	}
	for _, p := range principals {
		wg.Go(func() {
			st, _ := n.m.peers.HandleFrame(discardLog(), p, peerFrame(t, p, "peer-"+p[:8], 1))
			peerStatus <- st
		})
	}
	testkit.Eventually(t, "every frame queued behind the held write", func() bool {
		return n.m.out.Queued() == len(bodies)+len(principals)
	})
	close(gw.release)
	heldDone()
	wg.Wait()
	close(ingressErrs)
	close(peerStatus)

	for err := range ingressErrs {
		if !errors.Is(err, ingress.ErrBrokerWrite) {
			t.Fatalf("an ingress post of the failed group: %v, want ingress.ErrBrokerWrite (500)", err)
		}
	}
	for st := range peerStatus {
		if st != http.StatusInternalServerError {
			t.Fatalf("a peer frame of the failed group: %d, want 500", st)
		}
	}
	if _, frames := gw.calls(); len(frames) != 2 || frames[1] != len(bodies)+len(principals) {
		t.Fatalf("Write calls with %v frames, want the held write and one group of %d", frames, len(bodies)+len(principals))
	}
	if got := ifxDrain(q); len(got) != 0 {
		t.Fatalf("the failed group queued %s for peers", ifxDescribe(got))
	}
	if ifxTrackedCount(n) != tracked || ifxIsTracked(n, n.id, "new-1") || ifxIsTracked(n, n.id, "new-2") {
		t.Fatalf("the failed group changed the re-sync set: %d entries, want %d", ifxTrackedCount(n), tracked)
	}
	if held := resyncHeld(t, n, n.id, "kept"); held["state"] != "running" {
		t.Fatalf("the re-sync set holds kept as %v, want running: the failed completed frame was committed", held["state"])
	}
	if ifxRemembers(n, n.id, "kept") {
		t.Fatal("the failed removal was remembered")
	}
	if n.m.peers.DedupLen() != 0 {
		t.Fatalf("the dedup recorded %d peer frames of the failed group", n.m.peers.DedupLen())
	}
	if got := n.m.ingressFlight.inFlight(); got != 0 {
		t.Fatalf("%d ingress frames still counted in flight", got)
	}
	select {
	case <-n.m.out.Gone():
	default:
		t.Fatal("the failed write did not mark the broker gone")
	}
	if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("after", "running", "")))); !errors.Is(err, ingress.ErrBrokerWrite) {
		t.Fatalf("a post after the failure: %v, want ingress.ErrBrokerWrite", err)
	}
}

// A frame whose line is over the broker's line limit is refused alone, at
// once, while a group forms: the frames around it are written.
func TestALineOverTheLimitIsRefusedAloneAndDoesNotJoinAGroup(t *testing.T) {
	n, q := ifxNode(t, withBrokerLineMax(wireframe.MinBrokerLineMax))
	gw, heldDone := holdBroker(t, n)
	var wg sync.WaitGroup
	for _, id := range []string{"before", "after"} {
		wg.Go(func() {
			if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON(id, "running", "")))); err != nil {
				t.Errorf("%s: %v", id, err)
			}
		})
	}
	testkit.Eventually(t, "two frames queued", func() bool { return n.m.out.Queued() == 2 })
	big := `"note":"` + strings.Repeat("x", wireframe.MinBrokerLineMax) + `"`
	if err := answeredWhileHeld(t, "an over-long frame", func() error {
		_, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("big", "running", "", big))))
		return err
	}); !errors.Is(err, wireframe.ErrLineOverLimit) {
		t.Fatalf("an over-long frame while a group forms: %v, want wireframe.ErrLineOverLimit", err)
	}
	if got := n.m.out.Queued(); got != 2 {
		t.Fatalf("%d frames queued after the refusal, want 2: the refused line joined", got)
	}
	close(gw.release)
	heldDone()
	wg.Wait()
	if got := ifxDrain(q); len(got) != 2 {
		t.Fatalf("queued %s, want before and after", ifxDescribe(got))
	}
	if ifxIsTracked(n, n.id, "big") {
		t.Fatal("the refused frame was tracked")
	}
}

// A group is bounded in bytes: frames queued beyond brokerio.GroupMaxBytes go
// up in the next write, none is refused, and every write but a single
// frame's is within the bound.
func TestAGroupIsBoundedInBytesAndTheRestGoesInTheNextWrite(t *testing.T) {
	gw := newGroupWriter()
	bw := brokerio.NewWriter(gw, wireframe.MaxBrokerLineMax)
	held := make(chan error, 1)
	go func() { held <- bw.Notify("test:hold", nil) }()
	<-gw.held
	const frames, size = 8, 300 << 10 // 2.4 MB in all: three groups at least
	var wg sync.WaitGroup
	for i := range frames {
		params := testframe.PaddedParams(t, fmt.Sprintf("test:big-%d", i), size)
		wg.Go(func() {
			if err := bw.Notify(fmt.Sprintf("test:big-%d", i), params); err != nil {
				t.Errorf("frame %d: %v", i, err)
			}
		})
	}
	testkit.Eventually(t, "every frame queued", func() bool { return bw.Queued() == frames })
	close(gw.release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	sizes, counts := gw.calls()
	written := 0
	for i, s := range sizes {
		if s > brokerio.GroupMaxBytes && counts[i] > 1 {
			t.Fatalf("write %d carried %d frames in %d bytes, over the %d-byte group bound", i, counts[i], s, brokerio.GroupMaxBytes)
		}
		written += counts[i]
	}
	if written != frames+1 || bw.Counts().Writes != frames+1 {
		t.Fatalf("%d frames written (%d counted), want %d", written, bw.Counts().Writes, frames+1)
	}
	if len(sizes) > frames || bw.Counts().GroupsAtBound == 0 {
		t.Fatalf("%d writes for %d frames, %d groups closed at the bound: want groups of several frames, cut at the bound", len(sizes), frames+1, bw.Counts().GroupsAtBound)
	}
	if bw.Counts().WriteCalls != uint64(len(sizes)) {
		t.Fatalf("write calls counted %d, made %d", bw.Counts().WriteCalls, len(sizes))
	}
}

// Ingress frames in flight (placed in the broker order, not yet
// committed) hold the slots of the runs they would start: at the limit, a
// post for a further new run is refused with 503 at once, a post for a run
// already in flight is not, and the set ends at its limit, not over it.
func TestIngressFramesInFlightCountTowardTheLiveWorkloadLimit(t *testing.T) {
	const limit = 4
	n, gw, heldDone, wg := twoNewRunsInFlight(t, limit)
	var atLimit *ingress.AtLimitError
	if err := answeredWhileHeld(t, "a third new run", func() error {
		_, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("new-2", "running", ""))))
		return err
	}); !errors.As(err, &atLimit) {
		t.Fatalf("a third new run while two are in flight at %d of %d: %v, want ingress.AtLimitError (503)", limit-2, limit, err)
	}
	// A later frame of a run in flight takes no second slot.
	wg.Go(func() {
		if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON("new-0", "running", "", `"seq":2`)))); err != nil {
			t.Errorf("a later frame of a run in flight: %v", err)
		}
	})
	testkit.Eventually(t, "the later frame in flight", func() bool { return n.m.ingressFlight.inFlight() == 3 })
	close(gw.release)
	heldDone()
	wg.Wait()
	if got := ifxTrackedCount(n); got != limit {
		t.Fatalf("the re-sync set holds %d runs, want its limit %d", got, limit)
	}
}

// The set's overshoot is bounded by the runs in flight: broker frames are
// tracked while the set holds fewer than the limit, so they can take the
// slots of ingress runs in flight, and those are tracked anyway once
// written (the broker holds them).
func TestTheLiveWorkloadOvershootIsAtMostTheIngressRunsInFlight(t *testing.T) {
	const limit = 4
	n, gw, heldDone, wg := twoNewRunsInFlight(t, limit)
	for i := range 3 {
		n.m.handleLine([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON(fmt.Sprintf("broker-%d", i), "running", n.id))))
	}
	close(gw.release)
	heldDone()
	wg.Wait()
	if got := ifxTrackedCount(n); got != limit+2 {
		t.Fatalf("the re-sync set holds %d runs, want %d: the limit and the two ingress runs that were in flight", got, limit+2)
	}
}

// twoNewRunsInFlight starts a node whose re-sync set holds limit-2 runs,
// holds its broker write, and posts two new runs that wait in flight
// behind it: the set is then at its limit with the runs in flight.
func twoNewRunsInFlight(t *testing.T, limit int) (*testNode, *groupWriter, func(), *sync.WaitGroup) {
	t.Helper()
	n, _ := ifxNode(t, withMaxLiveWorkloads(limit))
	for i := range limit - 2 {
		if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON(fmt.Sprintf("old-%d", i), "running", "")))); err != nil {
			t.Fatal(err)
		}
	}
	gw, heldDone := holdBroker(t, n)
	wg := new(sync.WaitGroup)
	for i := range 2 {
		wg.Go(func() {
			if _, err := n.m.ingestLocal([]byte(testframe.LifecycleJSON(testframe.MethodFor("running"), testframe.WorkloadJSON(fmt.Sprintf("new-%d", i), "running", "")))); err != nil {
				t.Errorf("new-%d: %v", i, err)
			}
		})
	}
	testkit.Eventually(t, "two new runs in flight", func() bool { return n.m.ingressFlight.inFlight() == 2 })
	return n, gw, heldDone, wg
}

// The broker line of an upsert, built in one pass, is the bytes the one
// notification encoding gives, pretty-printed and escaped objects included.
func TestUpsertLineIsTheNotificationEncoding(t *testing.T) {
	for _, info := range []string{
		`{"id":"a","state":"running"}`,
		"{\n  \"id\": \"a\",\r\n  \"state\": \"running\"\n}",
		`{"id":"\u00e9<>&","note":"line\nbreak"}`,
		"{\"id\":\"a\",\n\"bad\":}", // does not compact: written as it is
	} {
		b := brokerio.UpsertLine(json.RawMessage(info))
		want := string(wireframe.EncodeNotification(wireframe.MethodUpsert, json.RawMessage(`{"workloadInfo":`+info+`}`))) + "\n"
		if b.String() != want {
			t.Errorf("brokerio.UpsertLine(%q) =\n%q\nwant\n%q", info, b.String(), want)
		}
		brokerio.PutLine(b)
	}
}

// benchPipe is the broker's stdout as the daemon has it: an OS pipe, each
// Write a system call, drained by a reader that is always waiting.
func benchPipe(b *testing.B) io.Writer {
	b.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, r); close(done) }()
	b.Cleanup(func() { w.Close(); <-done; r.Close() })
	return w
}

// benchWriters runs op from 1 caller, then from 16 and 64 at once
// (GOMAXPROCS times the parallelism). With counts (frames written, Write
// calls) it also reports the mean frames per Write call.
func benchWriters(b *testing.B, counts func() (frames, calls uint64), op func(b *testing.B, i int64)) {
	for _, writers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			b.ReportAllocs()
			if counts != nil {
				f0, c0 := counts()
				defer func() {
					f1, c1 := counts()
					b.ReportMetric(float64(f1-f0)/float64(max(1, c1-c0)), "frames/write")
				}()
			}
			if writers == 1 {
				var i int64
				for b.Loop() {
					op(b, i)
					i++
				}
				return
			}
			var next atomic.Int64
			b.SetParallelism(max(1, writers/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					op(b, next.Add(1))
				}
			})
		})
	}
}

// writeCounts returns the frames written and the Write calls made.
func writeCounts(bw *brokerio.Writer) (frames, calls uint64) {
	c := bw.Counts()
	return c.Writes, c.WriteCalls
}

// BenchmarkBrokerGroupNotify writes a workloads:upsert notification to a
// pipe per op. It uses only notify, so it runs on the writer before group
// commit too, for a before-and-after comparison.
func BenchmarkBrokerGroupNotify(b *testing.B) {
	bw := brokerio.NewWriter(benchPipe(b), wireframe.DefaultBrokerLineMax)
	params := json.RawMessage(benchSeedParams)
	benchWriters(b, func() (uint64, uint64) { return writeCounts(bw) }, func(b *testing.B, _ int64) {
		if err := bw.Notify(wireframe.MethodUpsert, params); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkBrokerGroupIngest takes one ingress frame per op (distinct
// workloads, three frames each with rising seq) through ingestLocal, the
// broker side a pipe.
func BenchmarkBrokerGroupIngest(b *testing.B) {
	m := benchManager(b, benchPipe(b))
	benchWriters(b, func() (uint64, uint64) { return writeCounts(m.out) }, func(b *testing.B, i int64) {
		body := benchIngressBody(make([]byte, 0, 512), i/3, i%3+1)
		if _, err := m.ingestLocal(body); err != nil {
			b.Fatal(err)
		}
	})
}
