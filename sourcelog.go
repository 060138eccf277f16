package main

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"
)

// sourceLogInterval is how often one client address may cause a log line
// of one kind: the first is written at once, then at most one per interval,
// carrying the count of those not written in between.
const sourceLogInterval = 10 * time.Second

// sourceLogMaxSources bounds the addresses a sourceLog keeps apart. Past it
// the addresses not heard from within an interval are forgotten, and when
// all are recent, new addresses share one entry: a flood from many
// addresses costs a fixed amount of memory and still one line per
// interval.
const sourceLogMaxSources = 1024

// sourceLog rate-limits the log lines a client can cause by repeating a
// request (a refused handshake, a malformed frame, a foreign Origin), per
// source address and kind of answer (its status), so that no client can
// flood the log, a misbehaving one does not hide the others, and a client
// that makes a new kind of mistake is still told about it at once.
type sourceLog struct {
	mu       sync.Mutex // guards bySource; a leaf lock
	bySource map[sourceLogKey]*sourceLogEntry
}

type sourceLogKey struct {
	source string
	status int
}

type sourceLogEntry struct {
	last       time.Time // when a line for this source was last written
	suppressed int       // lines not written since
}

func newSourceLog() *sourceLog { return &sourceLog{bySource: map[sourceLogKey]*sourceLogEntry{}} }

// log writes msg for an answer with status to remote (an address with its
// port, as http.Request's RemoteAddr) at level, unless this source had a
// line for that status within sourceLogInterval; a line written after some
// were held back says how many, as "suppressed". A line held back is still
// written at debug when the log is at debug: an operator who asked for
// every detail sees every answer.
func (l *sourceLog) log(log *slog.Logger, level slog.Level, remote string, status int, msg string, args ...any) {
	ctx := context.Background()
	if !log.Enabled(ctx, level) {
		return
	}
	n, write := l.admit(sourceLogKey{hostOf(remote), status}, time.Now())
	if !write {
		if log.Enabled(ctx, slog.LevelDebug) {
			log.Log(ctx, slog.LevelDebug, msg, args...)
		}
		return
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Log(context.Background(), level, msg, args...)
}

// admit decides whether a line for source may be written at now, and how
// many were held back before it.
func (l *sourceLog) admit(key sourceLogKey, now time.Time) (suppressed int, write bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.bySource[key]
	if e == nil {
		if len(l.bySource) >= sourceLogMaxSources {
			l.forgetQuiet(now)
		}
		if len(l.bySource) >= sourceLogMaxSources {
			key.source = "" // all recent: new sources share one entry per status
			e = l.bySource[key]
		}
		if e == nil {
			e = &sourceLogEntry{}
			l.bySource[key] = e
		}
	}
	if !e.last.IsZero() && now.Sub(e.last) < sourceLogInterval {
		e.suppressed++
		return 0, false
	}
	n := e.suppressed
	e.last, e.suppressed = now, 0
	return n, true
}

// forgetQuiet drops the sources without a line within the interval and
// none held back. It walks at most sourceLogMaxSources entries, and only
// when the map is full. Called with mu held.
func (l *sourceLog) forgetQuiet(now time.Time) {
	for k, e := range l.bySource {
		if e.suppressed == 0 && now.Sub(e.last) >= sourceLogInterval {
			delete(l.bySource, k)
		}
	}
}

// hostOf is the address part of a host:port, or the whole when it has no
// port.
func hostOf(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	return host
}
