package main

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
// the listeners' (sourcelog.go), keyed on the kind of fault instead of a
// client's address, and every value from the line that reaches a log line
// is clipped (httpguard.ClipLogged).

// brokerLineKind is a kind of fault in a line from the broker: the key of
// its warnings' limiter and the label of its counter.
type brokerLineKind int

const (
	brokerLineTooLong      brokerLineKind = iota // over maxFrameBytes
	brokerLineNotUTF8                            // not valid UTF-8
	brokerLineNotJSON                            // not a JSON value
	brokerLineBadVersion                         // jsonrpc is not "2.0"
	brokerLineMalformed                          // a workload frame the daemon cannot relay
	brokerLineRefused                            // a notification with bad params (log/set-level)
	brokerLineBadDiscovery                       // a discovery:nodes snapshot that does not decode
	brokerLineUnanswered                         // a request whose answer could not be written
	brokerLineKinds
)

// brokerLineKindNames are the kinds' label values, in their order.
var brokerLineKindNames = [brokerLineKinds]string{
	"too_long", "not_utf8", "not_json", "bad_jsonrpc", "malformed", "refused", "bad_discovery", "unanswered",
}

// brokerLineMsgs are the kinds' log messages, the same for a line and for
// the summary of the lines held back after it.
var brokerLineMsgs = [brokerLineKinds]string{
	"local frame skipped", "local frame skipped", "local frame skipped", "local frame skipped",
	"local frame dropped", "notification refused", "discovery snapshot dropped", "answer to broker failed",
}

// brokerLineLog rate-limits the warnings bad broker lines cause: per kind,
// the first is written at once, then at most one line per interval
// (httpguard.SourceLogInterval, 10 s), which carries suppressed=N, the lines held
// back since the last. When a burst ends, the count of what it held back
// is written on a line of its own at the end of the interval, and at the
// latest when the daemon stops, so a burst of 44,000 lines is two lines
// that account for all of them, not one line that says nothing of the
// rest. At debug level every line is still written (at debug).
type brokerLineLog struct {
	limiter *httpguard.SourceLog // keyed on the kind, under the source "broker"
	counts  [brokerLineKinds]atomic.Uint64

	mu      sync.Mutex // guards armed and stopped; a leaf lock, never held while the limiter's is taken or a line is written
	armed   [brokerLineKinds]bool
	stopped bool
}

func newBrokerLineLog() *brokerLineLog { return &brokerLineLog{limiter: httpguard.NewSourceLog()} }

func brokerLineKey(kind brokerLineKind) httpguard.SourceLogKey {
	return httpguard.SourceLogKey{Source: "broker", Status: int(kind)}
}

// warn counts a bad line of kind and logs it at warn unless a line of its
// kind was written within the interval; args are the line's details, each
// value from the line clipped by the caller (httpguard.ClipLogged).
func (b *brokerLineLog) warn(log *slog.Logger, kind brokerLineKind, args ...any) {
	b.counts[kind].Add(1)
	if until := b.limiter.LogKey(log, slog.LevelWarn, brokerLineKey(kind), brokerLineMsgs[kind], args...); !until.IsZero() {
		b.arm(log, kind, until)
	}
}

// arm makes sure the count of kind's held-back lines is written at until,
// the end of its interval, when no later line has written it by then.
func (b *brokerLineLog) arm(log *slog.Logger, kind brokerLineKind, until time.Time) {
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
func (b *brokerLineLog) flush(log *slog.Logger, kind brokerLineKind) {
	b.mu.Lock()
	b.armed[kind] = false
	stopped := b.stopped
	b.mu.Unlock()
	if stopped {
		return
	}
	n, until := b.limiter.TakeHeld(brokerLineKey(kind), time.Now(), false)
	switch {
	case n > 0:
		log.Warn(brokerLineMsgs[kind], "kind", brokerLineKindNames[kind], "suppressed", n)
	case !until.IsZero():
		b.arm(log, kind, until)
	}
}

// stop writes the counts still held back, at once: the daemon is
// stopping, and a count not written now would never be. Lines after it
// are limited as before, but their counts are not written.
func (b *brokerLineLog) stop(log *slog.Logger) {
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	for kind := range brokerLineKinds {
		if n, _ := b.limiter.TakeHeld(brokerLineKey(kind), time.Now(), true); n > 0 {
			log.Warn(brokerLineMsgs[kind], "kind", brokerLineKindNames[kind], "suppressed", n)
		}
	}
}

// writeMetrics renders the bad lines' counters, every kind from the start.
func (b *brokerLineLog) writeMetrics(t *promtext.Text) {
	const name = "nvpair_wlm_broker_bad_lines_total"
	t.Family(name, "counter", "Lines from the broker the daemon could not act on as sent (skipped, dropped, refused, or a request left unanswered), by kind; each kind is logged at warn at most once per 10 s.")
	for kind := range brokerLineKinds {
		t.Sample(name, []string{"kind"}, []string{brokerLineKindNames[kind]}, float64(b.counts[kind].Load()))
	}
}
