package main

import (
	"context"
	"log/slog"
)

// requestLog is a request's logger, built only when a line is written.
// slog's With formats its attributes the moment it is called, so a logger
// built per request costs allocations and formatting on every frame, even
// at the info level where an accepted frame writes nothing (issue 14). A
// requestLog holds the attributes as strings and builds the logger on the
// first line, once.
type requestLog struct {
	base *slog.Logger
	// The request's attributes: the channel and the client's address, then
	// up to two more pairs (the peer's principal; the ingress's method and
	// path, clipped by the caller).
	channel, remote string
	extra           [4]string
	n               int // strings of extra in use
	built           *slog.Logger
}

// newRequestLog returns the log of a request from remote on channel.
func newRequestLog(base *slog.Logger, channel, remote string) requestLog {
	return requestLog{base: base, channel: channel, remote: remote}
}

// with adds an attribute to every line of the request from here on.
func (l *requestLog) with(key, value string) {
	if l.n+2 > len(l.extra) {
		panic("requestLog: more attributes than it holds")
	}
	l.extra[l.n], l.extra[l.n+1] = key, value
	l.n += 2
	l.built = nil
}

// logger returns the request's logger, building it on first use.
func (l *requestLog) logger() *slog.Logger {
	if l.built == nil {
		args := []any{"channel", l.channel, "remote", l.remote}
		for i := 0; i < l.n; i += 2 {
			args = append(args, l.extra[i], l.extra[i+1])
		}
		l.built = l.base.With(args...)
	}
	return l.built
}

// enabled reports whether a line at level would be written.
func (l *requestLog) enabled(level slog.Level) bool {
	return l.base.Enabled(context.Background(), level)
}
