package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// needTool returns the path of a tool CI installs (.ci/run installs the
// prometheus package, with promtool and prometheus); a machine without it
// skips.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed; .ci/run installs the prometheus package", name)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}

// TestDevclusterMetricsWritesAPrometheusConfigThatScrapesEveryNode runs the
// README's "watch it in Prometheus" as written: the dev cluster with
// --metrics prints its Prometheus config, and a real Prometheus started
// with the printed command scrapes every node and loads the alert rules.
func TestDevclusterMetricsWritesAPrometheusConfigThatScrapesEveryNode(t *testing.T) {
	needsDaemons(t) // runs the dev cluster on daemonBin
	t.Parallel()
	promtool := needTool(t, "promtool")
	prometheus := needTool(t, "prometheus")
	var stdout, stderr lockedBuffer
	var c *cluster
	sigs := make(chan os.Signal, 1)
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"--bin", daemonBin, "--nodes", "2", "--ingress", "127.0.0.1:0", "--metrics"},
			&stdout, &stderr, sigs, false, hooks{created: func(x *cluster) { c = x }})
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		sigs <- os.Interrupt
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Errorf("the dev cluster did not stop within 60 s of its interrupt")
		}
	}
	defer stop()
	line := regexp.MustCompile(`(?m)^devcluster: Prometheus config (\S+); watch the cluster with: prometheus (--config.file=\S+) (--storage.tsdb.path=\S+)$`)
	var m []string
	eventually(t, "the Prometheus config line", func() bool {
		m = line.FindStringSubmatch(stdout.String())
		return m != nil
	})
	path := m[1]
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes {
		if !strings.Contains(string(cfg), `targets: ["`+n.metricsAddr()+`"]`) {
			t.Errorf("the config has no target for %s's metrics address %s:\n%s", n.name, n.metricsAddr(), cfg)
		}
	}
	if out, err := exec.Command(promtool, "check", "config", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config %s: %v\n%s", path, err, out)
	}

	// The printed command, with a web port of the test's own.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	web := l.Addr().String()
	l.Close()
	prom := exec.Command(prometheus, m[2], m[3], "--web.listen-address="+web)
	var promLog lockedBuffer
	prom.Stdout, prom.Stderr = &promLog, &promLog
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		prom.Process.Kill()
		prom.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", promLog.String())
		}
	}()
	// The first scrape of each target comes within one 15 s interval of
	// Prometheus' start.
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for {
		up, why := allTargetsUp(web, len(c.nodes))
		if up {
			break
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus did not scrape every node within 90 s: %s", last)
		}
		time.Sleep(250 * time.Millisecond)
	}
	var rules struct {
		Data struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name string `json:"name"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := getJSON("http://"+web+"/api/v1/rules", &rules); err != nil {
		t.Fatal(err)
	}
	loaded := 0
	for _, g := range rules.Data.Groups {
		loaded += len(g.Rules)
	}
	if loaded == 0 {
		t.Errorf("Prometheus loaded no alert rules from %s", filepath.Join("deploy", "prometheus"))
	}
	prom.Process.Kill()
	stop()
}

// allTargetsUp asks Prometheus whether it scrapes want targets, all up.
func allTargetsUp(web string, want int) (bool, string) {
	var targets struct {
		Data struct {
			ActiveTargets []struct {
				ScrapeURL string            `json:"scrapeUrl"`
				Health    string            `json:"health"`
				LastError string            `json:"lastError"`
				Labels    map[string]string `json:"labels"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := getJSON("http://"+web+"/api/v1/targets", &targets); err != nil {
		return false, err.Error()
	}
	if len(targets.Data.ActiveTargets) != want {
		return false, "targets: " + strings.Repeat("?", len(targets.Data.ActiveTargets))
	}
	for _, tg := range targets.Data.ActiveTargets {
		if tg.Health != "up" || tg.Labels["job"] != prometheusJob || tg.Labels["node"] == "" {
			return false, tg.ScrapeURL + " " + tg.Health + " " + tg.LastError
		}
	}
	return true, ""
}

func getJSON(url string, v any) error {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}
