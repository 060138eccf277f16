package main

import (
	"bufio"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// docFiles are the Markdown files whose sections the tests read: the
// README and the guides under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md"}, files...)
}

// readmeSection returns the text of the section whose heading is heading's
// text (at whatever level: the README's sections moved into docs/ one
// level up) from the README or a guide under docs/, up to the next heading
// of the same or a higher level.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	want := strings.TrimSpace(strings.TrimLeft(heading, "#"))
	for _, name := range docFiles(t) {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		fence := false
		for i, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), "```") {
				fence = !fence
			}
			level := headingLevel(l)
			if fence || level == 0 || strings.TrimSpace(l[level:]) != want {
				continue
			}
			var out []string
			inner := false
			for _, m := range lines[i+1:] {
				if strings.HasPrefix(strings.TrimSpace(m), "```") {
					inner = !inner
				}
				if n := headingLevel(m); !inner && n > 0 && n <= level {
					break
				}
				out = append(out, m)
			}
			return strings.Join(out, "\n")
		}
	}
	t.Fatalf("neither the README nor docs/*.md has a %q section", want)
	return ""
}

// headingLevel is the level of an ATX heading line (the number of its
// leading #s), 0 for any other line.
func headingLevel(line string) int {
	n := len(line) - len(strings.TrimLeft(line, "#"))
	if n == 0 || n > 6 || !strings.HasPrefix(line[n:], " ") {
		return 0
	}
	return n
}

var metricName = regexp.MustCompile("`((?:nvpair_wlm|process|go)_[a-z_]+)(?:\\{[^}`]*\\})?`")

// servedFamilies scrapes n and returns the families its # TYPE lines name.
func servedFamilies(t *testing.T, n *testNode) map[string]bool {
	t.Helper()
	resp, err := http.Get("http://" + n.m.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = true
		}
	}
	return out
}

// TestREADMEMetricsAreTheOnesServed: the metrics reference
// (docs/metrics.md, linked from the README) lists every family a node
// serves (the deprecated names aside), each name in its tables is served,
// and so is every name its example queries use.
func TestREADMEMetricsAreTheOnesServed(t *testing.T) {
	a, b := newMetricsNode(t, true), newMetricsNode(t, false)
	mesh(t, a, b) // per-peer families appear with a peer
	served := servedFamilies(t, a)
	text, err := os.ReadFile(filepath.Join("docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := string(text)
	documented := map[string]bool{}
	queried := map[string]bool{}
	inQueries := false
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "```promql"):
			inQueries = true
		case strings.HasPrefix(line, "```"):
			inQueries = false
		case inQueries:
			for _, m := range regexp.MustCompile(`\b(?:nvpair_wlm|process)_[a-z_]+`).FindAllString(line, -1) {
				queried[m] = true
			}
		case strings.HasPrefix(line, "| `"):
			cell := strings.Split(line, "|")[1]
			for _, m := range metricName.FindAllStringSubmatch(cell, -1) {
				documented[m[1]] = true
			}
		}
	}
	deprecated := map[string]bool{"nvpair_wlm_resync_set_size": true, "nvpair_wlm_resync_set_limit": true, "nvpair_wlm_removal_memory_size": true}
	for f := range served {
		if !documented[f] && !deprecated[f] {
			t.Errorf("%s is served but not in the table of docs/metrics.md", f)
		}
	}
	for f := range documented {
		if strings.HasPrefix(f, "process_") && runtime.GOOS != "linux" {
			continue
		}
		if !served[f] {
			t.Errorf("the table of docs/metrics.md lists %s, which is not served", f)
		}
	}
	if len(queried) == 0 {
		t.Fatal("no example queries found in docs/metrics.md")
	}
	for q := range queried {
		if !served[q] {
			t.Errorf("an example query uses %s, which is not served", q)
		}
	}
}
