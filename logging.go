package main

import (
	"fmt"
	"log/slog"
	"strings"
)

// parseLogLevel accepts exactly the levels spec.md 3.1 names (log/set-level).
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

// levelName is a level's name as spec.md 3.1 spells it.
func levelName(l slog.Level) string { return strings.ToLower(l.String()) }

// logLevelEnv is the environment variable every PAIR service falls back on
// when it is started without --log-level.
const logLevelEnv = "NVPAIR_LOG_LEVEL"

// resolveLogLevel applies PAIR's convention: the flag when given, else
// NVPAIR_LOG_LEVEL, else info. A bad flag value is an error (the operator
// typed it on this command line); a bad environment value is only a warning
// and info, since one mistyped variable in a user's shell must not stop the
// daemon of every PAIR node started from it.
func resolveLogLevel(flagValue string, flagGiven bool, envValue string) (lvl slog.Level, warning string, err error) {
	if flagGiven {
		lvl, err = parseLogLevel(flagValue)
		return lvl, "", err
	}
	if envValue == "" {
		return slog.LevelInfo, "", nil
	}
	if lvl, err = parseLogLevel(envValue); err != nil {
		return slog.LevelInfo, fmt.Sprintf("%s: %v; using info", logLevelEnv, err), nil
	}
	return lvl, "", nil
}
