package main

import (
	"log/slog"
	"testing"
)

func TestParseLogLevelAcceptsTheFourLevelsInAnyCase(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want slog.Level
	}{
		{"error", slog.LevelError}, {"ERROR", slog.LevelError}, {"Error", slog.LevelError},
		{"warn", slog.LevelWarn}, {"WARN", slog.LevelWarn}, {"wArN", slog.LevelWarn},
		{"info", slog.LevelInfo}, {"INFO", slog.LevelInfo}, {"Info", slog.LevelInfo},
		{"debug", slog.LevelDebug}, {"DEBUG", slog.LevelDebug}, {"deBug", slog.LevelDebug},
	} {
		got, err := parseLogLevel(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseLogLevel(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseLogLevelRefusesOtherNames(t *testing.T) {
	// slog.Level.UnmarshalText would take "info+2" or "DEBUG-4" as
	// offsets from a level; spec.md 3.1 names exactly four levels.
	for _, in := range []string{"", "verbose", "info+2", "debug-4", "warning", "trace", "fatal", " info", "info ", "INFO\n", "0", "-4", "DEBUG+0"} {
		if lvl, err := parseLogLevel(in); err == nil {
			t.Errorf("parseLogLevel(%q) = %v, want an error", in, lvl)
		}
	}
}

func TestLevelNameIsTheContractsName(t *testing.T) {
	for _, name := range []string{"error", "warn", "info", "debug"} {
		lvl, err := parseLogLevel(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := levelName(lvl); got != name {
			t.Errorf("levelName(parseLogLevel(%q)) = %q", name, got)
		}
	}
}
