package brokerio

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/promtext"
)

// The broker is the daemon's parent and trusted to speak the protocol, but
// a broker that goes wrong (a bug, a replay of a corrupt journal, a test
// harness) can send any number of bad lines, each up to the 1 MiB frame
// limit. A warning per line, each quoting what the line held, would be
// 44,000 warnings for 44,000 lines and a log line of up to a megabyte for
// one. So the warnings a broker line can cause go through a limiter like
// the listeners' (internal/httpguard/sourcelog.go), keyed on the kind of fault instead of a
// client's address, and every value from the line that reaches a log line
// is clipped (httpguard.ClipLogged).

// LineKind is a kind of fault in a line from the broker: the key of
// its warnings' limiter and the label of its counter.
type LineKind int

const (
	LineTooLong      LineKind = iota // over wireframe.MaxBytes
	LineNotUTF8                      // not valid UTF-8
	LineNotJSON                      // not a JSON value
	LineBadVersion                   // jsonrpc is not "2.0"
	LineMalformed                    // a workload frame the daemon cannot relay
	LineRefused                      // a notification with bad params (log/set-level)
	LineBadDiscovery                 // a discovery:nodes snapshot that does not decode
	LineUnanswered                   // a request whose answer could not be written
	LineKinds                        // how many kinds there are
)

// lineKindNames are the kinds' label values, in their order.
var lineKindNames = [LineKinds]string{
	"too_long", "not_utf8", "not_json", "bad_jsonrpc", "malformed", "refused", "bad_discovery", "unanswered",
}

// lineMsgs are the kinds' log messages, the same for a line and for
// the summary of the lines held back after it.
var lineMsgs = [LineKinds]string{
	"local frame skipped", "local frame skipped", "local frame skipped", "local frame skipped",
	"local frame dropped", "notification refused", "discovery snapshot dropped", "answer to broker failed",
}

// LineLog rate-limits the warnings bad broker lines cause: per kind,
// the first is written at once, then at most one line per interval
// (httpguard.SourceLogInterval, 10 s), which carries suppressed=N, the lines held
// back since the last. When a burst ends, the count of what it held back
// is written on a line of its own at the end of the interval, and at the
// latest when the daemon stops, so a burst of 44,000 lines is two lines
// that account for all of them, not one line that says nothing of the
// rest. At debug level every line is still written (at debug).
type LineLog struct {
	limiter *httpguard.SourceLog // keyed on the kind, under the source "broker"
	counts  [LineKinds]atomic.Uint64

	mu      sync.Mutex // guards armed and stopped; a leaf lock, never held while the limiter's is taken or a line is written
	armed   [LineKinds]bool
	stopped bool
}

func NewLineLog() *LineLog { return &LineLog{limiter: httpguard.NewSourceLog()} }

func lineKey(kind LineKind) httpguard.SourceLogKey {
	return httpguard.SourceLogKey{Source: "broker", Status: int(kind)}
}

// warn counts a bad line of kind and logs it at warn unless a line of its
// kind was written within the interval; args are the line's details, each
// value from the line clipped by the caller (httpguard.ClipLogged).
func (b *LineLog) Warn(log *slog.Logger, kind LineKind, args ...any) {
	b.counts[kind].Add(1)
	if until := b.limiter.LogKey(log, slog.LevelWarn, lineKey(kind), lineMsgs[kind], args...); !until.IsZero() {
		b.arm(log, kind, until)
	}
}

// arm makes sure the count of kind's held-back lines is written at until,
// the end of its interval, when no later line has written it by then.
func (b *LineLog) arm(log *slog.Logger, kind LineKind, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped || b.armed[kind] {
		return
	}
	b.armed[kind] = true
	time.AfterFunc(time.Until(until), func() { b.flush(log, kind) })
}

// flush writes the count of kind's lines held back, once its interval has
// passed.
func (b *LineLog) flush(log *slog.Logger, kind LineKind) {
	b.mu.Lock()
	b.armed[kind] = false
	stopped := b.stopped
	b.mu.Unlock()
	if stopped {
		return
	}
	n, until := b.limiter.TakeHeld(lineKey(kind), time.Now(), false)
	switch {
	case n > 0:
		log.Warn(lineMsgs[kind], "kind", lineKindNames[kind], "suppressed", n)
	case !until.IsZero():
		b.arm(log, kind, until)
	}
}

// stop writes the counts still held back, at once: the daemon is
// stopping, and a count not written now would never be. Lines after it
// are limited as before, but their counts are not written.
func (b *LineLog) Stop(log *slog.Logger) {
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	for kind := range LineKinds {
		if n, _ := b.limiter.TakeHeld(lineKey(kind), time.Now(), true); n > 0 {
			log.Warn(lineMsgs[kind], "kind", lineKindNames[kind], "suppressed", n)
		}
	}
}

// writeMetrics renders the bad lines' counters, every kind from the start.
func (b *LineLog) WriteMetrics(t *promtext.Text) {
	const name = "nvpair_wlm_broker_bad_lines_total"
	t.Family(name, "counter", "Lines from the broker the daemon could not act on as sent (skipped, dropped, refused, or a request left unanswered), by kind; each kind is logged at warn at most once per 10 s.")
	for kind := range LineKinds {
		t.Sample(name, []string{"kind"}, []string{lineKindNames[kind]}, float64(b.counts[kind].Load()))
	}
}

// SetInterval sets the shortest time between two warnings of one kind, for
// tests that cannot wait the default.
func (b *LineLog) SetInterval(d time.Duration) { b.limiter.Interval = d }

// Count is how many lines of kind were seen.
func (b *LineLog) Count(kind LineKind) uint64 { return b.counts[kind].Load() }

// String is the kind's label value.
func (k LineKind) String() string { return lineKindNames[k] }
