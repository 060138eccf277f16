package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

// The state table's bounds have one check each (bounds.go), which the
// flags and a Config alike go through: NewManager refuses a bound outside
// its range, naming its flag, as the flag parse does, and gives a zero one
// its default.
func TestNewManagerRefusesATableBoundOutsideItsRangeNamingItsFlag(t *testing.T) {
	for _, c := range []struct {
		flag string
		set  func(*Config)
	}{
		{"--max-live-workloads", func(c *Config) { c.MaxLiveWorkloads = maxMaxLiveWorkloads + 1 }},
		{"--max-live-workloads", func(c *Config) { c.MaxLiveWorkloads = -1 }},
		{"--max-live-workload-bytes", func(c *Config) { c.MaxLiveWorkloadBytes = minMaxLiveWorkloadBytes - 1 }},
		{"--max-ended-bytes", func(c *Config) { c.MaxEndedBytes = minMaxEndedBytes - 1 }},
		{"--max-ended-bytes", func(c *Config) { c.MaxEndedBytes = maxMaxEndedBytes + 1 }},
	} {
		cfg := Config{NodeID: "n", In: strings.NewReader(""), Out: io.Discard}
		c.set(&cfg)
		if _, err := NewManager(cfg); err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("NewManager with %s out of range: %v, want a refusal naming %s", c.flag, err, c.flag)
		}
		flagged := applyTableBounds(&cfg)
		if flagged == nil {
			continue // reported above
		}
		if _, err := parseFlags([]string{c.flag, strings.Fields(flagged.Error())[1]}); err == nil {
			t.Errorf("the flag %s took the value NewManager refused (%v)", c.flag, flagged)
		}
	}
	cfg := Config{ResyncInterval: 30 * time.Second}
	if err := applyTableBounds(&cfg); err != nil {
		t.Fatal(err)
	}
	tc := tableConfig(&cfg, time.Now)
	if cfg.MaxLiveWorkloads != defaultMaxLiveWorkloads || cfg.MaxLiveWorkloadBytes != defaultMaxLiveWorkloadBytes ||
		cfg.MaxEndedBytes != defaultMaxEndedBytes || cfg.MemberClaim != defaultMemberClaim || tc.Retention != time.Minute {
		t.Fatalf("the zero bounds took %+v, retention %s; want the defaults and two re-sync intervals", cfg, tc.Retention)
	}
}
