package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"nvpair-workload-manager/internal/dev/devpki"
)

// paperCluster is a cluster of n nodes whose daemons never start: enough
// for the view, which reads the brokers' stores.
func paperCluster(t *testing.T, n int) *cluster {
	members := make([]devpki.Node, n)
	for i := range members {
		members[i] = devpki.Node{ID: devpki.NewUUID(), AppDir: t.TempDir()}
	}
	c := newCluster(clusterConfig{resyncInterval: time.Second, logf: func(string, ...any) {}, shadowBin: shadowBin}, members, t.TempDir())
	t.Cleanup(func() { judgeAtTheEnd(t, c) })
	return c
}

func TestViewerPlainPrintsASnapshotOnlyWhenTheJobsChange(t *testing.T) {
	c := paperCluster(t, 2)
	var out bytes.Buffer
	v := &viewer{c: c, out: &out, header: func() []string { return []string{"hdr"} }, start: time.Now()}
	t0 := time.Now()
	v.draw(t0)
	if !strings.Contains(out.String(), "node1 (n1)") || !strings.Contains(out.String(), "node2 (n2)") {
		t.Fatalf("the first snapshot does not show both nodes:\n%s", out.String())
	}
	out.Reset()
	c.nodes[1].broker.handle(upsertLine(info(c.nodes[1].id, "j1", "running", t0.UnixMilli())), nil, nil)
	v.draw(t0.Add(time.Second))
	first := out.String()
	if !strings.Contains(first, "j1") {
		t.Fatalf("a new job did not print a snapshot:\n%s", first)
	}
	out.Reset()
	v.draw(t0.Add(5 * time.Second)) // only the ages changed
	if out.Len() != 0 {
		t.Errorf("printed a snapshot though no job changed:\n%s", out.String())
	}
	c.nodes[1].broker.handle(upsertLine(info(c.nodes[1].id, "j1", "completed", t0.UnixMilli())), nil, nil)
	v.draw(t0.Add(6 * time.Second))
	if !strings.Contains(out.String(), "completed") {
		t.Errorf("a state change did not print a snapshot:\n%s", out.String())
	}
	if strings.Contains(first+out.String(), "\x1b") {
		t.Error("a plain snapshot carries an escape code")
	}
}

func TestViewerTerminalRedrawsInPlaceOnEveryTick(t *testing.T) {
	c := paperCluster(t, 2)
	var out bytes.Buffer
	v := &viewer{c: c, out: &out, tty: true, header: func() []string { return []string{"hdr"} }, start: time.Now()}
	for i := range 2 {
		out.Reset()
		v.draw(time.Now())
		s := out.String()
		if !strings.HasPrefix(s, "\x1b[H") || !strings.HasSuffix(s, "\x1b[J") {
			t.Fatalf("draw %d does not go home first and clear below last: %q", i, s)
		}
		if !strings.Contains(s, "node2 (n2)") {
			t.Fatalf("draw %d does not show node 2: %q", i, s)
		}
	}
}

func TestSideBySideShowsEachNodesJobsInItsOwnColumn(t *testing.T) {
	c := paperCluster(t, 3)
	now := time.Now()
	n1, n2 := c.nodes[0], c.nodes[1]
	n1.up, n2.up = true, true // node 3 is down
	n1.broker.handle(upsertLine(info(n2.id, "from-n2", "running", now.Add(-5*time.Second).UnixMilli())), nil, nil)
	n2.broker.handle(upsertLine(info(n1.id, "from-n1", "queued", now.Add(-65*time.Second).UnixMilli())), nil, nil)
	n2.broker.handle(upsertLine(info(n2.id, "from-n2", "running", now.Add(-5*time.Second).UnixMilli())), nil, nil)
	lines := sideBySide(c.views(), now, 0, maxViewRows)
	if len(lines) < 4 {
		t.Fatalf("%d lines, want a title, a header and 2 rows:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	cols := strings.Split(lines[0], " | ")
	if len(cols) != 3 || !strings.HasPrefix(cols[0], "node1 (n1) up, 1 jobs") ||
		!strings.HasPrefix(cols[1], "node2 (n2) up, 2 jobs") || !strings.HasPrefix(cols[2], "node3 (n3) DOWN, 0 jobs") {
		t.Fatalf("title line %q, want the three nodes side by side", lines[0])
	}
	// The separators line up on every row that reaches them.
	sep := strings.Index(lines[0], " | ")
	for _, l := range lines[1:] {
		if len(l) > sep && l[sep:sep+3] != " | " {
			t.Errorf("row %q: column 1 is not %d wide", l, sep)
		}
	}
	for _, want := range []string{"ID", "MODEL", "ENGINE", "STATE", "ORIGIN", "AGE"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("header %q lacks %s", lines[1], want)
		}
	}
	row := strings.Fields(strings.Split(lines[2], "|")[1])
	if strings.Join(row, " ") != "from-n2 m e running n2 5s" {
		t.Errorf("node 2's newest row %q, want id, model, engine, state, origin n2, age 5s", row)
	}
	if strings.Join(strings.Fields(strings.Split(lines[3], "|")[1]), " ") != "from-n1 m e queued n1 1m05s" {
		t.Errorf("node 2's second row %q, want the older job from n1 aged 1m05s", lines[3])
	}
}

func TestConvergedComparesOriginIDAndStateOnly(t *testing.T) {
	j := func(origin, id, state, model string) job {
		return job{Origin: origin, ID: id, State: state, Model: model}
	}
	a := []job{j("o1", "x", "running", "m1"), j("o2", "x", "completed", "m1")}
	cases := []struct {
		name string
		b    []job
		want bool
	}{
		{"same set", []job{j("o2", "x", "completed", "m1"), j("o1", "x", "running", "m1")}, true},
		{"model differs", []job{j("o1", "x", "running", "other"), j("o2", "x", "completed", "m1")}, true},
		{"state differs", []job{j("o1", "x", "queued", "m1"), j("o2", "x", "completed", "m1")}, false},
		{"origin differs", []job{j("o1", "x", "running", "m1"), j("o3", "x", "completed", "m1")}, false},
		{"one missing", []job{j("o1", "x", "running", "m1")}, false},
		{"one extra", append([]job{j("o9", "y", "queued", "m")}, a...), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ok, why := converged([]nodeView{{name: "node1", jobs: a}, {name: "node2", jobs: a}, {name: "node3", jobs: tc.b}})
			if ok != tc.want {
				t.Fatalf("converged = %v (%s), want %v", ok, why, tc.want)
			}
			if !ok && !strings.Contains(why, "node3") {
				t.Errorf("the reason %q does not name the differing node", why)
			}
		})
	}
}

