package main

import (
	"bufio"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// readmeSection returns the README's text from the heading line to the
// next heading of the same level.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q section", heading)
	}
	rest := text[i+1+len(heading):]
	level := heading[:strings.IndexByte(heading, ' ')+1]
	if j := strings.Index(rest, "\n"+level); j >= 0 {
		rest = rest[:j]
	}
	return rest
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

// TestREADMEMetricsAreTheOnesServed: the README's metrics table lists
// every family a node serves (the deprecated names aside), each name in
// it is served, and so is every name its example queries use.
func TestREADMEMetricsAreTheOnesServed(t *testing.T) {
	a, b := newMetricsNode(t, true), newMetricsNode(t, false)
	mesh(t, a, b) // per-peer families appear with a peer
	served := servedFamilies(t, a)
	section := readmeSection(t, "## Metrics")
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
			t.Errorf("%s is served but not in the README's metrics table", f)
		}
	}
	for f := range documented {
		if strings.HasPrefix(f, "process_") && runtime.GOOS != "linux" {
			continue
		}
		if !served[f] {
			t.Errorf("the README's metrics table lists %s, which is not served", f)
		}
	}
	if len(queried) == 0 {
		t.Fatal("no example queries found in the README's metrics section")
	}
	for q := range queried {
		if !served[q] {
			t.Errorf("an example query uses %s, which is not served", q)
		}
	}
}
