package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMain lets a test run the command's main in a process of its own, to
// see its exit code and its stderr as a user would.
func TestMain(m *testing.M) {
	if os.Getenv("WLMBENCH_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestInterleaveRunsEachServerOncePerTrialAndRotatesTheFirst(t *testing.T) {
	if got := [][]int{interleave(0, 2), interleave(1, 2), interleave(2, 2)}; !slices.EqualFunc(got, [][]int{{0, 1}, {1, 0}, {0, 1}}, slices.Equal) {
		t.Errorf("two servers: %v, want A B, B A, A B", got)
	}
	for n := 1; n <= 5; n++ {
		firsts := map[int]bool{}
		for i := range n {
			order := interleave(i, n)
			sorted := slices.Sorted(slices.Values(order))
			for j := range n {
				if sorted[j] != j {
					t.Fatalf("interleave(%d, %d) = %v: not each server once", i, n, order)
				}
			}
			firsts[order[0]] = true
		}
		if len(firsts) != n {
			t.Errorf("n=%d: over %d trials only %d servers went first", n, n, len(firsts))
		}
	}
}

func TestRunGroupKeepsResultsInServerOrderWhateverRanFirst(t *testing.T) {
	var order []string
	fn := func(who string, rate int64) trialFunc {
		return func(i int) (loadResult, time.Duration) {
			order = append(order, who)
			return loadResult{ok: rate, elapsed: time.Second}, time.Duration(rate)
		}
	}
	res := runGroup(3, []trialFunc{fn("a", 1), fn("b", 2), fn("c", 3)})
	if want := []string{"a", "b", "c", "b", "c", "a", "c", "a", "b"}; !slices.Equal(order, want) {
		t.Errorf("order = %v, want %v", order, want)
	}
	for i, trial := range res {
		for s, r := range trial {
			if r.load.ok != int64(s+1) || r.cpu != time.Duration(s+1) {
				t.Errorf("trial %d server %d holds %+v", i, s, r)
			}
		}
	}
}

func TestRunFigureAddsOtherBuildsBesideTheDaemonAndCeiling(t *testing.T) {
	fn := func(rate int64) trialFunc {
		return func(int) (loadResult, time.Duration) {
			return loadResult{ok: rate, elapsed: time.Second}, time.Microsecond
		}
	}
	p, all := runFigure(2, "test", fn(90), fn(100), []other{{roleBaseline, fn(60)}, {roleStock, fn(30)}})
	if len(all) != 4 || all[2].role != roleBaseline || all[3].role != roleStock {
		t.Fatalf("series: %d, roles %v", len(all), []string{all[0].role, all[1].role})
	}
	if median(p.ratio) != 0.9 || median(all[2].rate) != 60 || all[3].ok != 60 {
		t.Errorf("ratio %v, baseline rate %v, stock ok %d", p.ratio, all[2].rate, all[3].ok)
	}
}

func TestTrialRatiosPairTrialsAndSkipThoseWithoutAFigure(t *testing.T) {
	got := trialRatios([]float64{10, 0, 30, 8}, []float64{5, 5, 0, 4, 9})
	if want := []float64{2, 2}; !slices.Equal(got, want) {
		t.Errorf("trialRatios = %v, want %v", got, want)
	}
}

func TestCompareSeriesGivesThisOverTheOtherBuild(t *testing.T) {
	this := &series{rate: []float64{100, 120, 90}, cpu: []time.Duration{50 * time.Microsecond, 40 * time.Microsecond, 60 * time.Microsecond}}
	base := &series{rate: []float64{200, 200, 100}, cpu: []time.Duration{25 * time.Microsecond, 40 * time.Microsecond, 30 * time.Microsecond}}
	ceil := &series{rate: []float64{400, 400, 400}}
	c := compareSeries(this, base, ceil)
	if !c.rateOK || c.rateRatio != 0.6 || !c.cpuOK || c.cpuRatio != 2 {
		t.Errorf("rate ratio %v (%v), cpu ratio %v (%v); want 0.60 (median of 0.5, 0.6, 0.9), 2 (median of 2, 1, 2)", c.rateRatio, c.rateOK, c.cpuRatio, c.cpuOK)
	}
	var rate, cpu row
	c.baseCells(&rate, &cpu)
	if rate.base != "200/s, 0.50x of ceiling" || rate.vsBase != "0.60x" || cpu.base != "30.0us" || cpu.vsBase != "2.00x" {
		t.Errorf("cells: rate %q %q, cpu %q %q", rate.base, rate.vsBase, cpu.base, cpu.vsBase)
	}
	if c := compareSeries(this, &series{rate: []float64{0}, cpu: []time.Duration{0}}, nil); c.rateOK || c.cpuOK || c.cpu != "n/a" {
		t.Errorf("a build that measured nothing gave %+v", c)
	}
}

func TestStockRowsHoldIssue30sTargets(t *testing.T) {
	this := &series{rate: []float64{250}, cpu: []time.Duration{35 * time.Microsecond}}
	stock := &series{rate: []float64{100}, cpu: []time.Duration{100 * time.Microsecond}}
	rs := stockRows("ingress C=32", this, stock)
	if len(rs) != 2 || rs[0].result != pass || rs[1].result != pass || rs[0].ratio != "2.50x" || rs[1].ratio != "0.35x" {
		t.Errorf("at the bounds: %+v", rs)
	}
	this.rate[0], this.cpu[0] = 249, 36*time.Microsecond
	if rs := stockRows("p", this, stock); rs[0].result != miss || rs[1].result != miss {
		t.Errorf("past the bounds: %v %v", rs[0].result, rs[1].result)
	}
}

func TestTableShowsTheBaselineColumnsOnlyWhenARowHasThem(t *testing.T) {
	var tbl table
	tbl.add(row{section: "ingress", figure: "frames/s", measured: "9000/s", baseline: "10000/s", ratio: "0.90x", target: ">= 0.90x", result: pass})
	var b strings.Builder
	tbl.render(&b)
	if strings.Contains(b.String(), "this/baseline") {
		t.Errorf("a run without -baseline shows its columns:\n%s", b.String())
	}
	tbl.add(row{section: "ingress", figure: "  CPU", measured: "50.0us", base: "40.0us", vsBase: "1.25x"})
	b.Reset()
	tbl.render(&b)
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("got %d lines:\n%s", len(lines), b.String())
	}
	col := strings.Index(lines[0], "| this/baseline")
	if col < 0 || strings.Index(lines[0], "| baseline build") > col || strings.Index(lines[0], "| target") < col {
		t.Fatalf("header %q: want baseline build, this/baseline between ratio and target", lines[0])
	}
	if lines[3][col:col+len("| 1.25x")] != "| 1.25x" {
		t.Errorf("row %q: this/baseline not under its header", lines[3])
	}
	if !strings.HasSuffix(lines[2], "| PASS") {
		t.Errorf("row %q lost its verdict", lines[2])
	}
}

