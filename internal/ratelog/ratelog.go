// Package ratelog owns the daemon's rate-limited warnings: an event a
// client or a peer can repeat thousands of times a second is logged once,
// then at most once per Interval with the count since the last line, so
// no input can flood the log.
//
// It imports only the standard library, and must never import another
// package of this module: every part of the daemon uses it.
package ratelog

import (
	"log/slog"
	"sync"
	"time"
)

// Interval is the shortest time between two lines of one Burst. Ten
// seconds keeps a storm to six lines a minute while an operator tailing the
// log still sees it within one screen refresh.
const Interval = 10 * time.Second

// Burst logs the first event and then at most one summary per Interval.
// The zero value is ready to use.
type Burst struct {
	mu      sync.Mutex // guards last and pending; a leaf lock
	last    time.Time
	pending int
}

// Note logs a drop: the count goes under the key "dropped".
func (b *Burst) Note(log *slog.Logger, msg string, args ...any) {
	b.NoteCounted(log, "dropped", msg, args...)
}

// NoteCounted is Note with the count logged under countKey, for events
// that are not drops.
func (b *Burst) NoteCounted(log *slog.Logger, countKey, msg string, args ...any) {
	b.mu.Lock()
	b.pending++
	if time.Since(b.last) < Interval {
		b.mu.Unlock()
		return
	}
	n := b.pending
	b.pending, b.last = 0, time.Now()
	b.mu.Unlock()
	log.Warn(msg, append(args, countKey, n)...)
}
