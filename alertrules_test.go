package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The operator's files for Prometheus and Grafana (README, "Metrics").
const (
	alertRulesFile     = "deploy/prometheus/nvpair-wlm-rules.yml"
	alertRulesTestFile = "deploy/prometheus/nvpair-wlm-rules.test.yml"
	dashboardFile      = "deploy/grafana/nvpair-wlm-dashboard.json"
)

// alertRule is one alert of the rules file: its name and expression. The
// rules file keeps each expression on one line, so it is read without a
// YAML parser (the module uses the standard library only).
type alertRule struct{ name, expr string }

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []alertRule
	for _, m := range regexp.MustCompile(`(?m)^\s+- alert: (\S+)\n\s+expr: (.+)$`).FindAllStringSubmatch(string(b), -1) {
		out = append(out, alertRule{m[1], strings.TrimSpace(m[2])})
	}
	if n := strings.Count(string(b), "- alert:"); n != len(out) || n == 0 {
		t.Fatalf("%s: read %d alerts with a one-line expr out of %d", alertRulesFile, len(out), n)
	}
	return out
}

// dashboardExprs returns every query of the Grafana dashboard, by panel title.
func dashboardExprs(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	out := map[string][]string{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out[p.Title] = append(out[p.Title], tg.Expr)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no queries", dashboardFile)
	}
	return out
}

// needPromtool returns promtool's path; CI installs it (.ci/run), and a
// machine without it skips.
func needPromtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed; .ci/run installs the prometheus package")
		}
		t.Skip("promtool not installed")
	}
	return p
}

// TestAlertRulesPassPromtool checks the rules file and runs its unit tests:
// each alert fires on the series it is for, not before its `for`, and not
// on the series beside it that should not page anyone.
func TestAlertRulesPassPromtool(t *testing.T) {
	promtool := needPromtool(t)
	if out, err := exec.Command(promtool, "check", "rules", alertRulesFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	cmd := exec.Command(promtool, "test", "rules", filepath.Base(alertRulesTestFile))
	cmd.Dir = filepath.Dir(alertRulesTestFile)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	// Every alert has a test that names it.
	tests, err := os.ReadFile(alertRulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range alertRules(t) {
		if !strings.Contains(string(tests), "alertname: "+r.name+"\n") {
			t.Errorf("%s has no test in %s", r.name, alertRulesTestFile)
		}
	}
}

// TestDashboardQueriesParse runs every dashboard query through promtool's
// parser, as a recording rule each, so a query Grafana would show as an
// error fails here instead.
func TestDashboardQueriesParse(t *testing.T) {
	promtool := needPromtool(t)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	i := 0
	for title, exprs := range dashboardExprs(t) {
		for _, e := range exprs {
			i++
			q, _ := json.Marshal(e) // a JSON string is a YAML double-quoted string
			fmt.Fprintf(&b, "      # %s\n      - record: dashboard_query_%d\n        expr: %s\n", strings.ReplaceAll(title, "\n", " "), i, q)
		}
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("a dashboard query does not parse: %v\n%s\n%s", err, out, b.String())
	}
}

// TestDashboardPlotsWhatEveryAlertFiresOn: each side of every alert's
// expression, its threshold taken off, is a query of the dashboard, so the
// panel an operator opens for an alert shows the number it fired on.
func TestDashboardPlotsWhatEveryAlertFiresOn(t *testing.T) {
	plotted := map[string]bool{}
	for _, exprs := range dashboardExprs(t) {
		for _, e := range exprs {
			plotted[e] = true
		}
	}
	threshold := regexp.MustCompile(`\s*(>|<|==|!=|>=|<=)\s*[0-9.]+$`)
	for _, r := range alertRules(t) {
		for _, side := range strings.Split(r.expr, " and on (instance) ") {
			if q := threshold.ReplaceAllString(side, ""); !plotted[q] {
				t.Errorf("%s: the dashboard has no query %q", r.name, q)
			}
		}
	}
}

// TestAlertRulesAndDashboardUseServedMetrics: every metric name the rules
// and the dashboard query is one a node serves (histogram series by their
// family), so a renamed family fails here rather than leaving an alert
// that can never fire.
func TestAlertRulesAndDashboardUseServedMetrics(t *testing.T) {
	a, b := newMetricsNode(t, true), newMetricsNode(t, false)
	mesh(t, a, b) // per-peer families appear with a peer
	served := servedFamilies(t, a)
	name := regexp.MustCompile(`\b(?:nvpair_wlm|process|go)_[a-z_]+\b`)
	check := func(where, expr string) {
		names := name.FindAllString(expr, -1)
		if len(names) == 0 && !strings.HasPrefix(expr, "up{") {
			t.Errorf("%s: %q queries none of the daemon's metrics", where, expr)
		}
		for _, n := range names {
			family := n
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if f, ok := strings.CutSuffix(n, suffix); ok && served[f] {
					family = f
				}
			}
			if !served[family] {
				t.Errorf("%s: %s is not served by the daemon", where, n)
			}
		}
	}
	for _, r := range alertRules(t) {
		check(alertRulesFile+" "+r.name, r.expr)
	}
	for title, exprs := range dashboardExprs(t) {
		for _, e := range exprs {
			check(dashboardFile+" "+title, e)
		}
	}
}

// TestREADMEListsEveryAlert: the README's alert table names every alert of
// the rules file, and no other.
func TestREADMEListsEveryAlert(t *testing.T) {
	section := readmeSection(t, "### Alerts and a dashboard")
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(NvpairWlm[A-Za-z]+)` \\|").FindAllStringSubmatch(section, -1) {
		listed[m[1]] = true
	}
	for _, r := range alertRules(t) {
		if !listed[r.name] {
			t.Errorf("the README's alert table does not list %s", r.name)
		}
		delete(listed, r.name)
	}
	for name := range listed {
		t.Errorf("the README's alert table lists %s, which the rules file does not have", name)
	}
}