func TestContestantLeavesOutTheFlagsItsBuildLacks(t *testing.T) {
	c := &contestant{role: roleStock, bin: "/x/stock", known: map[string]bool{"--local-ingress": true}, logLevel: "warn"}
	if got := c.lacks("--local-ingress", "--app-dir", "--metrics"); !slices.Equal(got, []string{"--app-dir", "--metrics"}) {
		t.Errorf("lacks = %v", got)
	}
	o := c.opts(daemonOpts{name: "ingress"})
	if o.name != "ingress-stock" || o.logLevel != "warn" || !o.has("--local-ingress") || o.has("--resync-interval") {
		t.Errorf("opts = %+v", o)
	}
	if !(daemonOpts{}).has("--metrics") {
		t.Error("options without a probe (this build) lost a flag")
	}
	if line := skipLine("renewals", c, []string{"--max-live-workloads"}); strings.Contains(line, "\n") || !strings.Contains(line, "--max-live-workloads") || !strings.Contains(line, "stock") {
		t.Errorf("skip line %q", line)
	}
}

func TestRenewalsSpreadOverTheRenewedJobsOnly(t *testing.T) {
	counts := map[int]int{}
	owner := map[int]int{}
	for w := range 32 {
		for n := range 10 {
			j := renewTarget(w, n, 32, 64)
			counts[j]++
			if o, seen := owner[j]; seen && o != w {
				t.Fatalf("job %d renewed by producers %d and %d", j, o, w)
			}
			owner[j] = w
		}
	}
	if len(counts) != 64 {
		t.Errorf("renewed %d distinct jobs, want 64", len(counts))
	}
	for j, n := range counts {
		if j < 0 || j >= 64 || n != 5 {
			t.Errorf("job %d renewed %d times, want 5", j, n)
		}
	}
}

func TestNewJobModeOpensAJobPerFrame(t *testing.T) {
	body := ingressBody(modeNew, "n32-0")
	seen := map[string]bool{}
	for w := range 3 {
		for n := range 20 {
			f := string(body(nil, w, n))
			id := f[strings.Index(f, `"id":"`)+6:]
			id = id[:strings.IndexByte(id, '"')]
			if seen[id] || !strings.Contains(f, `"seq":1,`) {
				t.Fatalf("producer %d frame %d: %s", w, n, f)
			}
			seen[id] = true
		}
	}
	if string(ingressBody(modeCycling, "p")(nil, 1, 9)) != string(lifecycleBody("p")(nil, 1, 9)) {
		t.Error("cycling mode is not the lifecycle frames")
	}
}

func TestRSSBeyondTheFrame(t *testing.T) {
	r := rssResult{live: 1000, startKB: 10 << 10, endKB: 10<<10 + 2000, frameBytes: 292}
	if r.perLive() != 2048 || r.beyond() != 2048-292 {
		t.Errorf("per live %v, beyond %v", r.perLive(), r.beyond())
	}
	if (rssResult{}).perLive() != 0 {
		t.Error("no live jobs gave a figure")
	}
}

