package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// A node logging at info, so held-back lines are not written at debug.
// Its limiter's interval is an hour, so however slow the test runs, no
// interval ends within it.
func newInfoLogNode(t *testing.T) (*testNode, *testkit.LogBuffer) {
	var logs testkit.LogBuffer
	n := newTestNode(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	n.m.brokerLines.SetInterval(time.Hour)
	return n.start(), &logs
}

func TestBadBrokerLinesAreCountedByKindAndWarnedOncePerKind(t *testing.T) {
	n, logs := newInfoLogNode(t)
	// A 900 KB JSON string of control characters: each takes four bytes in
	// a log line once quoted, so clipping its 256 first bytes would still
	// be a kilobyte.
	hugeJSON := `"` + strings.Repeat(`\u0001`, 900_000/6) + `"`
	lines := map[brokerio.LineKind]string{
		brokerio.LineNotJSON:      `{not json`,
		brokerio.LineNotUTF8:      "{\"jsonrpc\":\"2.0\",\"method\":\"x\xff\"}",
		brokerio.LineTooLong:      strings.Repeat("x", wireframe.MaxBytes+1),
		brokerio.LineBadVersion:   `{"jsonrpc":"1.0","method":` + hugeJSON + `}`,
		brokerio.LineMalformed:    `{"jsonrpc":"2.0","method":"` + wireframe.MethodStarted + `","params":{"workloadInfo":{"id":"x"}}}`,
		brokerio.LineRefused:      `{"jsonrpc":"2.0","method":"log/set-level","params":{"level":` + hugeJSON + `}}`,
		brokerio.LineBadDiscovery: `{"jsonrpc":"2.0","method":"discovery:nodes","params":{"nodes":` + hugeJSON + `}}`,
		brokerio.LineUnanswered:   `{"jsonrpc":"2.0","id":` + hugeJSON + `,"method":"nope"}`,
	}
	const repeats = 5
	for range repeats {
		for kind := range brokerio.LineKinds {
			n.broker.send(lines[kind])
		}
	}
	// A huge method or level is quoted clipped in the answer, which then
	// fits the broker's line: the request is answered.
	n.broker.send(`{"jsonrpc":"2.0","id":"method","method":` + hugeJSON + `}`)
	n.broker.send(`{"jsonrpc":"2.0","id":"level","method":"log/set-level","params":{"level":` + hugeJSON + `}}`)
	if a := n.broker.WaitResponse(`"method"`); a.Error == nil || a.Error.Code != wireframe.CodeMethodNotFound {
		t.Fatalf("a request with a huge method answered %+v, want -32601", a)
	}
	if a := n.broker.WaitResponse(`"level"`); a.Error == nil || a.Error.Code != wireframe.CodeInvalidParams {
		t.Fatalf("log/set-level with a huge level answered %+v, want -32602", a)
	}
	for kind := range brokerio.LineKinds {
		if got := n.m.brokerLines.Count(kind); got != repeats {
			t.Errorf("kind %s: counted %d, want %d", kind, got, repeats)
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
