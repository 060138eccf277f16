package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// pairStopGrace is how long PAIR's broker waits, after it closes the
// daemon's stdin, before it terminates the daemon (then 2 s more before it
// kills it).
const pairStopGrace = 3 * time.Second

// exitWithinGrace bounds the daemon's exit after its stdin closes. The
// daemon's own deadlines add up to about 2 s (the listeners' grace,
// serverShutdownGrace, and the peer queues' drain, spec 4); the rest is
// margin for a machine whose cores are busy, and it still leaves PAIR's
// grace unspent.
const exitWithinGrace = 2900 * time.Millisecond

// The daemon exits within PAIR's stop grace whatever its peer and its
// broker are doing: a peer that takes requests and never answers holds
// frames in its queue, and the broker either reads or has stopped reading
// stdout with peer frames waiting to be written. Every frame the daemon
// answered 200 for is in the pipe for the broker to read after the exit.
func TestProcessExitsWithinThePAIRStopGraceWhateverItsPeersAndBrokerDo(t *testing.T) {
	skipUnderShort(t) // here, not in its subtests alone: they start the binary after its setup
	for _, tc := range []struct {
		name    string
		stalled bool
	}{
		{"broker reading, peer hanging", false},
		{"broker stalled, peer hanging", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := writeCluster(t, 2)
			na, nb := nodes[0], nodes[1]
			hanging := testkit.NewHBSink(t, false, 0)
			hanging.HoldAll()
			testkit.Must(t, devpki.PinIdentity(na.ClusterDir, hanging.Ident))
			// The broker reads stdout through a gate the test holds; a
			// line the daemon was writing when it exited may reach it cut
			// short, which the broker drops as it would any malformed
			// line: its frame was never answered 200.
			var gate *readGate
			var tail *lineTail
			a := startDaemonReading(t, daemonBinary(t), nil, func(r io.Reader) io.Reader {
				tail = &lineTail{r: bufio.NewReader(r)}
				gate = newReadGate(tail)
				return gate
			}, nodeArgs(na, 0, "--metrics", "127.0.0.1:0", "--local-ingress", "127.0.0.1:0")...)
			t.Cleanup(gate.resume) // before the reader is waited for
			a.port = a.boundPeerPort()
			a.WaitMethod("discovery:subscribe", 1)
			ingress := a.loggedValue("local ingress listening", "addr")
			// A producer's job whose lease runs out while the broker is
			// stalled: its expiry blocks on the broker write.
			postProc(t, ingress, leasedInfo("leased", "running", 1), statetable.MinLeaseSeconds)
			leaseDue := time.Now().Add(statetable.MinLeaseSeconds * time.Second)
			snapshot, err := json.Marshal(map[string]any{"nodes": []map[string]any{testkit.AddrEntry(hanging.ID, hanging.Ident.Principal, hanging.Addr)}})
			testkit.Must(t, err)
			a.send(string(wireframe.EncodeNotification("discovery:nodes", snapshot)))
			a.waitLog("broadcast targets changed", "total=1")
			// Frames for the hanging peer: its sender is stuck on the
			// first, the rest wait in its queue for the drain.
			for i := range 5 {
				a.send(testframe.LifecycleLine(fmt.Sprintf("for-hanging-%d", i), "running", na.ID))
			}
			testkit.Eventually(t, "the hanging peer to hold a request", func() bool { return hanging.Requests() > 0 })

			// A pinned peer posts frames of some 8 KiB each, all at once.
			// With the broker stalled, the first few fill the pipe and are
			// answered 200; the rest wait on the broker write.
			if tc.stalled {
				gate.pause()
			}
			peer := testkit.PeerClient(t, &nb.Identity, na.Identity.DER)
			pad := strings.Repeat("p", 8<<10)
			const posts = 16
			var mu sync.Mutex
			var ok []string
			for i := range posts {
				id := fmt.Sprintf("from-peer-%d", i)
				body := testframe.Lifecycle(testframe.Workload(id, "running", nb.ID, map[string]any{"pad": pad}), nil)
				go func() {
					// Posts still waiting when the daemon exits fail: only
					// the 200s matter.
					if st, _ := netPostTracedNoFail(peer, "127.0.0.1:"+itoa(a.port), body); st == http.StatusOK {
						mu.Lock()
						ok = append(ok, id)
						mu.Unlock()
					}
				}()
			}
			answered := func() int { mu.Lock(); defer mu.Unlock(); return len(ok) }
			if tc.stalled {
				testkit.Eventually(t, "the posts to be answered or waiting on the stalled broker", func() bool {
					m := scrapeProc(t, a)
					waiting := int(m[`nvpair_wlm_broker_waiters{channel="peer"}`])
					return waiting > 0 && answered()+waiting == posts
				})
				// Waiting on the clock, not hoping: past this instant the
				// expiry is due, and if it has begun it waits on the
				// broker too; either way the bound below must hold.
				testkit.HoldsWithin(time.Until(leaseDue)+500*time.Millisecond, func() bool { return time.Now().After(leaseDue.Add(300 * time.Millisecond)) })
			} else {
				testkit.Eventually(t, "every post answered", func() bool { return answered() == posts })
			}

			start := time.Now()
			a.closeStdin()
			a.wantCleanExit(a.waitExit(exitDeadline))
			took := time.Since(start)
			t.Logf("exited %v after stdin closed (%d of %d peer frames answered 200)", took.Round(time.Millisecond), answered(), posts)
			if took >= exitWithinGrace {
				t.Errorf("exit took %v after stdin closed, want under %v (PAIR terminates it at %v)", took, exitWithinGrace, pairStopGrace)
			}

			// The broker reads what is left in the pipe: every frame
			// answered 200 is there.
			gate.resume()
			<-a.readDone
			if cut := tail.cut(); len(cut) > 0 {
				t.Logf("the broker got a last line cut short (%d bytes): the frame being written when the daemon exited", len(cut))
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ok {
				if a.UpsertCount(id) != 1 {
					t.Errorf("%s was answered 200 but the broker read it %d times, want once", id, a.UpsertCount(id))
				}
			}
		})
	}
}

// lineTail passes whole lines on and keeps back a last line that ends
// without its newline: what a daemon was writing when it exited.
type lineTail struct {
	r       *bufio.Reader
	pending []byte
	mu      sync.Mutex // guards rest
	rest    []byte
}

func (l *lineTail) Read(p []byte) (int, error) {
	if len(l.pending) == 0 {
		line, err := l.r.ReadBytes('\n')
		if err != nil {
			l.mu.Lock()
			l.rest = line
			l.mu.Unlock()
			return 0, err
		}
		l.pending = line
	}
	n := copy(p, l.pending)
	l.pending = l.pending[n:]
	return n, nil
}

// cut returns the last line kept back, if any.
func (l *lineTail) cut() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rest
}

// netPostTracedNoFail posts body to the peer endpoint at addr and returns
// the status, or 0 and the error when the request failed: for a goroutine
// that may outlive the daemon it posts to.
func netPostTracedNoFail(c *http.Client, addr string, body []byte) (int, error) {
	resp, err := c.Post("https://"+addr+wireframe.EventsPath, "application/json", strings.NewReader(string(body)))
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
