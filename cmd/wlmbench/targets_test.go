package main

import (
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestIngressTargetsAreNamedAt32And128ProducersOnly(t *testing.T) {
	for _, tc := range []struct {
		c     int
		least float64
		has   bool
	}{{1, 0, false}, {8, 0, false}, {32, 0.80, true}, {64, 0, false}, {128, 0.75, true}} {
		least, has := ingressTarget(tc.c)
		if least != tc.least || has != tc.has {
			t.Errorf("ingressTarget(%d) = %v, %v; want %v, %v", tc.c, least, has, tc.least, tc.has)
		}
	}
}

func TestRatioVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		got      verdict
		want     verdict
		measured string
	}{
		{"a rate at its bound passes", atLeast(0.80, true, 0.80), pass, ""},
		{"a rate just under its bound fails", atLeast(0.7999, true, 0.80), miss, ""},
		{"a daemon that accepted nothing fails", atLeast(0, true, 0.80), miss, ""},
		{"a rate without a ceiling figure is not available", atLeast(0, false, 0.80), unavailable, ""},
		{"a NaN rate ratio is not available", atLeast(math.NaN(), true, 0.80), unavailable, ""},
		{"a p99 at its bound passes", atMost(1.5, true, 1.5), pass, ""},
		{"a p99 just over its bound fails", atMost(1.5001, true, 1.5), miss, ""},
		{"a p99 ratio of zero (a p99 missing) is not available", atMost(0, true, 1.5), unavailable, ""},
		{"a p99 without trials is not available", atMost(1, false, 1.5), unavailable, ""},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestRatioIsTheMedianOfPerTrialRatios(t *testing.T) {
	if r, ok := ratioOf(nil); ok || r != 0 {
		t.Errorf("ratioOf(nil) = %v, %v; want 0, false", r, ok)
	}
	if r, ok := ratioOf([]float64{0.9, 0.5, 0.7}); !ok || r != 0.7 {
		t.Errorf("ratioOf = %v, %v; want 0.7, true", r, ok)
	}
	var p pairResult
	ms := time.Millisecond
	p.add(loadResult{ok: 10, elapsed: time.Second, lats: latencySummary{p99: 3 * ms}},
		loadResult{ok: 20, elapsed: time.Second, lats: latencySummary{p99: 2 * ms}}, 0, 0)
	p.add(loadResult{ok: 10, elapsed: time.Second}, loadResult{}, 0, 0) // the ceiling measured nothing
	p.add(loadResult{ok: 5, failed: 2, elapsed: time.Second, lats: latencySummary{p99: 4 * ms}},
		loadResult{ok: 10, elapsed: time.Second, lats: latencySummary{p99: 1 * ms}}, 0, 0)
	if !slices.Equal(p.ratio, []float64{0.5, 0.5}) {
		t.Errorf("rate ratios = %v, want [0.5 0.5]: a trial whose ceiling measured nothing has none", p.ratio)
	}
	if got := p.p99Ratios(); !slices.Equal(got, []float64{1.5, 4}) {
		t.Errorf("p99 ratios = %v, want [1.5 4]: a trial missing a p99 has none", got)
	}
	if p.dOK != 25 || p.cOK != 30 || p.dFailed != 2 || len(p.failures) != 1 {
		t.Errorf("totals: daemon %d ok %d failed, ceiling %d ok, failures %q", p.dOK, p.dFailed, p.cOK, p.failures)
	}
}

func TestRunPairAlternatesWhichServerGoesFirst(t *testing.T) {
	var order []string
	trial := func(who string) trialFunc {
		return func(i int) (loadResult, time.Duration) {
			order = append(order, who+string(rune('0'+i)))
			return loadResult{ok: 1, elapsed: time.Second}, 0
		}
	}
	p := runPair(4, "test", trial("d"), trial("c"))
	if want := []string{"d0", "c0", "c1", "d1", "d2", "c2", "c3", "d3"}; !slices.Equal(order, want) {
		t.Errorf("order = %v, want %v", order, want)
	}
	if len(p.dRate) != 4 || len(p.ratio) != 4 {
		t.Errorf("recorded %d trials, %d ratios; want 4 of each", len(p.dRate), len(p.ratio))
	}
}

func TestSweepCountsAddTheHalfRateProducersOnce(t *testing.T) {
	for _, tc := range []struct {
		sweep []int
		c     int
		want  []int
	}{
		{[]int{1, 8, 32, 128}, 32, []int{1, 8, 32, 128}},
		{[]int{128, 1}, 32, []int{1, 32, 128}},
		{[]int{8, 8}, 8, []int{8}},
	} {
		got := sweepCounts(tc.sweep, tc.c)
		if !slices.Equal(got, tc.want) {
			t.Errorf("sweepCounts(%v, %d) = %v, want %v", tc.sweep, tc.c, got, tc.want)
		}
	}
	sweep := []int{128, 1}
	sweepCounts(sweep, 32)
	if !slices.Equal(sweep, []int{128, 1}) {
		t.Errorf("sweepCounts changed its argument to %v", sweep)
	}
}

func TestParseFlagsSweepAndInboundPeers(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.sweep, []int{1, 8, 32, 128}) || !slices.Equal(c.inPeers, []int{1, 4, 16}) {
		t.Errorf("defaults: -sweep %v, -inbound-peers %v", c.sweep, c.inPeers)
	}
	c, err = parseFlags([]string{"-only", "inbound", "-sweep", "2,64", "-inbound-peers", "1,2"}, io.Discard)
	if err != nil || !c.runs("inbound") || c.runs("ingress") || !slices.Equal(c.sweep, []int{2, 64}) || !slices.Equal(c.inPeers, []int{1, 2}) {
		t.Errorf("-only inbound -sweep 2,64 -inbound-peers 1,2: %+v, %v", c, err)
	}
	for _, args := range [][]string{{"-sweep", "0"}, {"-sweep", ""}, {"-sweep", "x"}, {"-inbound-peers", "0,4"}, {"-inbound-peers", "-1"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

func TestSummaryBlockListsEveryIssue14Target(t *testing.T) {
	cfg, err := parseFlags([]string{"-inbound-peers", "2,4"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	g := issue14Goals(cfg)
	var names []string
	for _, x := range g.goals {
		names = append(names, x.name)
	}
	want := []string{ingressGoalName(32), ingressGoalName(128), inboundGoalName(1), inboundGoalName(2), inboundGoalName(4), inboundGoalName(16), halfRateGoalName}
	if !slices.Equal(names, want) {
		t.Fatalf("targets %q,\nwant %q", names, want)
	}
	g.set(ingressGoalName(32), ">= 0.80x", "0.81x (81/s vs 100/s)", pass)
	g.set(halfRateGoalName, "<= 1.50x", "2.00x (2ms vs 1ms)", miss)
	g.set(inboundGoalName(4), ">= 0.80x", "n/a", unavailable)
	var b strings.Builder
	g.render(&b)
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != len(want)+2 {
		t.Fatalf("got %d lines, want a title, %d targets and a count:\n%s", len(lines), len(want), b.String())
	}
	for i, end := range []string{"PASS", "not run", "not run", "not run", "N/A", "not run", "FAIL"} {
		if l := lines[1+i]; !strings.HasSuffix(l, "  "+end) || !strings.Contains(l, want[i]) {
			t.Errorf("line %q: want %s ending in %s", l, want[i], end)
		}
	}
	if got := lines[len(lines)-1]; got != "  2 of 7 targets measured, 1 passed" {
		t.Errorf("count line = %q", got)
	}
	col := strings.Index(lines[1], ">= 0.80x")
	if strings.Index(lines[7], "<= 1.50x") != col {
		t.Errorf("target column not aligned:\n%s", b.String())
	}
	g.set("a target the issue does not name", "= 1", "1", pass)
	if last := g.goals[len(g.goals)-1]; last.name != "a target the issue does not name" {
		t.Errorf("an unnamed target was not added at the end: %+v", last)
	}
}

func TestRatioCellNamesTheDaemonsRefusals(t *testing.T) {
	r := row{measured: "80/s", baseline: "100/s", ratio: "0.80x"}
	if got := ratioCell(r, true, &pairResult{dOK: 160}); got != "0.80x (80/s vs 100/s)" {
		t.Errorf("cell = %q", got)
	}
	if got := ratioCell(r, true, &pairResult{dOK: 160, dFailed: 40}); got != "0.80x (80/s vs 100/s; daemon refused 40 of 200)" {
		t.Errorf("cell with refusals = %q", got)
	}
	if got := ratioCell(r, false, &pairResult{}); got != "n/a" {
		t.Errorf("unmeasured cell = %q", got)
	}
}
