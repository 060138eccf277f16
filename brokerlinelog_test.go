package main

import (
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// brokerLog is a brokerLineLog whose interval is short, writing to a
// buffer at level.
func brokerLog(level slog.Level, interval time.Duration) (*brokerLineLog, *slog.Logger, *logBuffer) {
	b := newBrokerLineLog()
	b.limiter.Interval = interval
	var buf logBuffer
	return b, slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level})), &buf
}

func TestBrokerLineLogWritesTheFirstLineThenOnePerIntervalAndTheBurstCount(t *testing.T) {
	b, log, buf := brokerLog(slog.LevelInfo, 300*time.Millisecond)
	for range 1000 {
		b.warn(log, brokerLineNotJSON, "reason", "not JSON: invalid JSON")
	}
	// A new kind of fault is told at once, whatever the other kinds did.
	b.warn(log, brokerLineBadVersion, "method", "x", "reason", `jsonrpc must be "2.0"`)
	if n := strings.Count(buf.String(), "\n"); n != 2 {
		t.Fatalf("%d lines after a burst of 1000 and one other fault, want the first of each:\n%s", n, buf.String())
	}
	// The burst has ended: its count comes on a line of its own at the end
	// of the interval.
	eventually(t, "the burst's count", func() bool { return buf.contains("kind=not_json", "suppressed=999") })
	counted := time.Now()
	// Nothing is left to write: no count held back, no flush armed.
	b.mu.Lock()
	armed := b.armed
	b.mu.Unlock()
	if n, _ := b.limiter.TakeHeld(brokerLineKey(brokerLineNotJSON), time.Now(), true); n != 0 || armed != [brokerLineKinds]bool{} {
		t.Fatalf("after the count: %d lines still held back, flushes armed %v", n, armed)
	}
	if got := b.counts[brokerLineNotJSON].Load(); got != 1000 {
		t.Fatalf("counted %d not-JSON lines, want 1000", got)
	}
	// A later line, past the interval, is written at once.
	eventually(t, "an interval after the count", func() bool { return time.Since(counted) > b.limiter.Interval })
	b.warn(log, brokerLineNotJSON, "reason", "again")
	if !buf.contains("reason=again") {
		t.Fatalf("a bad line after a quiet interval was not written:\n%s", buf.String())
	}
}

func TestBrokerLineLogWritesAtMostOneLinePerIntervalThroughALongBurst(t *testing.T) {
	const interval = 200 * time.Millisecond
	b, log, buf := brokerLog(slog.LevelInfo, interval)
	start := time.Now()
	sent := 0
	for time.Since(start) < 5*interval {
		b.warn(log, brokerLineTooLong, "reason", "line longer than the frame limit")
		sent++
	}
	elapsed := time.Since(start)
	b.stop(log)
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
		b.warn(log, brokerLineRefused, "reason", "bad level")
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
		b.warn(log, brokerLineUnanswered, "reason", "line over the broker's line limit")
	}
	b.stop(log)
	if !buf.contains("answer to broker failed", "kind=unanswered", "suppressed=6") {
		t.Fatalf("stop did not write the count held back:\n%s", buf.String())
	}
}

// A node logging at info, so held-back lines are not written at debug.
// Its limiter's interval is an hour, so however slow the test runs, no
// interval ends within it.
func newInfoLogNode(t *testing.T) (*testNode, *logBuffer) {
	var logs logBuffer
	n := newTestNode(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	n.m.brokerLines.limiter.Interval = time.Hour
	return n.start(), &logs
}

func TestBadBrokerLinesAreCountedByKindAndWarnedOncePerKind(t *testing.T) {
	n, logs := newInfoLogNode(t)
	// A 900 KB JSON string of control characters: each takes four bytes in
	// a log line once quoted, so clipping its 256 first bytes would still
	// be a kilobyte.
	hugeJSON := `"` + strings.Repeat(`\u0001`, 900_000/6) + `"`
	lines := map[brokerLineKind]string{
		brokerLineNotJSON:      `{not json`,
		brokerLineNotUTF8:      "{\"jsonrpc\":\"2.0\",\"method\":\"x\xff\"}",
		brokerLineTooLong:      strings.Repeat("x", wireframe.MaxBytes+1),
		brokerLineBadVersion:   `{"jsonrpc":"1.0","method":` + hugeJSON + `}`,
		brokerLineMalformed:    `{"jsonrpc":"2.0","method":"` + wireframe.MethodStarted + `","params":{"workloadInfo":{"id":"x"}}}`,
		brokerLineRefused:      `{"jsonrpc":"2.0","method":"log/set-level","params":{"level":` + hugeJSON + `}}`,
		brokerLineBadDiscovery: `{"jsonrpc":"2.0","method":"discovery:nodes","params":{"nodes":` + hugeJSON + `}}`,
		brokerLineUnanswered:   `{"jsonrpc":"2.0","id":` + hugeJSON + `,"method":"nope"}`,
	}
	const repeats = 5
	for range repeats {
		for kind := range brokerLineKinds {
			n.broker.send(lines[kind])
		}
	}
	// A huge method or level is quoted clipped in the answer, which then
	// fits the broker's line: the request is answered.
	n.broker.send(`{"jsonrpc":"2.0","id":"method","method":` + hugeJSON + `}`)
	n.broker.send(`{"jsonrpc":"2.0","id":"level","method":"log/set-level","params":{"level":` + hugeJSON + `}}`)
	if a := n.broker.waitResponse(`"method"`); a.Error == nil || a.Error.Code != wireframe.CodeMethodNotFound {
		t.Fatalf("a request with a huge method answered %+v, want -32601", a)
	}
	if a := n.broker.waitResponse(`"level"`); a.Error == nil || a.Error.Code != wireframe.CodeInvalidParams {
		t.Fatalf("log/set-level with a huge level answered %+v, want -32602", a)
	}
	for kind := range brokerLineKinds {
		if got := n.m.brokerLines.counts[kind].Load(); got != repeats {
			t.Errorf("kind %s: counted %d, want %d", brokerLineKindNames[kind], got, repeats)
		}
	}
	text := logs.String()
	for _, msg := range []string{"local frame skipped", "local frame dropped", "notification refused", "discovery snapshot dropped", "answer to broker failed"} {
		want := 1
		if msg == "local frame skipped" {
			want = 4 // too long, not UTF-8, not JSON, bad jsonrpc: one each
		}
		if got := strings.Count(text, "msg=\""+msg+"\""); got != want {
			t.Errorf("%d %q lines for %d such lines each, want %d", got, msg, repeats, want)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if len(line) > 1024 {
			t.Fatalf("a log line of %d bytes: %.300s...", len(line), line)
		}
	}
}
