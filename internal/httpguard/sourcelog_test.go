package httpguard

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestSourceLogWritesTheFirstLinePerSourceAndStatusThenOnePerInterval(t *testing.T) {
	l := NewSourceLog()
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	a403 := SourceLogKey{"10.0.0.1", 403}
	steps := []struct {
		key   SourceLogKey
		at    time.Duration
		write bool
		held  int
	}{
		{a403, 0, true, 0},
		{a403, time.Second, false, 0},
		{a403, 2 * time.Second, false, 0},
		{SourceLogKey{"10.0.0.1", 400}, 2 * time.Second, true, 0}, // a new kind of mistake is told at once
		{SourceLogKey{"10.0.0.2", 403}, 2 * time.Second, true, 0}, // so is another client
		{a403, SourceLogInterval, true, 2},                        // the summary carries what was held back
		{a403, SourceLogInterval + time.Second, false, 0},
	}
	for i, s := range steps {
		held, write := l.admit(s.key, t0.Add(s.at))
		if write != s.write || held != s.held {
			t.Fatalf("step %d (%v at %v): write %v with %d held back, want %v with %d", i, s.key, s.at, write, held, s.write, s.held)
		}
	}
}

func TestSourceLogHoldsBackAtWarnButWritesEveryLineAtDebug(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		var b bytes.Buffer
		log := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: level}))
		l := NewSourceLog()
		for range 5 {
			l.Log(log, slog.LevelWarn, "127.0.0.1:5000", 403, "refused")
		}
		want := 1
		if level == slog.LevelDebug {
			want = 5
		}
		if got := strings.Count(b.String(), `msg=refused`); got != want {
			t.Fatalf("log at %v: %d lines for 5 refusals, want %d:\n%s", level, got, want, b.String())
		}
		if strings.Count(b.String(), "level=WARN") != 1 {
			t.Fatalf("log at %v: want exactly one warning:\n%s", level, b.String())
		}
	}
}

func TestSourceLogIsBoundedWhateverTheNumberOfSources(t *testing.T) {
	l := NewSourceLog()
	now := time.Now()
	written := 0
	for i := range 4 * sourceLogMaxSources {
		if _, w := l.admit(SourceLogKey{fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), 403}, now); w {
			written++
		}
	}
	if len(l.bySource) > sourceLogMaxSources+1 {
		t.Fatalf("%d sources kept, want at most %d and the shared entry", len(l.bySource), sourceLogMaxSources)
	}
	if written != sourceLogMaxSources+1 {
		t.Fatalf("%d lines written for %d sources in one interval, want one per kept source and one shared: %d", written, 4*sourceLogMaxSources, sourceLogMaxSources+1)
	}
	// Once the interval has passed, quiet sources are forgotten to make room.
	if _, w := l.admit(SourceLogKey{"192.168.0.1", 403}, now.Add(SourceLogInterval)); !w {
		t.Fatal("a new source after the interval was not written")
	}
	if len(l.bySource) > sourceLogMaxSources+1 {
		t.Fatalf("%d sources kept after the interval", len(l.bySource))
	}
}
