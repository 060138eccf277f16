package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// deliveryFamilies are the daemon's per-peer delivery counters the summary
// shows with --metrics, in column order.
var deliveryFamilies = []struct{ name, column string }{
	{"nvpair_wlm_peer_deliveries_succeeded_total", "SUCCEEDED"},
	{"nvpair_wlm_peer_delivery_failures_total", "FAILURES"},
	{"nvpair_wlm_peer_delivery_retries_total", "RETRIES"},
	{"nvpair_wlm_peer_deliveries_dropped_total", "DROPPED"},
	{"nvpair_wlm_peer_behind_versions", "BEHIND"},
}

// Bounds of a scrape.
const (
	scrapeTimeout  = 3 * time.Second
	maxScrapeBytes = 4 << 20
)

// peerCounters are one daemon's delivery counters: peer principal ->
// family name -> value.
type peerCounters map[string]map[string]float64

// parsePeerCounters reads the Prometheus text exposition format and returns
// the samples of deliveryFamilies by their peer label. Comments and other
// families are skipped, but every sample line must be well formed:
// name{label="value",...} value [timestamp].
func parsePeerCounters(r io.Reader) (peerCounters, error) {
	wanted := make(map[string]bool, len(deliveryFamilies))
	for _, f := range deliveryFamilies {
		wanted[f.name] = true
	}
	out := peerCounters{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v: %q", lineNo, err, clip(line, 120))
		}
		peer, ok := labels["peer"]
		if !wanted[name] || !ok {
			continue
		}
		if out[peer] == nil {
			out[peer] = map[string]float64{}
		}
		if _, dup := out[peer][name]; dup {
			return nil, fmt.Errorf("line %d: a second %s sample for peer %q", lineNo, name, peer)
		}
		out[peer][name] = value
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// parseSample splits one sample line into its metric name, labels and value.
func parseSample(line string) (string, map[string]string, float64, error) {
	end := strings.IndexAny(line, "{ \t")
	if end <= 0 {
		return "", nil, 0, errors.New("no metric name and value")
	}
	name, rest := line[:end], strings.TrimLeft(line[end:], " \t")
	labels := map[string]string{}
	if strings.HasPrefix(rest, "{") {
		var err error
		if rest, err = parseLabels(rest[1:], labels); err != nil {
			return "", nil, 0, err
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 || len(fields) > 2 {
		return "", nil, 0, errors.New("want a value and an optional timestamp after the name")
	}
	value, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return "", nil, 0, fmt.Errorf("value %q: not a number", fields[0])
	}
	if len(fields) == 2 {
		if _, err := strconv.ParseInt(fields[1], 10, 64); err != nil {
			return "", nil, 0, fmt.Errorf("timestamp %q: not an integer", fields[1])
		}
	}
	return name, labels, value, nil
}

// parseLabels reads label="value" pairs up to the closing brace into
// labels and returns what follows the brace. Values may hold \\, \" and \n.
func parseLabels(s string, labels map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, " \t")
		if strings.HasPrefix(s, "}") {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return "", errors.New("a label without =")
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t")
		if !strings.HasPrefix(s, `"`) {
			return "", fmt.Errorf("label %s: value not quoted", key)
		}
		var v strings.Builder
		i, closed := 1, false
		for i < len(s) && !closed {
			switch c := s[i]; {
			case c == '"':
				closed = true
			case c == '\\' && i+1 < len(s):
				i++
				switch s[i] {
				case '\\', '"':
					v.WriteByte(s[i])
				case 'n':
					v.WriteByte('\n')
				default:
					return "", fmt.Errorf(`label %s: unknown escape \%c`, key, s[i])
				}
			default:
				v.WriteByte(c)
			}
			i++
		}
		if !closed {
			return "", fmt.Errorf("label %s: value not closed", key)
		}
		if _, dup := labels[key]; dup {
			return "", fmt.Errorf("label %s twice", key)
		}
		labels[key] = v.String()
		s = strings.TrimLeft(s[i:], " \t")
		switch {
		case strings.HasPrefix(s, ","):
			s = s[1:]
		case strings.HasPrefix(s, "}"):
		default:
			return "", errors.New("labels not closed by }")
		}
	}
}

// scrapePeerCounters GETs http://addr/metrics and parses its delivery
// counters.
func scrapePeerCounters(client *http.Client, addr string) (peerCounters, error) {
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return parsePeerCounters(io.LimitReader(resp.Body, maxScrapeBytes))
}

// nodeDeliveries is one node's scrape at the end of a run.
type nodeDeliveries struct {
	node  string // node1, ...
	short string // n1, ...
	addr  string // its --metrics address
	peers peerCounters
	err   error
}

// scrapeDeliveries scrapes every node's metrics endpoint at once.
func scrapeDeliveries(c *cluster) []nodeDeliveries {
	client := &http.Client{Timeout: scrapeTimeout}
	defer client.CloseIdleConnections()
	out := make([]nodeDeliveries, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		out[i] = nodeDeliveries{node: n.name, short: n.short, addr: n.metricsAddr()}
		wg.Go(func() {
			if out[i].addr == "" {
				out[i].err = errors.New("no metrics endpoint")
				return
			}
			out[i].peers, out[i].err = scrapePeerCounters(client, out[i].addr)
		})
	}
	wg.Wait()
	return out
}

// deliveryReport prints, per node, a row for each of its peers with the
// delivery counters. Every other member gets a row, "-" where the daemon
// has no series for it (it never was a target); a peer that is no member
// shows its principal's first 8 characters.
func deliveryReport(w io.Writer, views []nodeView, deliveries []nodeDeliveries) {
	names := shortNames(views)
	fmt.Fprintln(w, "peer deliveries (each daemon's /metrics at the end of the run, counted since its last start):")
	for _, d := range deliveries {
		fmt.Fprintf(w, "%s (%s) http://%s/metrics\n", d.node, d.short, d.addr)
		if d.err != nil {
			fmt.Fprintf(w, "  scrape failed: %v\n", d.err)
			continue
		}
		var principals []string
		for _, v := range views {
			if v.short != d.short {
				principals = append(principals, v.id)
			}
		}
		var strangers []string
		for p := range d.peers {
			if _, member := names[p]; !member {
				strangers = append(strangers, p)
			}
		}
		slices.Sort(strangers)
		principals = append(principals, strangers...)
		if len(principals) == 0 {
			fmt.Fprintln(w, "  (no peers)")
			continue
		}
		rows := [][]string{{"PEER"}}
		for _, f := range deliveryFamilies {
			rows[0] = append(rows[0], f.column)
		}
		for _, p := range principals {
			row := []string{shortOrigin(names, p)}
			for _, f := range deliveryFamilies {
				cell := "-"
				if v, ok := d.peers[p][f.name]; ok {
					cell = strconv.FormatFloat(v, 'f', -1, 64)
				}
				row = append(row, cell)
			}
			rows = append(rows, row)
		}
		widths := make([]int, len(rows[0]))
		for _, r := range rows {
			for i, cell := range r {
				widths[i] = max(widths[i], utf8.RuneCountInString(cell))
			}
		}
		for _, r := range rows {
			var b strings.Builder
			for i, cell := range r {
				b.WriteString("  ")
				if i == 0 {
					b.WriteString(pad(cell, widths[i])) // the peer, left-aligned; the counts right-aligned
				} else {
					b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell)) + cell)
				}
			}
			fmt.Fprintln(w, b.String())
		}
	}
}

