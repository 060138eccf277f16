//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/pairbroker"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// The crash between an ingress frame's broker write and its journal record
// (issue 36, item 7; spec 3.5.3, 5.3): the broker has the frame, the
// journal does not, and no 200 was answered. The producer retries, as it
// must, after the node comes back with its broker's replay.

// nodeOnFS lays node's app dir out on fs, as devpki.WriteCluster lays it
// out, pinned to peers: the node's journal is then written to fs.
func nodeOnFS(t *testing.T, fs *freezableFS, node devpki.Node, peers ...devpki.Node) devpki.Node {
	t.Helper()
	app := filepath.Join(fs.dir, "app")
	cluster := filepath.Join(app, "cluster")
	err := devpki.WriteIdentity(cluster, node.Identity)
	if err == nil {
		err = devpki.WriteNodeID(app, node.ID)
	}
	if err == nil {
		err = devpki.WriteAdmission(cluster, "devpki-cluster", 1)
	}
	for _, p := range peers {
		if err == nil {
			err = devpki.PinIdentity(cluster, p.Identity)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	node.AppDir, node.ClusterDir = app, cluster
	return node
}

// brokerBarrier sends the daemon a request and waits for its answer: the
// daemon reads its broker's lines in order, so every line sent before it
// (the replay) has been handled.
func brokerBarrier(t *testing.T, d *daemonProc, id string) {
	t.Helper()
	d.send(`{"jsonrpc":"2.0","id":"` + id + `","method":"log/set-level","params":{"level":"debug"}}`)
	d.WaitResponse(`"` + id + `"`)
}

// TestProcessAProducersRetryAfterACrashBetweenTheBrokerWriteAndTheJournalIsTaken:
// A's app dir is on a file system that is frozen while a producer posts
// two leased jobs, so each reaches A's broker (and B) but its journal
// record is held; A is killed with SIGKILL, the file system thawed, and
// the journal checked to hold neither job. A starts again with its
// broker's replay. The producer's retry of its first job, then running,
// completed and the removal, are each answered 200, and the job is gone
// from both Jobs lists (judged by PAIR's store beside the model); the
// second job, whose producer never comes back, is failed at both brokers
// by its lease within the lease and the restart grace. No line to B ever
// carries the ingress mark. Before the mark, each of those frames was 409
// and the jobs stayed queued everywhere, for good.
func TestProcessAProducersRetryAfterACrashBetweenTheBrokerWriteAndTheJournalIsTaken(t *testing.T) {
	skipUnderShort(t)
	fs := newFreezableFS(t)
	nodes := writeCluster(t, 2)
	na := nodeOnFS(t, fs, nodes[0], nodes[1])
	a := newPairNodeBroker(t, na, "--local-ingress", "127.0.0.1:0", "--metrics", "127.0.0.1:0")
	b := newPairNodeBroker(t, nodes[1])
	a.start()
	b.start()
	meet(t, a, b)
	p := newProducer(t, a.cur().loggedValue("local ingress listening", "addr"))
	const answered, lost, abandoned = "window-answered", "window-lost", "window-abandoned"
	if st, text := p.post(jobFrame(answered, "running", 1)); st != http.StatusOK {
		t.Fatalf("the post before the freeze: %d %s", st, text)
	}

	fs.freeze()
	t.Cleanup(fs.thaw) // runs before the daemons' cleanups: a failure while frozen cannot hang them
	posts := make(chan int, 2)
	for id, lease := range map[string]string{lost: "30", abandoned: itoa(statetable.MinLeaseSeconds)} {
		go func() {
			st, _ := p.post(jobFrame(id, "queued", 1), leaseHeader, lease)
			posts <- st
		}()
	}
	for _, id := range []string{lost, abandoned} {
		a.cur().WaitUpserts(id, 1) // the broker has it
		b.cur().WaitUpserts(id, 1) // and so has the peer: it was committed
	}
	select {
	case st := <-posts:
		t.Fatalf("a post was answered %d while its journal record could not be written", st)
	default:
	}
	if err := a.sigkill(); err != nil {
		t.Fatal(err)
	}
	fs.thaw()
	a.kill9()
	for range 2 {
		if st := <-posts; st == http.StatusOK {
			t.Fatal("a post was answered 200 although the daemon died before its journal record was written")
		}
	}
	journal, err := os.ReadFile(filepath.Join(na.AppDir, journalFileName))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(journal, []byte(answered)) || bytes.Contains(journal, []byte(lost)) || bytes.Contains(journal, []byte(abandoned)) {
		t.Fatalf("the journal after the kill holds %s %v, %s %v, %s %v: the crash was not between the broker write and the journal",
			answered, bytes.Contains(journal, []byte(answered)), lost, bytes.Contains(journal, []byte(lost)), abandoned, bytes.Contains(journal, []byte(abandoned)))
	}

	restarted := time.Now()
	a.start()
	brokerBarrier(t, a.cur(), "replayed")
	meet(t, a, b)
	metrics := a.cur().loggedValue("metrics endpoint listening", "addr")
	if got := testkit.ScrapeAddr(t, metrics)["nvpair_wlm_ingress_replay_claims_total"]; got != 2 {
		t.Errorf("%v replays claimed, want the 2 jobs the journal lost", got)
	}
	ingress := a.cur().loggedValue("local ingress listening", "addr")
	// A producer that restarted too finds its jobs, the lost ones
	// included, with the leases the replay armed.
	st, _, body := testkit.GetReadBack(t, ingress, "")
	var listed testkit.ReadBackAnswer
	if err := json.Unmarshal(body, &listed); st != http.StatusOK || err != nil {
		t.Fatalf("the read-back after the restart: %d %s", st, body)
	}
	leased := 0
	for _, w := range listed.Workloads {
		if id := w.WorkloadInfo["id"]; (id == lost || id == abandoned) && w.LeaseDeadline != nil {
			leased++
		}
	}
	if ids := listed.IDs(); len(ids) != 3 || leased != 2 {
		t.Fatalf("the read-back after the restart lists %v (%d of the lost jobs leased), want the 3 jobs, the 2 lost ones leased", ids, leased)
	}
	p = newProducer(t, ingress)
	for i, f := range []struct{ what, body, lease string }{
		{"the retry of queued", jobFrame(lost, "queued", 1), "30"},
		{"running", jobFrame(lost, "running", 2), "30"},
		{"completed", jobFrame(lost, "completed", 3), ""},
		{"the removal", string(testframe.Removal(lost, "")), ""},
	} {
		var h []string
		if f.lease != "" {
			h = []string{leaseHeader, f.lease}
		}
		if st, text := p.post(f.body, h...); st != http.StatusOK {
			t.Fatalf("frame %d after the restart, %s: %d %q, want 200", i, f.what, st, text)
		}
	}

	meant := map[string]string{answered: "running", lost: removed, abandoned: "failed"}
	deadline := restarted.Add((statetable.MinLeaseSeconds + restartLeaseGrace + 1) * time.Second)
	for name, br := range map[string]*pairNodeBroker{"A": a, "B": b} {
		var wrong int
		var summary string
		br.waitJobs(time.Until(deadline), func(s *pairbroker.Store) bool {
			wrong, summary = judge(s, na.ID, meant)
			return wrong == 0
		})
		if wrong != 0 {
			t.Errorf("%s's Jobs list shows %d of %d jobs wrong (%s) %v after the restart", name, wrong, len(meant), summary, time.Since(restarted).Round(time.Millisecond))
		}
	}
	for _, d := range []*daemonProc{a.cur(), b.cur()} {
		if procExpiry(d, abandoned) == nil {
			t.Errorf("%s was not retired by its lease's expiry", abandoned)
		}
	}
	// The peer never sees the mark: not before the crash, not after.
	if text := b.cur().Text(); strings.Contains(text, wireframe.IngressMarkName) {
		t.Errorf("B's broker was written the ingress mark: %s", text)
	}
	if ups := a.procs[0].Upserts(); !hasMark(ups, lost) {
		t.Errorf("A's broker was written %s without its mark", lost)
	}
	t.Logf("the journal held %d bytes and neither job; after the restart the producer's retry and the job's later frames were all 200, and the abandoned job was failed at both brokers %v after the restart",
		len(journal), time.Since(restarted).Round(time.Millisecond))
}

// hasMark reports whether an upsert of id carries the ingress mark.
func hasMark(ups []map[string]any, id string) bool {
	for _, w := range ups {
		if _, ok := w[wireframe.IngressMarkName]; ok && w["id"] == id {
			return true
		}
	}
	return false
}
