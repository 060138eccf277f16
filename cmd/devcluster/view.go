package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Rendering limits.
const (
	viewInterval = 500 * time.Millisecond
	maxViewRows  = 20 // per node when the height is unknown (a plain snapshot); the rest is counted
	minViewRows  = 3  // per node however short the terminal
)

// sortNote says how each node's rows are ordered (sortJobs).
const sortNote = "each node's Jobs list, the latest change first:"

// isTerminal reports whether f is a character device (a terminal), with the
// standard library only.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// columnsEnv is $COLUMNS, or 0 when it is not a positive number.
func columnsEnv() int { return positiveEnv("COLUMNS") }

// linesEnv is $LINES, or 0 when it is not a positive number.
func linesEnv() int { return positiveEnv("LINES") }

func positiveEnv(name string) int {
	n, err := strconv.Atoi(os.Getenv(name))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// nodeView is what the view shows of one node.
type nodeView struct {
	name  string
	short string
	id    string
	up    bool
	stock bool  // the node runs the stock workload manager
	jobs  []job // the latest changed first
}

func (c *cluster) views() []nodeView {
	out := make([]nodeView, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = nodeView{name: n.name, short: n.short, id: n.id, up: n.isUp(), stock: n.stock, jobs: n.broker.snapshot()}
	}
	return out
}

// shortNames maps node ids to n1, n2, ...
func shortNames(views []nodeView) map[string]string {
	m := make(map[string]string, len(views))
	for _, v := range views {
		m[v.id] = v.short
	}
	return m
}

func shortOrigin(names map[string]string, origin string) string {
	if s, ok := names[origin]; ok {
		return s
	}
	if len(origin) > 8 {
		return origin[:8]
	}
	return origin
}

// signature is what a plain snapshot is printed on a change of: the nodes'
// state and jobs, not the ages, which change every second.
func signature(views []nodeView) string {
	var b strings.Builder
	for _, v := range views {
		fmt.Fprintf(&b, "%s %t\n", v.name, v.up)
		for _, j := range v.jobs {
			fmt.Fprintf(&b, "%q %q %q %q %q\n", j.Origin, j.ID, j.State, j.Model, j.Engine)
		}
	}
	return b.String()
}

// age renders how long ago a job was created.
func age(now time.Time, createdAtMs int64) string {
	if createdAtMs <= 0 {
		return "-"
	}
	d := max(now.Sub(time.UnixMilli(createdAtMs)), 0).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// fitLine fits a line of the view to a terminal w columns wide (0:
// unknown, left as it is) and says how many rows it takes. A line is
// clipped, except one that shows a URL: cut, a URL points nowhere and
// cannot be copied, so it is kept whole (the startup lines put each URL
// on its own line) and the terminal wraps it over as many rows as it
// needs, which the view's height accounts for.
func fitLine(l string, w int) (string, int) {
	n := utf8.RuneCountInString(l)
	switch {
	case w <= 0 || n <= w:
		return l, 1
	case strings.Contains(l, "http://"):
		return l, (n + w - 1) / w
	}
	return clip(l, w), 1
}

func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "~"
}

func pad(s string, n int) string {
	if k := utf8.RuneCountInString(s); k < n {
		return s + strings.Repeat(" ", n-k)
	}
	return s
}

// Columns of a node's Jobs list, with their minimum and maximum widths.
var (
	colNames = []string{"ID", "MODEL", "ENGINE", "STATE", "ORIGIN", "AGE"}
	colMin   = []int{10, 13, 8, 9, 6, 5} // steady widths, so the view does not jitter
	colCap   = []int{24, 16, 10, 10, 8, 6}
)

// layouts are the column sets tried in turn until the view fits the
// terminal: every column, then without ENGINE, then without MODEL too.
var layouts = [][]int{{0, 1, 2, 3, 4, 5}, {0, 1, 3, 4, 5}, {0, 3, 4, 5}}

// column renders one node's Jobs list, at most maxRows of it, with the
// columns of layout, as lines of one width.
func column(v nodeView, names map[string]string, now time.Time, layout []int, maxRows int) []string {
	shown := v.jobs
	if len(shown) > maxRows {
		shown = shown[:maxRows]
	}
	rows := [][]string{colNames}
	for _, j := range shown {
		rows = append(rows, []string{j.ID, j.Model, j.Engine, j.State, shortOrigin(names, j.Origin), age(now, j.CreatedAt)})
	}
	widths := slices.Clone(colMin)
	for _, r := range rows {
		for i, f := range r {
			widths[i] = max(widths[i], min(utf8.RuneCountInString(f), colCap[i]))
		}
	}
	lines := []string{columnTitle(v)}
	for _, r := range rows {
		fs := make([]string, 0, len(layout))
		for _, i := range layout {
			fs = append(fs, pad(clip(r[i], colCap[i]), widths[i]))
		}
		lines = append(lines, strings.TrimRight(strings.Join(fs, " "), " "))
	}
	if more := len(v.jobs) - len(shown); more > 0 {
		lines = append(lines, fmt.Sprintf("... and %d more", more))
	}
	return lines
}

// columnTitle is the line above a node's column: its name, whether its
// daemon is up, whether it is the stock workload manager, and how many
// jobs its broker holds.
func columnTitle(v nodeView) string {
	status := "up"
	if !v.up {
		status = "DOWN"
	}
	if v.stock {
		status += ", stock"
	}
	return fmt.Sprintf("%s (%s) %s, %d jobs", v.name, v.short, status, len(v.jobs))
}

// sideBySide renders every node's column next to the others, each with at
// most maxRows jobs. With a maxWidth (a terminal's), it drops the ENGINE,
// then the MODEL column until the rows fit; when even that is too wide it
// gives every node an equal share of the width with narrower fields
// (compactColumn), so each node keeps a readable column, and it clips
// lines only as a last resort, so a redraw in place never wraps.
func sideBySide(views []nodeView, now time.Time, maxWidth, maxRows int) []string {
	var out []string
	for _, layout := range layouts {
		out = sideBySideLayout(views, now, layout, maxRows)
		if maxWidth <= 0 || widest(out) <= maxWidth {
			return out
		}
	}
	out = sideBySideCompact(views, now, maxWidth, maxRows)
	for i, l := range out {
		out[i] = clip(l, maxWidth)
	}
	return out
}

// Widths of the compact column's fixed fields: a state is at most 9
// letters; an origin is n1 to n128 (maxNodes), headed FROM.
const (
	compactStateWidth = 9
	compactFromWidth  = 4
	compactMinID      = 4
)

// compactColumn renders a node's Jobs list in width: id, state and origin,
// the id clipped to what is left, with the age when the id keeps at least
// 10 letters beside it.
func compactColumn(v nodeView, names map[string]string, now time.Time, width, maxRows int) []string {
	idWidth := max(compactMinID, width-compactStateWidth-compactFromWidth-2)
	withAge := idWidth-6 >= 10
	if withAge {
		idWidth -= 6
	}
	row := func(id, state, from, age string) string {
		l := pad(clip(id, idWidth), idWidth) + " " + pad(clip(state, compactStateWidth), compactStateWidth) + " " + pad(from, compactFromWidth)
		if withAge {
			l += " " + age
		}
		return strings.TrimRight(l, " ")
	}
	lines := []string{clip(columnTitle(v), width), row("ID", "STATE", "FROM", "AGE")}
	shown := v.jobs
	if len(shown) > maxRows {
		shown = shown[:maxRows]
	}
	for _, j := range shown {
		lines = append(lines, row(j.ID, j.State, shortOrigin(names, j.Origin), age(now, j.CreatedAt)))
	}
	if more := len(v.jobs) - len(shown); more > 0 {
		lines = append(lines, clip(fmt.Sprintf("... and %d more", more), width))
	}
	return lines
}

// sideBySideCompact is sideBySide with every node's compactColumn given
// an equal share of maxWidth.
func sideBySideCompact(views []nodeView, now time.Time, maxWidth, maxRows int) []string {
	if len(views) == 0 {
		return nil
	}
	names := shortNames(views)
	width := max(compactMinID+compactStateWidth+compactFromWidth+2, (maxWidth-3*(len(views)-1))/len(views))
	cols := make([][]string, len(views))
	height := 0
	for i, v := range views {
		cols[i] = compactColumn(v, names, now, width, maxRows)
		height = max(height, len(cols[i]))
	}
	return joinColumns(cols, slices.Repeat([]int{width}, len(cols)), height)
}

// joinColumns sets columns of lines side by side, column i padded to
// widths[i], separated by " | ", height lines in all.
func joinColumns(cols [][]string, widths []int, height int) []string {
	out := make([]string, height)
	for row := range height {
		parts := make([]string, len(cols))
		for i, col := range cols {
			cell := ""
			if row < len(col) {
				cell = col[row]
			}
			parts[i] = pad(cell, widths[i])
		}
		out[row] = strings.TrimRight(strings.Join(parts, " | "), " ")
	}
	return out
}

func widest(lines []string) int {
	w := 0
	for _, l := range lines {
		w = max(w, utf8.RuneCountInString(l))
	}
	return w
}

func sideBySideLayout(views []nodeView, now time.Time, layout []int, maxRows int) []string {
	names := shortNames(views)
	cols := make([][]string, len(views))
	widths := make([]int, len(views))
	height := 0
	for i, v := range views {
		cols[i] = column(v, names, now, layout, maxRows)
		widths[i] = widest(cols[i])
		height = max(height, len(cols[i]))
	}
	return joinColumns(cols, widths, height)
}

// viewer draws the cluster every viewInterval: in place on a terminal, as a
// plain snapshot on each change otherwise.
type viewer struct {
	c      *cluster
	out    io.Writer
	tty    bool
	size   func() (cols, rows int) // the terminal's size; nil or 0: unknown
	header func() []string         // lines above the columns
	start  time.Time
	last   string
}

// rowsPerNode is how many jobs each node's column shows: as many as fill
// the terminal's height below the header (its title, the column names and
// a "... and N more" line, and one line spare so that the last newline
// does not scroll), or maxViewRows when the height is unknown.
func rowsPerNode(height, headerLines int) int {
	if height <= 0 {
		return maxViewRows
	}
	return max(minViewRows, height-headerLines-4)
}

func (v *viewer) draw(now time.Time) {
	views := v.c.views()
	lines := append(v.header(), "", sortNote)
	if v.tty {
		w, h := 0, 0
		if v.size != nil {
			w, h = v.size()
		}
		headerRows := 0
		for i, l := range lines {
			var rows int
			lines[i], rows = fitLine(l, w)
			headerRows += rows
		}
		for _, l := range sideBySide(views, now, w, rowsPerNode(h, headerRows)) {
			l, _ = fitLine(l, w)
			lines = append(lines, l)
		}
		var b strings.Builder
		b.WriteString("\x1b[H") // home; each line clears its rest, then the screen below
		for _, l := range lines {
			b.WriteString(l)
			b.WriteString("\x1b[K\n")
		}
		b.WriteString("\x1b[J")
		io.WriteString(v.out, b.String())
		return
	}
	sig := signature(views)
	if sig == v.last {
		return
	}
	lines = append(lines, sideBySide(views, now, 0, maxViewRows)...)
	v.last = sig
	var b strings.Builder
	fmt.Fprintf(&b, "=== %s, %.1fs ===\n", now.Format("15:04:05.000"), now.Sub(v.start).Seconds())
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	io.WriteString(v.out, b.String())
}

// run draws until ctx ends, then once more.
func (v *viewer) run(ctx context.Context) {
	if v.tty {
		io.WriteString(v.out, "\x1b[2J")
	}
	t := time.NewTicker(viewInterval)
	defer t.Stop()
	for {
		v.draw(time.Now())
		select {
		case <-ctx.Done():
			v.draw(time.Now())
			return
		case <-t.C:
		}
	}
}

// viewKey is what convergence compares: the set of (origin, id, state).
type viewKey struct{ origin, id, state string }

func viewSet(jobs []job) map[viewKey]bool {
	m := make(map[viewKey]bool, len(jobs))
	for _, j := range jobs {
		m[viewKey{j.Origin, j.ID, j.State}] = true
	}
	return m
}

// converged reports whether every node holds the same set of (origin, id,
// state), and otherwise how the first differing node differs from node 1.
func converged(views []nodeView) (bool, string) {
	if len(views) == 0 {
		return true, ""
	}
	ref := viewSet(views[0].jobs)
	names := shortNames(views)
	for _, v := range views[1:] {
		got := viewSet(v.jobs)
		var diffs []string
		for k := range ref {
			if !got[k] {
				diffs = append(diffs, fmt.Sprintf("lacks %s/%s %s", shortOrigin(names, k.origin), k.id, k.state))
			}
		}
		for k := range got {
			if !ref[k] {
				diffs = append(diffs, fmt.Sprintf("has %s/%s %s", shortOrigin(names, k.origin), k.id, k.state))
			}
		}
		if len(diffs) > 0 {
			slices.Sort(diffs)
			if len(diffs) > 6 {
				diffs = append(diffs[:6], fmt.Sprintf("and %d more", len(diffs)-6))
			}
			return false, fmt.Sprintf("%s differs from %s: %s", v.name, views[0].name, strings.Join(diffs, ", "))
		}
	}
	return true, ""
}

// summary prints, per node, every job it holds, then with --metrics each
// node's per-peer delivery counters, then the verdict.
func summary(w io.Writer, views []nodeView, deliveries []nodeDeliveries, ok bool, why string) {
	names := shortNames(views)
	for _, v := range views {
		fmt.Fprintf(w, "%s (%s, node id %s): %d jobs, by origin then id\n", v.name, v.short, v.id, len(v.jobs))
		if len(v.jobs) > 0 {
			fmt.Fprintf(w, "  %-6s %-24s %-16s %-10s %s\n", "ORIGIN", "ID", "MODEL", "ENGINE", "STATE")
		}
		js := slices.Clone(v.jobs)
		slices.SortFunc(js, func(x, y job) int {
			if c := strings.Compare(shortOrigin(names, x.Origin), shortOrigin(names, y.Origin)); c != 0 {
				return c
			}
			return strings.Compare(x.ID, y.ID)
		})
		for _, j := range js {
			fmt.Fprintf(w, "  %-6s %-24s %-16s %-10s %s\n", shortOrigin(names, j.Origin), j.ID, j.Model, j.Engine, j.State)
		}
	}
	if deliveries != nil {
		deliveryReport(w, views, deliveries)
	}
	if ok {
		n := 0
		if len(views) > 0 {
			n = len(views[0].jobs)
		}
		fmt.Fprintf(w, "converged: yes (every node holds the same %d jobs)\n", n)
		return
	}
	fmt.Fprintf(w, "converged: no (%s)\n", why)
}
