package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, or 0 for an empty slice.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// median returns the median of xs (the mean of the middle two for an even
// count), or 0 for none. xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// medianDuration is median over durations.
func medianDuration(ds []time.Duration) time.Duration {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	return time.Duration(median(xs))
}

// latencySummary holds the order statistics of one run.
type latencySummary struct {
	n             int
	p50, p99, max time.Duration
}

// summarize sorts lats in place and returns its summary.
func summarize(lats []time.Duration) latencySummary {
	slices.Sort(lats)
	s := latencySummary{n: len(lats), p50: percentile(lats, 50), p99: percentile(lats, 99)}
	if len(lats) > 0 {
		s.max = lats[len(lats)-1]
	}
	return s
}

func (s latencySummary) String() string {
	return fmt.Sprintf("%s / %s / %s", fmtDur(s.p50), fmtDur(s.p99), fmtDur(s.max))
}

// fmtDur prints a latency in ms with 2 significant decimals under 10 ms.
func fmtDur(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 10:
		return strconv.FormatFloat(ms, 'f', 2, 64) + "ms"
	case ms < 1000:
		return strconv.FormatFloat(ms, 'f', 0, 64) + "ms"
	default:
		return strconv.FormatFloat(ms/1000, 'f', 2, 64) + "s"
	}
}

// fmtMicros prints a CPU time per frame in microseconds.
func fmtMicros(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', 1, 64) + "us"
}

// fmtRate prints a rate in frames per second.
func fmtRate(r float64) string {
	return strconv.FormatFloat(r, 'f', 0, 64) + "/s"
}

// fmtRatio prints a ratio, or "-" when the baseline is zero.
func fmtRatio(num, den float64) string {
	if den == 0 {
		return "-"
	}
	return strconv.FormatFloat(num/den, 'f', 2, 64) + "x"
}

// verdict is a row's result column.
type verdict int

const (
	info verdict = iota // no target: a figure shown for context
	pass
	miss
	unavailable // the figure could not be measured
)

func (v verdict) String() string {
	switch v {
	case pass:
		return "PASS"
	case miss:
		return "FAIL"
	case unavailable:
		return "N/A"
	}
	return ""
}

// check turns a condition into PASS or FAIL.
func check(ok bool) verdict {
	if ok {
		return pass
	}
	return miss
}

// row is one line of the result table. base and vsBase are the -baseline
// build's figure and this build's over it; the table shows their columns
// only when some row has them, so a run without -baseline reads as before.
type row struct {
	section, figure, measured, baseline, ratio, target string
	base, vsBase                                       string
	result                                             verdict
}

// table is the harness's single result table.
type table struct {
	rows  []row
	notes []string
}

func (t *table) add(r row) { t.rows = append(t.rows, r) }

func (t *table) note(format string, args ...any) {
	t.notes = append(t.notes, fmt.Sprintf(format, args...))
}

var tableHeader = row{section: "section", figure: "figure", measured: "measured", baseline: "ceiling/baseline",
	ratio: "ratio", target: "target", base: "baseline build", vsBase: "this/baseline"}

// cells returns the row's columns; wide adds the -baseline build's two.
func (r row) cells(wide bool) []string {
	res := r.result.String()
	if r == tableHeader {
		res = "result"
	}
	if wide {
		return []string{r.section, r.figure, r.measured, r.baseline, r.ratio, r.base, r.vsBase, r.target, res}
	}
	return []string{r.section, r.figure, r.measured, r.baseline, r.ratio, r.target, res}
}

// wide reports whether any row has a -baseline figure.
func (t *table) wide() bool {
	for _, r := range t.rows {
		if r.base != "" || r.vsBase != "" {
			return true
		}
	}
	return false
}

// render writes the table with aligned columns, then its notes.
func (t *table) render(w io.Writer) {
	wide := t.wide()
	all := append([]row{tableHeader}, t.rows...)
	widths := make([]int, len(tableHeader.cells(wide)))
	for _, r := range all {
		for i, c := range r.cells(wide) {
			widths[i] = max(widths[i], len(c))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			if i > 0 {
				b.WriteString(" | ")
			}
			b.WriteString(c)
			if i < len(cells)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-len(c)))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(tableHeader.cells(wide))
	seps := make([]string, len(widths))
	for i, n := range widths {
		seps[i] = strings.Repeat("-", n)
	}
	fmt.Fprintln(w, strings.Join(seps, "-+-"))
	for _, r := range t.rows {
		line(r.cells(wide))
	}
	for _, n := range t.notes {
		fmt.Fprintln(w, "* "+n)
	}
}

// misses counts the rows that missed their target.
func (t *table) misses() int {
	n := 0
	for _, r := range t.rows {
		if r.result == miss {
			n++
		}
	}
	return n
}
