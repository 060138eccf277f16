package testkit

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// ScrapeAddr reads the metrics endpoint at addr (host:port) into series ->
// value, checking that it answers 200 in the Prometheus text format.
func ScrapeAddr(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("scrape: status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return ParseMetricsText(t, resp.Body)
}

// ParseMetricsText reads a Prometheus text exposition into series -> value.
func ParseMetricsText(t testing.TB, r io.Reader) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// ScrapeValue reads one series from the metrics endpoint at addr; a series
// the endpoint does not have fails the test.
func ScrapeValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	v, ok := ScrapeAddr(t, addr)[series]
	if !ok {
		t.Fatalf("no series %s at %s", series, addr)
	}
	return v
}
