package brokerio

import (
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testkit"
)

// brokerLog is a LineLog whose interval is short, writing to a
// buffer at level.
func brokerLog(level slog.Level, interval time.Duration) (*LineLog, *slog.Logger, *testkit.LogBuffer) {
	b := NewLineLog()
	b.limiter.Interval = interval
	var buf testkit.LogBuffer
	return b, slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level})), &buf
}

func TestBrokerLineLogWritesTheFirstLineThenOnePerIntervalAndTheBurstCount(t *testing.T) {
	b, log, buf := brokerLog(slog.LevelInfo, 300*time.Millisecond)
	for range 1000 {
		b.Warn(log, LineNotJSON, "reason", "not JSON: invalid JSON")
	}
	// A new kind of fault is told at once, whatever the other kinds did.
	b.Warn(log, LineBadVersion, "method", "x", "reason", `jsonrpc must be "2.0"`)
	if n := strings.Count(buf.String(), "\n"); n != 2 {
		t.Fatalf("%d lines after a burst of 1000 and one other fault, want the first of each:\n%s", n, buf.String())
	}
	// The burst has ended: its count comes on a line of its own at the end
	// of the interval.
	testkit.Eventually(t, "the burst's count", func() bool { return buf.Contains("kind=not_json", "suppressed=999") })
	counted := time.Now()
	// Nothing is left to write: no count held back, no flush armed.
	b.mu.Lock()
	armed := b.armed
	b.mu.Unlock()
	if n, _ := b.limiter.TakeHeld(lineKey(LineNotJSON), time.Now(), true); n != 0 || armed != [LineKinds]bool{} {
		t.Fatalf("after the count: %d lines still held back, flushes armed %v", n, armed)
	}
	if got := b.counts[LineNotJSON].Load(); got != 1000 {
		t.Fatalf("counted %d not-JSON lines, want 1000", got)
	}
	// A later line, past the interval, is written at once.
	testkit.Eventually(t, "an interval after the count", func() bool { return time.Since(counted) > b.limiter.Interval })
	b.Warn(log, LineNotJSON, "reason", "again")
	if !buf.Contains("reason=again") {
		t.Fatalf("a bad line after a quiet interval was not written:\n%s", buf.String())
	}
}

func TestBrokerLineLogWritesAtMostOneLinePerIntervalThroughALongBurst(t *testing.T) {
	const interval = 200 * time.Millisecond
	b, log, buf := brokerLog(slog.LevelInfo, interval)
	start := time.Now()
	sent := 0
	for time.Since(start) < 5*interval {
		b.Warn(log, LineTooLong, "reason", "line longer than the frame limit")
		sent++
	}
	elapsed := time.Since(start)
	b.Stop(log)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	// The first line, one per interval begun, and the final count.
	if limit := 2 + int(elapsed/interval); len(lines) > limit {
		t.Fatalf("%d lines for %d bad lines over %v, want at most %d:\n%s", len(lines), sent, elapsed, limit, buf.String())
	}
	accounted := len(lines) // every line written stands for itself...
	for _, m := range regexp.MustCompile(`suppressed=(\d+)`).FindAllStringSubmatch(buf.String(), -1) {
		n, _ := strconv.Atoi(m[1])
		accounted += n
	}
	// ...but the count-only lines stand for none but what they count.
	accounted -= strings.Count(buf.String(), "kind=too_long")
	if accounted != sent {
		t.Fatalf("the lines account for %d bad lines, %d were sent:\n%s", accounted, sent, buf.String())
	}
}

func TestBrokerLineLogWritesEveryLineAtDebug(t *testing.T) {
	b, log, buf := brokerLog(slog.LevelDebug, time.Hour)
	for range 5 {
		b.Warn(log, LineRefused, "reason", "bad level")
	}
	if n := strings.Count(buf.String(), "reason=\"bad level\""); n != 5 {
		t.Fatalf("%d lines at debug for 5 bad lines, want 5:\n%s", n, buf.String())
	}
	if n := strings.Count(buf.String(), "level=WARN"); n != 1 {
		t.Fatalf("%d warnings, want the first only:\n%s", n, buf.String())
	}
}

func TestBrokerLineLogStopWritesWhatItHeldBack(t *testing.T) {
	b, log, buf := brokerLog(slog.LevelInfo, time.Hour)
	for range 7 {
		b.Warn(log, LineUnanswered, "reason", "line over the broker's line limit")
	}
	b.Stop(log)
	if !buf.Contains("answer to broker failed", "kind=unanswered", "suppressed=6") {
		t.Fatalf("stop did not write the count held back:\n%s", buf.String())
	}
}
