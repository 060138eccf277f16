package brokerio

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"nvpair-workload-manager/internal/wireframe"
)

// A lone caller leads: its frame is written on its own goroutine, at once,
// with no group and no handoff.
func TestALoneFrameIsWrittenByItsOwnCallerWithoutAGroup(t *testing.T) {
	var buf bytes.Buffer
	bw := NewWriter(&buf, wireframe.DefaultBrokerLineMax)
	for i := range 3 {
		if err := bw.Notify("test:alone", json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))); err != nil {
			t.Fatal(err)
		}
		bw.mu.Lock()
		leading, head := bw.leading, bw.head
		bw.mu.Unlock()
		if leading || head != nil {
			t.Fatalf("after a lone write: leading %v, a group waiting %v", leading, head != nil)
		}
	}
	if bw.Counts().WriteCalls != 3 || bw.Counts().Writes != 3 || strings.Count(buf.String(), "\n") != 3 {
		t.Fatalf("%d write calls, %d frames, %q", bw.Counts().WriteCalls, bw.Counts().Writes, buf.String())
	}
}

// A caller that leads yields once before it writes: the frames of other
// requests ready to run meanwhile (posts a journal fsync answered
// together come back together) join the group behind it, and go up in its
// one write, after its own line, in the order they were accepted.
func TestTheFramesReadyWhileALeaderYieldsGoUpInItsWrite(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one P: the yield runs every ready caller
	var buf bytes.Buffer
	bw := NewWriter(&buf, wireframe.DefaultBrokerLineMax)
	const n = 8
	var committed []int
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			b := GetLine()
			fmt.Fprintf(b, "{\"i\":%d}\n", i)
			turn, err := bw.Enter(b, func() { committed = append(committed, i) })
			if err == nil {
				err = turn.Wait()
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	// One write, or two when the scheduler resumes the leader before the
	// last callers joined; a leader that wrote at once would make eight.
	if c := bw.Counts(); c.WriteCalls > n/4 || c.Writes != n {
		t.Fatalf("%d write calls for %d frames: want the frames ready together in the leader's write", c.WriteCalls, c.Writes)
	}
	var order []int
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var f struct{ I int }
		if err := json.Unmarshal([]byte(l), &f); err != nil {
			t.Fatal(err)
		}
		order = append(order, f.I)
	}
	if !slices.Equal(order, committed) || len(order) != n {
		t.Fatalf("written in the order %v, committed in the order %v: want one order", order, committed)
	}
}
