package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The percentile is nearest-rank: p99 of 100 values is the 99th, of 10 the
// largest; p50 of 4 is the 2nd; p100 is the largest.
func TestScalePercentileIsNearestRank(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var out []time.Duration
		for _, n := range ns {
			out = append(out, time.Duration(n)*time.Millisecond)
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{hundred, 99, 99 * time.Millisecond},
		{hundred, 50, 50 * time.Millisecond},
		{hundred, 100, 100 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
		{ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{ms(7), 0, 7 * time.Millisecond},
		{nil, 99, 0},
	} {
		if got := percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("percentile(%d values, %g) = %s, want %s", len(tc.sorted), tc.p, got, tc.want)
		}
	}
}

// A total divided per change, and no figure without a change.
func TestScalePerChangeDividesAndHasNoFigureWithoutChanges(t *testing.T) {
	if got, ok := perChange(float64(600*time.Millisecond), 600); !ok || got != float64(time.Millisecond) {
		t.Errorf("600 ms over 600 changes = %v, %v; want 1 ms", time.Duration(got), ok)
	}
	if got, ok := perChange(5, 0); ok || got != 0 {
		t.Errorf("over 0 changes = %v, %v; want no figure", got, ok)
	}
	// A window of 15 s scales by 2 to a 30 s interval.
	if got := perInterval(15*time.Second, 30*time.Second); got != 2 {
		t.Errorf("perInterval(15s, 30s) = %v, want 2", got)
	}
}

// Hearing seq s is hearing every change up to s (a daemon may send the
// later state in place of earlier ones); a change's propagation is until
// its last member heard it, and a change some member never heard is
// missing, not timed.
func TestScalePropagationIsUntilTheLastMemberHeardIt(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	info := func(seq int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"id":"scale-n1","originatedFrom":"o1","seq":%d}`, seq))
	}
	a := &receipts{origins: map[string]time.Time{}}
	b := &receipts{origins: map[string]time.Time{}}
	a.hear(info(2), at(5), "o1", "scale-n1")
	a.hear(info(3), at(15), "o1", "scale-n1")
	a.hear(info(4), at(25), "o1", "scale-n1")
	b.hear(info(3), at(40), "o1", "scale-n1") // 2 and 3 at once
	b.hear(info(2), at(45), "o1", "scale-n1") // an older one again: no new receipt
	a.hear(json.RawMessage(`{"id":"scale-n2","originatedFrom":"o2","seq":9}`), at(1), "o1", "scale-n1")
	sent := []time.Time{{}, {}, at(0), at(10), at(20)}
	lat, missing := propagation(sent, 2, 4, []*receipts{a, b})
	if want := []time.Duration{40 * time.Millisecond, 30 * time.Millisecond}; fmt.Sprint(lat) != fmt.Sprint(want) || missing != 1 {
		t.Errorf("propagation = %v, %d missing; want %v, 1 missing (b never heard 4)", lat, missing, want)
	}
	if !allHeard([]*receipts{a, b}, 3) || allHeard([]*receipts{a, b}, 4) {
		t.Error("allHeard: want 3 heard by both, 4 not")
	}
	if pairs, last := meshState([]*receipts{a, b}); pairs != 3 || !last.Equal(at(40)) {
		t.Errorf("meshState = %d, %s; want 3 pairs (a: o1, o2; b: o1), the last b hearing o1 at 40 ms", pairs, last)
	}
}

// Too few file descriptors for the largest point is refused before any
// daemon starts, in one line naming the flag and the ulimit to raise.
func TestScaleRefusesTooFewFileDescriptorsInOneLine(t *testing.T) {
	if err := checkFDs(128, fdsNeeded(128), true); err != nil {
		t.Errorf("exactly enough refused: %v", err)
	}
	if err := checkFDs(128, 1<<20, false); err != nil {
		t.Errorf("an unknown limit refused: %v", err)
	}
	err := checkFDs(128, 256, true)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "--members 128") || !strings.Contains(err.Error(), "ulimit -n 768") {
		t.Errorf("checkFDs(128, 256) = %v, want one line naming --members 128 and ulimit -n 768", err)
	}
}

func TestScaleRefusesABadFlagWithStatus2AndOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--members", "1"}, "--members 1"},
		{[]string{"--members", "2,129"}, "between 2 and 128"},
		{[]string{"--members", "2,x"}, `"x" is not a whole number`},
		{[]string{"--rate", "0"}, "--rate 0"},
		{[]string{"--changes-for", "10ms"}, "--changes-for 10ms"},
		{[]string{"--resync-interval", "1ms"}, "--resync-interval 1ms"},
		{[]string{"--bogus"}, "unknown flag --bogus"},
	} {
		var stdout, stderr lockedBuffer
		if code := runScale(tc.args, &stdout, &stderr, nil); code != 2 {
			t.Errorf("%v: exit status %d, want 2", tc.args, code)
		}
		if got := stderr.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, tc.want) {
			t.Errorf("%v: stderr %q, want one line with %q", tc.args, got, tc.want)
		}
	}
}

// A quick run at 17 members, one past the dev cluster's old bound of 16:
// 17 real daemons start, the mesh forms (272 pairs), every change reaches
// every other member, and the row has every figure. About 5 s (12 s under
// -race); every wait in it is bounded (--mesh-timeout, the settle).
func TestScaleSmokeAtSeventeenMembersPastTheOldBound(t *testing.T) {
	needsDaemons(t)
	var stdout, stderr lockedBuffer
	code := runScale([]string{"--bin", daemonBin, "--members", "17", "--rate", "20", "--changes-for", "2s", "--quiet-for", "1s", "--resync-interval", "1s"}, &stdout, &stderr, nil)
	out := stdout.String()
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr.String())
	}
	var row string
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, "| 17 |") {
			row = l
		}
	}
	cells := strings.Split(strings.Trim(strings.TrimSpace(row), "|"), "|")
	if len(cells) != 15 || strings.TrimSpace(cells[3]) != "272/272" || strings.Contains(row, "unheard") || strings.Contains(row, " - ") {
		t.Errorf("row %q: want 15 cells, 272/272 pairs, every change heard\n%s", row, out)
	}
}

// With discovery held, each daemon is told of itself alone; the release
// tells every node of every member in one push: the one snapshot the mesh
// is timed from.
func TestScaleHeldDiscoveryListsEachNodeAloneUntilTheRelease(t *testing.T) {
	c := paperCluster(t, 3)
	c.cfg.holdDiscovery = true
	for i, n := range c.nodes {
		n.up, n.port = true, 40000+i
	}
	listed := func(r *node) []string {
		var snap struct {
			Nodes []struct {
				HostUUID string `json:"hostUuid"`
			} `json:"nodes"`
		}
		if err := json.Unmarshal(c.directoryFor(r), &snap); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range snap.Nodes {
			ids = append(ids, e.HostUUID)
		}
		return ids
	}
	for _, n := range c.nodes {
		if got := listed(n); len(got) != 1 || got[0] != n.id {
			t.Errorf("held: %s is told of %v, want itself alone", n.name, got)
		}
	}
	c.releaseDiscovery()
	for _, n := range c.nodes {
		if got := listed(n); len(got) != 3 {
			t.Errorf("released: %s is told of %d members, want 3", n.name, len(got))
		}
		if len(n.broker.nodes) != 3 {
			t.Errorf("released: %s's broker was pushed %d members, want 3", n.name, len(n.broker.nodes))
		}
	}
}
