package main

import (
	"encoding/binary"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// readLogRecords decodes the durable ceiling's log file in dir, failing
// the test on a record whose checksum does not match.
func readLogRecords(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "durable-*.log"))
	if err != nil || len(names) != 1 {
		t.Fatalf("log files in %s: %v, %v", dir, names, err)
	}
	b, err := os.ReadFile(names[0])
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for len(b) > 0 {
		if len(b) < 8 {
			t.Fatalf("a record header cut short: %d bytes left", len(b))
		}
		n := binary.LittleEndian.Uint32(b[:4])
		payload := b[8 : 8+n]
		if crc32.Update(crc32.Checksum(b[:4], durableCRC), durableCRC, payload) != binary.LittleEndian.Uint32(b[4:8]) {
			t.Fatalf("record %d: checksum does not match", len(out))
		}
		out = append(out, string(payload))
		b = b[8+n:]
	}
	return out
}

func TestDurableCeilingAnswersOnlyOnceTheFrameIsInItsLog(t *testing.T) {
	dir := t.TempDir()
	l, err := openGroupLog(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(durableHandler(l))
	defer srv.Close()
	post := func(body string) int {
		resp, err := http.Post(srv.URL+ingressPath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	frame := string(appendLifecycle(nil, "workload:started", "running", "d", 1, 2, 3))
	if got := post(frame); got != http.StatusOK {
		t.Fatalf("a valid frame: %d", got)
	}
	// Its record is in the file when its answer arrives: no wait here.
	if got := readLogRecords(t, dir); !slices.Equal(got, []string{frame}) {
		t.Fatalf("after one 200 the log holds %q", got)
	}
	if got := post(`{"jsonrpc":`); got != http.StatusBadRequest {
		t.Errorf("a body that is not JSON: %d", got)
	}
	if got := readLogRecords(t, dir); len(got) != 1 {
		t.Errorf("a refused frame was logged: %q", got)
	}
}

func TestGroupLogKeepsEveryConcurrentFrameWhole(t *testing.T) {
	dir := t.TempDir()
	l, err := openGroupLog(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 16, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for n := range each {
				if err := l.commit([]byte("frame-" + strconv.Itoa(w) + "-" + strconv.Itoa(n))); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got := readLogRecords(t, dir)
	if len(got) != writers*each {
		t.Fatalf("%d records, want %d", len(got), writers*each)
	}
	slices.Sort(got)
	if len(slices.Compact(got)) != writers*each {
		t.Error("a frame was logged twice")
	}
}

func TestGroupLogBehindAnswersOnceWrittenAndFsyncsWithinItsInterval(t *testing.T) {
	dir := t.TempDir()
	l, err := openGroupLog(dir, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// An answer that waited for the hour's fsync would not come: commit
	// returns once the write is done, and the record is in the file.
	if err := l.commit([]byte("one")); err != nil {
		t.Fatal(err)
	}
	if got := readLogRecords(t, dir); !slices.Equal(got, []string{"one"}) {
		t.Errorf("log holds %q", got)
	}
}

func TestParseFlagsFsyncModesAndDaemonArgs(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.fsyncModes, []string{fsyncAlways, "100ms"}) || c.daemonArgs != nil || c.daemonFsync != "" {
		t.Errorf("defaults: modes %q, args %q, fsync %q", c.fsyncModes, c.daemonArgs, c.daemonFsync)
	}
	c, err = parseFlags([]string{"-daemon-args", "--journal-fsync 250ms --log-format json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.fsyncModes, []string{"250ms"}) || c.daemonFsync != "250ms" || !slices.Equal(c.daemonArgs, []string{"--log-format", "json"}) {
		t.Errorf("-daemon-args with --journal-fsync: modes %q, fsync %q, args %q", c.fsyncModes, c.daemonFsync, c.daemonArgs)
	}
	c, err = parseFlags([]string{"-daemon-args", "--journal-fsync=always", "-only", "memory"}, io.Discard)
	if err != nil || c.daemonFsync != fsyncAlways || len(c.daemonArgs) != 0 {
		t.Errorf("--journal-fsync=always: %q, %q, %v", c.daemonFsync, c.daemonArgs, err)
	}
	c, err = parseFlags([]string{"-journal-fsync", "50ms,always"}, io.Discard)
	if err != nil || !slices.Equal(c.fsyncModes, []string{"50ms", fsyncAlways}) {
		t.Errorf("-journal-fsync 50ms,always: %q, %v", c.fsyncModes, err)
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"-journal-fsync", "5ms"}, "-journal-fsync"},
		{[]string{"-journal-fsync", "always,always"}, "-journal-fsync"},
		{[]string{"-journal-fsync", "sometimes"}, "-journal-fsync"},
		{[]string{"-daemon-args", "--journal-fsync"}, "-daemon-args"},
		{[]string{"-daemon-args", "--journal-fsync 11s"}, "-daemon-args"},
		{[]string{"-daemon-args", "--journal-fsync 1s", "-journal-fsync", "always"}, "-journal-fsync"},
	} {
		_, err := parseFlags(tc.args, io.Discard)
		if err == nil {
			t.Errorf("%q accepted", tc.args)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, tc.flag) {
			t.Errorf("%q: error %q is not one line naming %s", tc.args, msg, tc.flag)
		}
	}
}

func TestThisBuildsDaemonsTakeItsFsyncModeAndExtraFlags(t *testing.T) {
	this := &contestant{role: roleThis, known: map[string]bool{"--journal-fsync": true}, fsync: "100ms", args: []string{"--log-format", "json"}}
	o := this.opts(daemonOpts{name: "ingress"})
	if o.fsync != "100ms" || !slices.Equal(o.extra, []string{"--log-format", "json"}) {
		t.Errorf("this build: fsync %q, extra %q", o.fsync, o.extra)
	}
	if o := this.opts(daemonOpts{name: "ingress", fsync: fsyncAlways}); o.fsync != fsyncAlways {
		t.Errorf("a section's own fsync mode was replaced by %q", o.fsync)
	}
	base := &contestant{role: roleBaseline, known: map[string]bool{}}
	if o := base.opts(daemonOpts{name: "ingress"}); o.fsync != "" || len(o.extra) != 0 {
		t.Errorf("the baseline build got this build's flags: %q, %q", o.fsync, o.extra)
	}
}

func TestIssue39BlockListsTheDurableAndBehindTargets(t *testing.T) {
	c, err := parseFlags([]string{"-only", "ingress", "-journal-fsync", "always,100ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range issue39Goals(c).goals {
		names = append(names, strings.TrimSpace(x.name)+" "+x.target)
	}
	want := []string{
		"ingress frames/s vs the durable ceiling, C=32 >= 0.90x",
		"ingress CPU per frame over the durable ceiling's, C=32 <= 1.20x",
		"ingress frames/s vs bare net/http, C=32, --journal-fsync 100ms >= 0.90x",
	}
	if len(names) != 12 || !slices.Equal(names[:3], want) {
		t.Errorf("goals:\n%q\nwant 12 starting\n%q", names, want)
	}
	c, _ = parseFlags([]string{"-only", "ingress", "-journal-fsync", "100ms"}, io.Discard)
	for _, x := range issue39Goals(c).goals {
		if strings.Contains(x.name, "durable") {
			t.Errorf("a run without the always mode lists %q", x.name)
		}
	}
	if c, _ := parseFlags([]string{"-only", "memory"}, io.Discard); len(issue39Goals(c).goals) != 0 {
		t.Error("a run without the ingress lists issue 39's targets")
	}
}

func TestFsyncRowsHoldEachModeAgainstItsDurableCeilingAlike(t *testing.T) {
	cfg, err := parseFlags([]string{"-only", "ingress", "-journal-fsync", "always,100ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{cfg: cfg, tbl: &table{}, goals39: issue39Goals(cfg)}
	s := func(role string, rate float64, cpu time.Duration) *series {
		return &series{role: role, rate: []float64{rate, rate}, cpu: []time.Duration{cpu, cpu}}
	}
	all := []*series{
		s(roleThis, 9000, 60*time.Microsecond), s("ceiling", 20000, 25*time.Microsecond),
		s(durableRole(fsyncAlways), 10000, 45*time.Microsecond), s(durableRole("100ms"), 18000, 30*time.Microsecond),
		s(thisInMode("100ms"), 18500, 35*time.Microsecond), s(roleStock, 4000, 130*time.Microsecond),
	}
	b.fsyncRows("C=32", 32, all)
	got := map[string]row{}
	for _, r := range b.tbl.rows {
		got[strings.TrimSpace(r.figure)] = r
	}
	for fig, want := range map[string]struct{ ratio, target, result string }{
		"against the durable ceiling, fsync always, at C=32":                                      {"0.90x", ">= 0.90x", "PASS"},
		"CPU per frame over the durable ceiling's, fsync always, at C=32 (ratio: daemon/ceiling)": {"1.33x", "<= 1.20x", "FAIL"},
		"accepted frames/s, C=32, --journal-fsync 100ms closed loop":                              {"0.93x", ">= 0.90x", "PASS"},
		"against the durable ceiling, fsync 100ms, at C=32":                                       {"1.03x", "", ""},
		"C=32, --journal-fsync 100ms: frames/s over the stock daemon's":                           {"4.62x", ">= 2.20x", "PASS"},
		"C=32, --journal-fsync 100ms: CPU per frame over the stock daemon's":                      {"0.27x", "<= 0.50x", "PASS"},
	} {
		r, ok := got[fig]
		if !ok {
			t.Errorf("no row %q among %d", fig, len(b.tbl.rows))
			continue
		}
		if r.ratio != want.ratio || r.target != want.target || r.result.String() != want.result {
			t.Errorf("%q: ratio %s target %q result %q, want %+v", fig, r.ratio, r.target, r.result, want)
		}
	}
	if _, ok := got["C=32: frames/s over the stock daemon's"]; ok {
		t.Error("the first mode's stock rows were added twice (issue 30's rows hold them)")
	}
	var block strings.Builder
	b.goals39.render(&block)
	var stockLine string
	for _, l := range strings.Split(block.String(), "\n") {
		if strings.Contains(l, "ingress frames/s over the stock daemon's, C=32  ") {
			stockLine = strings.Join(strings.Fields(l), " ")
		}
	}
	if !strings.HasSuffix(stockLine, "2.25x (9000/s vs 4000/s) >= 1.50x PASS") {
		t.Errorf("the stock target in the default mode is issue 39's 1.5x: %q in\n%s", stockLine, block.String())
	}
}