func TestParseFlagsIssue30(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "old-wlm")
	if err := os.WriteFile(bin, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := parseFlags([]string{"-baseline", bin, "-stock-bin", bin, "-only", "renewals,memory", "-renew-held", "1k,100k",
		"-renew-jobs", "64", "-ingress-modes", "new", "-mem-frames", "0", "-mem-rss-live", "20k"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.baseline != bin || !c.stock || !slices.Equal(c.ingressModes, []string{modeNew}) || !slices.Equal(c.renewHeld, []int{1000, 100000}) ||
		c.memFrames != 0 || !c.runs("renewals") || c.runs("ingress") {
		t.Errorf("parsed %+v", c)
	}
	if c.memRSSLive != 20000 {
		t.Errorf("-mem-rss-live 20k is %d", c.memRSSLive)
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"-baseline", filepath.Join(t.TempDir(), "none")}, "-baseline"},
		{[]string{"-stock-bin", t.TempDir()}, "-stock-bin"},
		{[]string{"-ingress-modes", "cycling,old"}, "-ingress-modes"},
		{[]string{"-renew-jobs", "65", "-renew-held", "64,1k"}, "-renew-jobs"},
		{[]string{"-renew-lease", "4"}, "-renew-lease"},
		{[]string{"-renew-held", "0"}, "-renew-held"},
		{[]string{"-mem-rss-live", "-1"}, "-mem-rss-live"},
		{[]string{"-no-such-flag"}, "-no-such-flag"},
		{[]string{"-t"}, "-t"},
		{[]string{"-only", "ingress", "stray"}, "stray"},
	} {
		var stderr strings.Builder
		_, err := parseFlags(tc.args, &stderr)
		if err == nil {
			t.Errorf("%q accepted", tc.args)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, tc.flag) {
			t.Errorf("%q: error %q is not one line naming %s", tc.args, msg, tc.flag)
		}
		if stderr.Len() > 0 {
			t.Errorf("%q: parseFlags wrote %q; main prints the one line", tc.args, stderr.String())
		}
	}
	var help strings.Builder
	if _, err := parseFlags([]string{"-h"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "-baseline") {
		t.Errorf("-h: %v, usage %q", err, help.String())
	}
}

func TestABadFlagIsOneLineAndExitTwo(t *testing.T) {
	for _, args := range [][]string{{"-baseline", "/nonexistent/wlm"}, {"-bogus"}, {"-renew-held", "x"}} {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "WLMBENCH_TEST_MAIN=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("%q: %v, want exit 2", args, err)
		}
		out := strings.TrimSuffix(stderr.String(), "\n")
		if strings.Contains(out, "\n") || !strings.HasPrefix(out, "wlmbench: ") || !strings.Contains(out, strings.TrimPrefix(args[0], "-")) {
			t.Errorf("%q: stderr %q, want one line naming the flag", args, stderr.String())
		}
	}
}

func TestIssue30BlockListsTheTargetsOfTheSelectedSections(t *testing.T) {
	c, err := parseFlags([]string{"-only", "ingress,renewals"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	g := issue30Goals(c)
	var names []string
	for _, x := range g.goals {
		names = append(names, x.name+" "+x.target)
	}
	want := []string{
		renewGoalName + " <= 1.20x",
		"ingress frames/s vs bare net/http, C=32 >= 0.90x",
		"ingress frames/s vs bare net/http, C=128 >= 0.90x",
		"ingress frames/s vs bare net/http, C=32, new job per frame >= 0.90x",
		"ingress frames/s vs bare net/http, C=128, new job per frame >= 0.90x",
	}
	if !slices.Equal(names, want) {
		t.Errorf("goals:\n%q\nwant\n%q", names, want)
	}
	if c, _ := parseFlags([]string{"-only", "fanout"}, io.Discard); len(issue30Goals(c).goals) != 0 {
		t.Error("a run without the issue's sections lists its targets")
	}
	c, _ = parseFlags([]string{"-only", "inbound,memory"}, io.Discard)
	var b strings.Builder
	issue30Goals(c).render(&b)
	if !strings.Contains(b.String(), "P=4 peers") || !strings.Contains(b.String(), "<= 1024 B") || !strings.Contains(b.String(), "0 of 2 targets measured") {
		t.Errorf("block:\n%s", b.String())
	}
}

func TestAnotherBuildsFailureIsOneNoteAndThisBuildsEndsTheRun(t *testing.T) {
	b := &bench{tbl: &table{}}
	boom := errors.New("exited before ready\n(exit status 2)")
	if err := b.buildFailed("inbound", &contestant{role: roleThis, bin: "/x/wlm"}, boom); err != boom {
		t.Errorf("this build's failure gave %v", err)
	}
	if err := b.buildFailed("inbound", &contestant{role: roleBaseline, bin: "/x/old-wlm"}, boom); err != nil {
		t.Errorf("the baseline's failure gave %v", err)
	}
	if len(b.tbl.notes) != 1 || strings.Contains(b.tbl.notes[0], "\n") || !strings.Contains(b.tbl.notes[0], "old-wlm") || !strings.Contains(b.tbl.notes[0], "skipped") {
		t.Errorf("notes = %q", b.tbl.notes)
	}
}
