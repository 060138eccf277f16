package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

const (
	famOK      = "nvpair_wlm_peer_deliveries_succeeded_total"
	famFail    = "nvpair_wlm_peer_delivery_failures_total"
	famRetry   = "nvpair_wlm_peer_delivery_retries_total"
	famDropped = "nvpair_wlm_peer_deliveries_dropped_total"
	famQueue   = "nvpair_wlm_peer_behind_versions"
)

func TestParsePeerCountersReadsTheDeliveryFamiliesByPeer(t *testing.T) {
	text := `# HELP nvpair_wlm_peer_deliveries_succeeded_total Frames delivered to a peer.
# TYPE nvpair_wlm_peer_deliveries_succeeded_total counter
nvpair_wlm_peer_deliveries_succeeded_total{peer="aaaa"} 12
nvpair_wlm_peer_deliveries_succeeded_total{peer="b\"q\\s\nl"} 3
nvpair_wlm_peer_delivery_failures_total{peer="aaaa"} 2
  nvpair_wlm_peer_delivery_retries_total { peer = "aaaa" , } 1 1700000000000
nvpair_wlm_peer_deliveries_dropped_total{zone="x",peer="aaaa"} 0
nvpair_wlm_peer_behind_versions{peer="aaaa"} 1e+06

# other families, and the same names without a peer label, are not delivery counters
nvpair_wlm_peer_delivery_latency_seconds_bucket{peer="aaaa",le="+Inf"} 12
nvpair_wlm_peer_delivery_latency_seconds_count{peer="aaaa"} 12
nvpair_wlm_peer_deliveries_succeeded_total 99
nvpair_wlm_peer_deliveries_succeeded_totally{peer="aaaa"} 98
nvpair_wlm_resync_set_size NaN
go_goroutines 17
`
	got, err := parsePeerCounters(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := peerCounters{
		"aaaa":       {famOK: 12, famFail: 2, famRetry: 1, famDropped: 0, famQueue: 1e6},
		"b\"q\\s\nl": {famOK: 3},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parsed\n%#v\nwant\n%#v", got, want)
	}
}

func TestParsePeerCountersRefusesMalformedLines(t *testing.T) {
	for _, tc := range []struct{ name, line string }{
		{"no value", famOK + `{peer="a"}`},
		{"value not a number", famOK + `{peer="a"} many`},
		{"three fields", famOK + `{peer="a"} 1 2 3`},
		{"timestamp not an integer", famOK + `{peer="a"} 1 soon`},
		{"labels not closed", famOK + `{peer="a" 1`},
		{"label value not quoted", famOK + `{peer=a} 1`},
		{"label value not closed", famOK + `{peer="a} 1`},
		{"label without =", famOK + `{peer} 1`},
		{"unknown escape", famOK + `{peer="a\q"} 1`},
		{"label twice", famOK + `{peer="a",peer="b"} 1`},
		{"no name", `{peer="a"} 1`},
		{"name alone", famOK},
		{"malformed line of another family", `go_goroutines{x="1"`},
		{"second sample of a series", famOK + `{peer="a"} 1` + "\n" + famOK + `{peer="a"} 2`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := parsePeerCounters(strings.NewReader(tc.line + "\n")); err == nil {
				t.Errorf("parsePeerCounters(%q) = %v, want an error", tc.line, got)
			}
		})
	}
}

func TestScrapePeerCountersReadsMetricsAndRefusesAnErrorStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" || r.Method != http.MethodGet {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		if r.Header.Get("Origin") != "" {
			http.Error(w, "origin refused", http.StatusForbidden)
			return
		}
		fmt.Fprintf(w, "%s{peer=\"p1\"} 7\n", famOK)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	got, err := scrapePeerCounters(srv.Client(), addr)
	if err != nil || got["p1"][famOK] != 7 {
		t.Errorf("scrape = %v, %v; want p1 succeeded 7", got, err)
	}

	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Host not allowed", http.StatusMisdirectedRequest)
	}))
	defer refusing.Close()
	_, err = scrapePeerCounters(refusing.Client(), strings.TrimPrefix(refusing.URL, "http://"))
	if err == nil || !strings.Contains(err.Error(), "421") || !strings.Contains(err.Error(), "Host not allowed") {
		t.Errorf("scrape of a 421 answer: %v, want an error with the status and the reason", err)
	}
}

func TestDeliveryReportShowsARowPerMemberAndStrangers(t *testing.T) {
	views := []nodeView{
		{name: "node1", short: "n1", id: "id-1"},
		{name: "node2", short: "n2", id: "id-2"},
		{name: "node3", short: "n3", id: "id-3"},
	}
	deliveries := []nodeDeliveries{
		{node: "node1", short: "n1", addr: "127.0.0.1:1001", peers: peerCounters{
			"id-2":                 {famOK: 40, famFail: 3, famRetry: 2, famDropped: 1, famQueue: 0},
			"0123456789abcdef-old": {famOK: 5},
		}},
		{node: "node2", short: "n2", addr: "127.0.0.1:1002", err: fmt.Errorf("connection refused")},
		{node: "node3", short: "n3", addr: "127.0.0.1:1003", peers: peerCounters{}},
	}
	var b strings.Builder
	deliveryReport(&b, views, deliveries)
	got := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	want := []string{
		"peer deliveries (each daemon's /metrics at the end of the run, counted since its last start):",
		"node1 (n1) http://127.0.0.1:1001/metrics",
		"  PEER      SUCCEEDED  FAILURES  RETRIES  DROPPED  BEHIND",
		"  n2               40         3        2        1       0",
		"  n3                -         -        -        -       -",
		"  01234567          5         -        -        -       -",
		"node2 (n2) http://127.0.0.1:1002/metrics",
		"  scrape failed: connection refused",
		"node3 (n3) http://127.0.0.1:1003/metrics",
		"  PEER  SUCCEEDED  FAILURES  RETRIES  DROPPED  BEHIND",
		"  n1            -         -        -        -       -",
		"  n2            -         -        -        -       -",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("report:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	b.Reset()
	deliveryReport(&b, views[:1], []nodeDeliveries{{node: "node1", short: "n1", addr: "127.0.0.1:1001", peers: peerCounters{}}})
	if !strings.Contains(b.String(), "node1 (n1) http://127.0.0.1:1001/metrics\n  (no peers)\n") {
		t.Errorf("a one-node cluster's report:\n%s", b.String())
	}
}