func TestAgeRendering(t *testing.T) {
	now := time.UnixMilli(1_789_661_457_000)
	for _, tc := range []struct {
		ago  time.Duration
		want string
	}{{0, "0s"}, {59 * time.Second, "59s"}, {65 * time.Second, "1m05s"}, {2*time.Hour + 3*time.Minute, "2h03m"}, {75*24*time.Hour + 5*time.Hour, "75d05h"}, {-time.Second, "0s"}} {
		if got := age(now, now.Add(-tc.ago).UnixMilli()); got != tc.want {
			t.Errorf("age(%s) = %q, want %q", tc.ago, got, tc.want)
		}
	}
	if got := age(now, 0); got != "-" {
		t.Errorf("age without createdAt = %q, want -", got)
	}
}

func TestIsTerminalIsFalseForAFileAndAPipe(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if isTerminal(f) || isTerminal(w) {
		t.Error("a regular file or a pipe was taken for a terminal")
	}
}

func TestSideBySideFitsANarrowTerminal(t *testing.T) {
	c := paperCluster(t, 3)
	now := time.Now()
	for _, n := range c.nodes {
		n.broker.handle(upsertLine(info(c.nodes[0].id, "a-rather-long-job-id", "running", now.UnixMilli())), nil, nil)
	}
	full := widest(sideBySide(c.views(), now, 0, maxViewRows))
	for _, tc := range []struct {
		width        int
		model, engin bool
	}{{full, true, true}, {full - 1, true, false}, {full - 40, false, false}, {30, false, false}} {
		lines := sideBySide(c.views(), now, tc.width, maxViewRows)
		if w := widest(lines); w > tc.width {
			t.Errorf("width %d: a line is %d wide", tc.width, w)
		}
		if got := strings.Contains(lines[1], "MODEL"); got != tc.model {
			t.Errorf("width %d: MODEL shown %v, want %v", tc.width, got, tc.model)
		}
		if got := strings.Contains(lines[1], "ENGINE"); got != tc.engin {
			t.Errorf("width %d: ENGINE shown %v, want %v", tc.width, got, tc.engin)
		}
	}
}

// threeBusyNodes is a paper cluster of three nodes, all up, each holding
// the same jobs, with ids as long as the simulator's and the README's.
func threeBusyNodes(t *testing.T, jobs int) *cluster {
	c := paperCluster(t, 3)
	now := time.Now()
	states := []string{"running", "completed", "cancelled", "queued", "failed"}
	for _, n := range c.nodes {
		n.up = true
		for i := range jobs {
			id := "ing-" + strings.Repeat("0", 3) + string(rune('0'+i%10)) + "-" + string(rune('a'+i%26))
			n.broker.handle(upsertLine(info(c.nodes[i%3].id, id, states[i%len(states)], now.UnixMilli())), nil, nil)
		}
		n.broker.handle(upsertLine(info(c.nodes[0].id, "curl-job-1", "running", now.UnixMilli())), nil, nil)
	}
	return c
}

