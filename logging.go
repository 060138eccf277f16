package main

import (
	"fmt"
	"log/slog"
	"strings"
)

// parseLogLevel accepts exactly the levels the contract names.
func parseLogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "error":
		return slog.LevelError, nil
	case "warn":
		return slog.LevelWarn, nil
	case "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	}
	return 0, fmt.Errorf("log level %q: must be error, warn, info or debug", s)
}

// levelName is the contract's name for a level.
func levelName(l slog.Level) string { return strings.ToLower(l.String()) }
