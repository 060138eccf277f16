package httpguard

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"
)

// SourceLogInterval is how often one client address may cause a log line
// of one kind: the first is written at once, then at most one per interval,
// carrying the count of those not written in between.
const SourceLogInterval = 10 * time.Second

// sourceLogMaxSources bounds the addresses a SourceLog keeps apart. Past it
// the addresses not heard from within an interval are forgotten, and when
// all are recent, new addresses share one entry: a flood from many
// addresses costs a fixed amount of memory and still one line per
// interval.
const sourceLogMaxSources = 1024

// SourceLog rate-limits the log lines a client can cause by repeating a
// request (a refused handshake, a malformed frame, a foreign Origin), per
// source address and kind of answer (its status), so that no client can
// flood the log, a misbehaving one does not hide the others, and a client
// that makes a new kind of mistake is still told about it at once.
type SourceLog struct {
	mu       sync.Mutex // guards bySource; a leaf lock
	bySource map[SourceLogKey]*sourceLogEntry
	// Interval is SourceLogInterval; a test may change it before the first
	// line is logged.
	Interval time.Duration
}

// SourceLogKey is what SourceLog keeps apart: a source (an address, or a
// name the caller chose) and a kind of answer (an HTTP status, or a kind
// the caller numbers).
type SourceLogKey struct {
	Source string
	Status int
}

type sourceLogEntry struct {
	last       time.Time // when a line for this source was last written
	suppressed int       // lines not written since
}

// NewSourceLog returns an empty SourceLog with the default interval.
func NewSourceLog() *SourceLog {
	return &SourceLog{bySource: map[SourceLogKey]*sourceLogEntry{}, Interval: SourceLogInterval}
}

// Log writes msg for an answer with status to remote (an address with its
// port, as http.Request's RemoteAddr) at level, unless this source had a
// line for that status within SourceLogInterval; a line written after some
// were held back says how many, as "suppressed". A line held back is still
// written at debug when the log is at debug: an operator who asked for
// every detail sees every answer.
func (l *SourceLog) Log(log *slog.Logger, level slog.Level, remote string, status int, msg string, args ...any) {
	l.LogKey(log, level, SourceLogKey{hostOf(remote), status}, msg, args...)
}

// LogKey is Log for a key the caller chose (brokerio.LineLog keys the
// broker's bad lines on their kind). It returns when the lines held back
// for key may next be written: the end of the key's interval for a line it
// held back, zero for a line it wrote or a level that is off.
func (l *SourceLog) LogKey(log *slog.Logger, level slog.Level, key SourceLogKey, msg string, args ...any) (heldUntil time.Time) {
	ctx := context.Background()
	if !log.Enabled(ctx, level) {
		return time.Time{}
	}
	n, write, until := l.admitUntil(key, time.Now())
	if !write {
		if log.Enabled(ctx, slog.LevelDebug) {
			log.Log(ctx, slog.LevelDebug, msg, args...)
		}
		return until
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Log(context.Background(), level, msg, args...)
	return time.Time{}
}

// admit decides whether a line for source may be written at now, and how
// many were held back before it.
func (l *SourceLog) admit(key SourceLogKey, now time.Time) (suppressed int, write bool) {
	suppressed, write, _ = l.admitUntil(key, now)
	return suppressed, write
}

// admitUntil is admit that also returns, for a line held back, when the
// key's interval ends.
func (l *SourceLog) admitUntil(key SourceLogKey, now time.Time) (suppressed int, write bool, heldUntil time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.bySource[key]
	if e == nil {
		if len(l.bySource) >= sourceLogMaxSources {
			l.forgetQuiet(now)
		}
		if len(l.bySource) >= sourceLogMaxSources {
			key.Source = "" // all recent: new sources share one entry per status
			e = l.bySource[key]
		}
		if e == nil {
			e = &sourceLogEntry{}
			l.bySource[key] = e
		}
	}
	if !e.last.IsZero() && now.Sub(e.last) < l.Interval {
		e.suppressed++
		return 0, false, e.last.Add(l.Interval)
	}
	n := e.suppressed
	e.last, e.suppressed = now, 0
	return n, true, time.Time{}
}

// TakeHeld returns the count of lines held back for key and starts a new
// interval, as a written line does, for a caller that writes that count on
// its own line when a burst has ended. Before the key's interval has
// passed it takes nothing and returns when it will have, unless force (the
// daemon is stopping: the count is written now or never).
func (l *SourceLog) TakeHeld(key SourceLogKey, now time.Time, force bool) (n int, heldUntil time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.bySource[key]
	if e == nil || e.suppressed == 0 {
		return 0, time.Time{}
	}
	if !force && now.Sub(e.last) < l.Interval {
		return 0, e.last.Add(l.Interval)
	}
	n = e.suppressed
	e.last, e.suppressed = now, 0
	return n, time.Time{}
}

// forgetQuiet drops the sources without a line within the interval and
// none held back. It walks at most sourceLogMaxSources entries, and only
// when the map is full. Called with mu held.
func (l *SourceLog) forgetQuiet(now time.Time) {
	for k, e := range l.bySource {
		if e.suppressed == 0 && now.Sub(e.last) >= l.Interval {
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
