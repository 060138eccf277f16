package httpguard

import (
	"context"
	"log/slog"
)

// RequestLog is a request's logger, built only when a line is written.
// slog's With formats its attributes the moment it is called, so a logger
// built per request costs allocations and formatting on every frame, even
// at the info level where an accepted frame writes nothing (issue 14). A
// RequestLog holds the attributes as strings and builds the logger on the
// first line, once.
type RequestLog struct {
	base *slog.Logger
	// The request's attributes: the channel and the client's address, then
	// up to two more pairs (the peer's principal; the ingress's method and
	// path, clipped by the caller).
	channel, remote string
	extra           [4]string
	n               int // strings of extra in use
	built           *slog.Logger
}

// NewRequestLog returns the log of a request from remote on channel.
func NewRequestLog(base *slog.Logger, channel, remote string) RequestLog {
	return RequestLog{base: base, channel: channel, remote: remote}
}

// With adds an attribute to every line of the request from here on.
func (l *RequestLog) With(key, value string) {
	if l.n+2 > len(l.extra) {
		panic("RequestLog: more attributes than it holds")
	}
	l.extra[l.n], l.extra[l.n+1] = key, value
	l.n += 2
	l.built = nil
}

// Logger returns the request's logger, building it on first use.
func (l *RequestLog) Logger() *slog.Logger {
	if l.built == nil {
		args := []any{"channel", l.channel, "remote", l.remote}
		for i := 0; i < l.n; i += 2 {
			args = append(args, l.extra[i], l.extra[i+1])
		}
		l.built = l.base.With(args...)
	}
	return l.built
}

// Enabled reports whether a line at level would be written.
func (l *RequestLog) Enabled(level slog.Level) bool {
	return l.base.Enabled(context.Background(), level)
}
