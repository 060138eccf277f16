package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestPercentileIsNearestRank(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 99, 0},
		{"one value is every percentile", ms(7), 1, 7 * time.Millisecond},
		{"p50 of 1..100 is 50", hundred, 50, 50 * time.Millisecond},
		{"p99 of 1..100 is 99", hundred, 99, 99 * time.Millisecond},
		{"p100 is the max", hundred, 100, 100 * time.Millisecond},
		{"p99 of ten values is the max", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
		{"p50 of four values is the second", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.sorted, tc.p); got != tc.want {
				t.Fatalf("percentile(p%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

func TestSummarizeSortsAndTakesOrderStatistics(t *testing.T) {
	lats := []time.Duration{5, 1, 4, 2, 3}
	s := summarize(lats)
	if s.n != 5 || s.p50 != 3 || s.p99 != 5 || s.max != 5 {
		t.Fatalf("summarize = %+v, want n=5 p50=3 p99=5 max=5", s)
	}
	if (summarize(nil) != latencySummary{}) {
		t.Fatal("summary of no latencies is not zero")
	}
}

func TestMedianOddEvenAndUnmodified(t *testing.T) {
	xs := []float64{3, 1, 2}
	if got := median(xs); got != 2 {
		t.Fatalf("median of 3 1 2 = %v, want 2", got)
	}
	if xs[0] != 3 {
		t.Fatal("median sorted its argument in place")
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Fatalf("median of 4 values = %v, want 2.5", got)
	}
	if got := median(nil); got != 0 {
		t.Fatalf("median of none = %v", got)
	}
	if got := medianDuration([]time.Duration{time.Second, 3 * time.Second, 2 * time.Second}); got != 2*time.Second {
		t.Fatalf("medianDuration = %v", got)
	}
}

func TestTableAlignsColumnsAndPrintsVerdicts(t *testing.T) {
	var tbl table
	tbl.add(row{section: "ingress", figure: "accepted frames/s", measured: "9000/s", baseline: "10000/s",
		ratio: "0.90x", target: ">= 0.60x", result: check(true)})
	tbl.add(row{section: "memory", figure: "goroutines", measured: "n/a", target: "within +-5", result: unavailable})
	tbl.add(row{section: "fan-out", figure: "frames/s", measured: "1/s", baseline: "10/s", ratio: "0.10x",
		target: ">= 0.50x", result: check(false)})
	tbl.add(row{section: "fan-out", figure: "  context only", measured: "x"})
	tbl.note("a note with %d", 42)
	var b strings.Builder
	tbl.render(&b)
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 7 {
		t.Fatalf("got %d lines, want header, rule, 4 rows, 1 note:\n%s", len(lines), b.String())
	}
	bar := strings.Index(lines[0], "| figure")
	for i, l := range lines[:6] {
		if i == 1 {
			if l[bar] != '+' {
				t.Errorf("rule line %q: column break not under the header's", l)
			}
			continue
		}
		if l[bar] != '|' {
			t.Errorf("line %d %q: first column not aligned with the header", i, l)
		}
	}
	for i, want := range []string{"PASS", "N/A", "FAIL"} {
		if !strings.HasSuffix(lines[2+i], "| "+want) {
			t.Errorf("row %d %q does not end with its verdict %s", i, lines[2+i], want)
		}
	}
	if strings.HasSuffix(lines[5], " ") {
		t.Errorf("trailing spaces on a row without verdict: %q", lines[5])
	}
	if lines[6] != "* a note with 42" {
		t.Errorf("note line = %q", lines[6])
	}
	if tbl.misses() != 1 || countTargets(&tbl) != 2 {
		t.Errorf("misses = %d, targets = %d; want 1 of 2", tbl.misses(), countTargets(&tbl))
	}
}

func TestFormatting(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{fmtDur(1234 * time.Microsecond), "1.23ms"},
		{fmtDur(42 * time.Millisecond), "42ms"},
		{fmtDur(1500 * time.Millisecond), "1.50s"},
		{fmtRate(1234.4), "1234/s"},
		{fmtRatio(3, 4), "0.75x"},
		{fmtRatio(3, 0), "-"},
		{mib(128 << 10), "128.0 MiB"},
		{fmtMicros(12345 * time.Nanosecond), "12.3us"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestLogValueReadsSlogTextLines(t *testing.T) {
	line := `time=2026-12-02T14:00:00Z level=WARN msg="peer queue full, dropping the newest frame for this peer" peer=sink3 principal=abc method=workload:started dropped=17`
	if got := logInt(line, "dropped"); got != 17 {
		t.Errorf("dropped = %d, want 17", got)
	}
	if got := logValue(line, "msg"); got != "peer queue full, dropping the newest frame for this peer" {
		t.Errorf("quoted msg = %q", got)
	}
	if got := logValue(line, "missing"); got != "" {
		t.Errorf("absent key = %q", got)
	}
	targets := `time=x level=INFO msg="broadcast targets changed" added="[sink0@127.0.0.1:1 sink1@127.0.0.1:2]" removed=[] total=8`
	if got := logInt(targets, "total"); got != 8 {
		t.Errorf("total = %d, want 8", got)
	}
	if got := logValue(`level=INFO msg="local ingress listening" addr=127.0.0.1:41234`, "addr"); got != "127.0.0.1:41234" {
		t.Errorf("addr = %q", got)
	}
}

func TestPromGaugeAndProcStatus(t *testing.T) {
	text := []byte("# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines_total_bogus 3\ngo_goroutines 17\n")
	if n, err := promGauge(text, "go_goroutines"); err != nil || n != 17 {
		t.Errorf("promGauge = %d, %v; want 17", n, err)
	}
	if _, err := promGauge([]byte("other 1\n"), "go_goroutines"); err == nil {
		t.Error("a missing gauge was not an error")
	}
	labelled := []byte("# TYPE nvpair_wlm_peer_queue_dropped_total counter\n" +
		"nvpair_wlm_peer_queue_dropped_total{peer=\"a\"} 3\n" +
		"nvpair_wlm_peer_queue_dropped_total{peer=\"b}\"} 4\n" +
		"nvpair_wlm_peer_queue_dropped_total_other 100\n")
	if v, n := promSum(labelled, "nvpair_wlm_peer_queue_dropped_total"); v != 7 || n != 2 {
		t.Errorf("promSum = %v over %d samples, want 7 over 2", v, n)
	}
	st := parseProcStatus([]byte("Name:\tnvpair\nVmHWM:\t   40960 kB\nVmRSS:\t   20480 kB\nThreads:\t7\n"))
	if st["VmHWM"] != 40960 || st["VmRSS"] != 20480 || len(st) != 2 {
		t.Errorf("parseProcStatus = %v", st)
	}
}

func TestScanIntFindsHarnessMembers(t *testing.T) {
	var buf []byte
	buf = appendFanoutFrame(buf, "node", 7, 42, 123456789)
	for key, want := range map[string]int64{`"benchRun":`: 7, `"benchSeq":`: 42, `"sentAtNs":`: 123456789} {
		if got, ok := scanInt(buf, key); !ok || got != want {
			t.Errorf("%s = %d, %v; want %d", key, got, ok, want)
		}
	}
	if _, ok := scanInt([]byte(`{"x":1}`), `"benchRun":`); ok {
		t.Error("found a member that is not there")
	}
}

func TestMemFramesWalkEachWorkloadToTheEnd(t *testing.T) {
	for j, wantLast := range map[int]string{10: `"workload:completed"`, 11: `"workloads:remove"`} {
		var methods []string
		for phase := range memFramesPerWorkload {
			f := string(memFrame(nil, phase, j))
			i := strings.Index(f, `"method":`)
			methods = append(methods, f[i+9:strings.Index(f[i+9:], ",")+i+9])
		}
		if methods[0] != `"workload:submitted"` || methods[4] != wantLast {
			t.Errorf("workload %d: methods %v", j, methods)
		}
	}
}

func TestParseFlagsDefaultsAndRefusals(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.c != 32 || c.t != 5*time.Second || c.k != 8 || c.fanFrames != 10000 || c.memFrames != 1_000_000 || len(c.sections()) != 7 {
		t.Errorf("defaults = %+v", c)
	}
	if c, err := parseFlags([]string{"-only", "memory", "-mem-frames", "50000"}, io.Discard); err != nil || !c.runs("memory") || c.runs("ingress") {
		t.Errorf("-only memory: %+v, %v", c, err)
	}
	for _, args := range [][]string{{"-only", "nope"}, {"-window", "2000"}, {"-k", "1"}, {"-mem-frames", "3"}, {"-t", "0s"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