func TestSideBySideAt80ColumnsKeepsEveryNodeReadable(t *testing.T) {
	c := threeBusyNodes(t, 5)
	lines := sideBySide(c.views(), time.Now(), 80, maxViewRows)
	for _, l := range lines {
		if w := utf8.RuneCountInString(l); w > 80 {
			t.Fatalf("a line is %d wide at 80 columns: %q", w, l)
		}
	}
	title := strings.Split(lines[0], " | ")
	if len(title) != 3 {
		t.Fatalf("title line %q: want three columns", lines[0])
	}
	for i, part := range title {
		if want := "node" + string(rune('1'+i)) + " (n" + string(rune('1'+i)) + ") up, 6 jobs"; strings.TrimSpace(part) != want {
			t.Errorf("column %d's title %q, want %q whole", i+1, part, want)
		}
	}
	for _, l := range lines[2:] {
		parts := strings.Split(l, " | ")
		if len(parts) != 3 {
			t.Fatalf("row %q: want a cell for each of the three nodes", l)
		}
		for i, p := range parts {
			f := strings.Fields(p)
			if len(f) < 3 || !slices.Contains([]string{"running", "completed", "cancelled", "queued", "failed"}, f[1]) ||
				!strings.HasPrefix(f[2], "n") || len(f[0]) < 8 {
				t.Errorf("node %d's cell %q: want an id of at least 8 letters, a whole state and an origin", i+1, p)
			}
		}
	}
}

func TestViewerFillsTheTerminalHeight(t *testing.T) {
	c := threeBusyNodes(t, 60)
	var out bytes.Buffer
	header := []string{"startup line 1", "startup line 2", "startup line 3"}
	v := &viewer{c: c, out: &out, tty: true, header: func() []string { return header },
		size: func() (int, int) { return 200, 40 }, start: time.Now()}
	v.draw(time.Now())
	s := strings.TrimSuffix(strings.TrimPrefix(out.String(), "\x1b[H"), "\x1b[J")
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) != 39 {
		t.Fatalf("%d lines drawn on a 40-line terminal, want 39 (all but one, so the last newline does not scroll):\n%s", len(lines), s)
	}
	// 40 lines: 3 of header, a blank, the sort note, a title, the column
	// names, 31 jobs, "... and 30 more" and the spare line.
	if !strings.Contains(s, "... and 30 more") {
		t.Fatalf("want 31 of 61 jobs shown and the rest counted:\n%s", s)
	}
	if !strings.Contains(lines[4], "latest change first") {
		t.Errorf("line 5 %q does not say how the rows are sorted", lines[4])
	}
	for i, h := range header {
		if !strings.HasPrefix(lines[i], h) {
			t.Errorf("line %d %q, want the header %q kept above the view", i+1, lines[i], h)
		}
	}
}

func TestSummaryHeadsEachNodesListWithItsColumns(t *testing.T) {
	c := threeBusyNodes(t, 2)
	var out bytes.Buffer
	summary(&out, c.views(), nil, true, "")
	lines := strings.Split(out.String(), "\n")
	if !strings.HasSuffix(lines[0], "3 jobs, by origin then id") {
		t.Fatalf("first line %q does not say how the list is sorted", lines[0])
	}
	head := lines[1]
	if strings.Join(strings.Fields(head), " ") != "ORIGIN ID MODEL ENGINE STATE" {
		t.Fatalf("second line %q, want the column names", head)
	}
	row := lines[2]
	for _, col := range []string{"ID", "MODEL", "ENGINE", "STATE"} {
		at := strings.Index(head, col)
		if at >= len(row) || row[at-1] != ' ' || row[at] == ' ' {
			t.Errorf("column %s starts at %d in %q but not in the row %q", col, at, head, row)
		}
	}
}

// On a terminal narrower than a URL the view keeps the URL whole (the
// terminal wraps it) and clips the other lines, and the wrapped rows are
// counted so the view still fits the height.
func TestViewerKeepsURLsWholeOnANarrowTerminal(t *testing.T) {
	c := threeBusyNodes(t, 60)
	var out bytes.Buffer
	url := "devcluster: node1 ingress http://127.0.0.1:14324/v1/workloads/events"
	long := "devcluster: node1 pid 4242 id 0d6c1f35-8a54-4c1e-9f1e-3c1b2a7d9e10 peer port 40001 log /tmp/x/node1.log"
	v := &viewer{c: c, out: &out, tty: true, header: func() []string { return []string{long, url} },
		size: func() (int, int) { return 40, 30 }, start: time.Now()}
	v.draw(time.Now())
	s := strings.TrimSuffix(strings.TrimPrefix(out.String(), "\x1b[H"), "\x1b[J")
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if got := strings.TrimSuffix(lines[1], "\x1b[K"); got != url {
		t.Fatalf("line 2 = %q, want the whole URL line %q", got, url)
	}
	rows := 0
	for i, l := range lines {
		l = strings.TrimSuffix(l, "\x1b[K")
		n := utf8.RuneCountInString(l)
		if n > 40 && !strings.Contains(l, "http://") {
			t.Errorf("line %d is %d columns on a 40-column terminal: %q", i+1, n, l)
		}
		rows += max(1, (n+39)/40)
	}
	if rows > 29 {
		t.Fatalf("the view takes %d rows of a 30-row terminal, want at most 29 (the URL's wrapped rows counted):\n%s", rows, s)
	}
}