// prometheusJob is the scrape job's name in the config --metrics writes:
// the one deploy/prometheus/nvpair-wlm-rules.yml's NvpairWlmDown watches
// and the README's scrape configuration uses.
const prometheusJob = "nvpair-workload-manager"

// rulesFileInModule is the alert rules file, relative to the module root.
var rulesFileInModule = filepath.Join("deploy", "prometheus", "nvpair-wlm-rules.yml")

// writePrometheusConfig writes prometheus.yml into dir for this run: one
// scrape job over every node's metrics address (labelled with the node's
// name), at the 15 s interval the README's queries assume, loading the
// module's alert rules when the source tree is at hand. The daemons keep
// their metrics ports across restarts, so the file holds for the whole
// run. It returns the line to print: the file and the command that
// watches the cluster with it.
func writePrometheusConfig(dir string, nodes []*node) (string, error) {
	var b strings.Builder
	b.WriteString("# Written by devcluster --metrics for this run's daemons; their metrics\n")
	b.WriteString("# ports are picked at random and kept across restarts.\n")
	b.WriteString("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n")
	if root, err := moduleRoot(); err == nil {
		if rules := filepath.Join(root, rulesFileInModule); fileExists(rules) {
			fmt.Fprintf(&b, "rule_files:\n  - %s\n", yamlString(rules))
		}
	}
	fmt.Fprintf(&b, "scrape_configs:\n  - job_name: %s\n    static_configs:\n", prometheusJob)
	for _, n := range nodes {
		addr := n.metricsAddr()
		if addr == "" {
			return "", fmt.Errorf("%s has no metrics address", n.name)
		}
		fmt.Fprintf(&b, "      - targets: [%s]\n        labels:\n          node: %s\n", yamlString(addr), yamlString(n.name))
	}
	path := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return "", fmt.Errorf("write the Prometheus config: %w", err)
	}
	return fmt.Sprintf("devcluster: Prometheus config %s; watch the cluster with: prometheus --config.file=%s --storage.tsdb.path=%s",
		path, shellWord(path), shellWord(filepath.Join(dir, "prometheus"))), nil
}

// yamlString quotes s for YAML: a JSON string is a YAML double-quoted one.
func yamlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// shellWord quotes s for a POSIX shell when it needs it, so the printed
// command can be pasted as it is.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-:") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
