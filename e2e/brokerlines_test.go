package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/wireframe"
)

// 44,000 garbage lines from the broker: not JSON, a wrong jsonrpc with a
// 900 KB method, a request with a 900 KB id whose answer cannot fit the
// broker's line, lines over the 1 MiB frame limit, malformed workload
// frames and refused notifications. Before the limiter each was a warning,
// 44,000 of them, and one with a 900 KB value was a 900 KB log line.
// Now each kind is written once, then at most once per 10 s, plus the
// count held back when the burst ends (at the latest at shutdown): a burst
// lasting E seconds is at most 6 kinds x (2 + E/10) lines, none over
// 1 KiB, and the lines account for every bad line. The daemon relays a
// good frame afterwards.
func TestProcessGarbageBrokerLinesMakeABoundedLogAndTheDaemonStillRelays(t *testing.T) {
	nodes := writeCluster(t, 2)
	a, b := startPair(t, nodes[0], nodes[1], "--log-level", "info")
	logged := len(a.stderr.String())

	huge := strings.Repeat("M", 900_000)
	kinds := []struct {
		kind  string
		line  func(i int) string
		every int // this kind is line i when i%every == 0 (checked in order)
	}{
		{"too_long", func(int) string { return strings.Repeat("x", wireframe.MaxBytes+100) }, 440},
		{"bad_jsonrpc", func(int) string { return `{"jsonrpc":"1.0","method":"` + huge + `"}` }, 441},
		{"unanswered", func(i int) string { return `{"jsonrpc":"2.0","id":"` + huge + strconv.Itoa(i) + `","method":"nope"}` }, 442},
		{"malformed", func(i int) string {
			return `{"jsonrpc":"2.0","method":"` + wireframe.MethodStarted + `","params":{"workloadInfo":{"id":"w` + strconv.Itoa(i) + `"}}}`
		}, 3},
		{"refused", func(int) string { return `{"jsonrpc":"2.0","method":"log/set-level","params":{"level":"loud"}}` }, 5},
		{"not_json", func(i int) string { return `{garbage ` + strconv.Itoa(i) }, 1},
	}
	const lines = 44_000
	sent := map[string]int{}
	start := time.Now()
	for i := range lines {
		for _, k := range kinds {
			if i%k.every == 0 {
				a.send(k.line(i))
				sent[k.kind]++
				break
			}
		}
	}
	a.send(testframe.LifecycleLine("good", "running", nodes[0].ID))
	b.WaitUpserts("good", 1)
	elapsed := time.Since(start)
	a.closeStdin()
	a.wantCleanExit(a.waitExit(exitDeadline))

	out := a.stderr.String()[logged:]
	kindOf := map[string]string{`not JSON`: "not_json", `line longer than the frame limit`: "too_long", `jsonrpc must be`: "bad_jsonrpc"}
	written, suppressed := map[string]int{}, map[string]int{}
	count := regexp.MustCompile(`suppressed=(\d+)`)
	badLines := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if len(line) > 1024 {
			t.Fatalf("a log line of %d bytes: %.300s...", len(line), line)
		}
		kind := ""
		switch {
		case strings.Contains(line, " kind="):
			kind = strings.Fields(line[strings.Index(line, " kind=")+1:])[0][len("kind="):]
		case strings.Contains(line, `msg="local frame dropped"`):
			kind = "malformed"
		case strings.Contains(line, `msg="notification refused"`):
			kind = "refused"
		case strings.Contains(line, `msg="answer to broker failed"`):
			kind = "unanswered"
		case strings.Contains(line, `msg="local frame skipped"`):
			for frag, k := range kindOf {
				if strings.Contains(line, frag) {
					kind = k
				}
			}
		default:
			continue
		}
		badLines++
		if m := count.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1])
			suppressed[kind] += n
		}
		if !strings.Contains(line, " kind=") {
			written[kind]++ // a count-only line stands for no line of its own
		}
	}
	limit := len(kinds) * (2 + int(elapsed/httpguard.SourceLogInterval))
	t.Logf("%d bad broker lines in %v: %d log lines (limit %d)", lines, elapsed.Round(time.Millisecond), badLines, limit)
	if badLines > limit {
		t.Fatalf("%d log lines for %d bad broker lines over %v, want at most %d:\n%.4000s", badLines, lines, elapsed, limit, out)
	}
	for _, k := range kinds {
		if got := written[k.kind] + suppressed[k.kind]; got != sent[k.kind] {
			t.Errorf("kind %s: %d lines written and %d counted as suppressed, for %d sent", k.kind, written[k.kind], suppressed[k.kind], sent[k.kind])
		}
	}
}
