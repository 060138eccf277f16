package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runWithin runs the burner with args and fails the test when it has not
// returned within limit.
func runWithin(t *testing.T, ctx context.Context, limit time.Duration, args ...string) (int, string) {
	t.Helper()
	var out, errb strings.Builder
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &out, &errb) }()
	select {
	case code := <-done:
		return code, out.String() + errb.String()
	case <-time.After(limit):
		t.Fatalf("cpuburn %v still running after %s", args, limit)
		return 0, ""
	}
}

func TestBurnerStopsByItselfWhenItsDurationHasPassed(t *testing.T) {
	start := time.Now()
	code, out := runWithin(t, context.Background(), 10*time.Second, "--duration", "300ms", "--workers", "1")
	if code != 0 || !strings.Contains(out, "stopped after") {
		t.Fatalf("exit %d, output %q; want 0 and the stop line", code, out)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("stopped after %s, before its 300ms", took)
	}
}

func TestBurnerStopsAtOnceWhenSignalled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ready := filepath.Join(t.TempDir(), "ready")
	go func() {
		for {
			if _, err := os.Stat(ready); err == nil {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	code, out := runWithin(t, ctx, 10*time.Second, "--duration", "1h", "--workers", "2", "--ready", ready)
	if code != 0 || !strings.Contains(out, "2 workers busy") {
		t.Fatalf("exit %d, output %q; want 0 after both workers ran", code, out)
	}
}

func TestBurnerRefusesADurationOverItsBound(t *testing.T) {
	for _, args := range [][]string{{"--duration", "61m"}, {"--duration", "0"}, {"--workers", "0"}, {"stray"}} {
		code, out := runWithin(t, context.Background(), 10*time.Second, args...)
		if code != 2 || !strings.HasPrefix(out, "cpuburn: ") {
			t.Fatalf("%v: exit %d, output %q; want 2 and one line", args, code, out)
		}
	}
}

func TestBurnerFailsWhenItCannotWriteItsReadyFile(t *testing.T) {
	code, out := runWithin(t, context.Background(), 10*time.Second,
		"--duration", "1h", "--workers", "1", "--ready", filepath.Join(t.TempDir(), "no", "such", "dir", "ready"))
	if code != 1 || !strings.Contains(out, "no such file") {
		t.Fatalf("exit %d, output %q; want 1 naming the file error", code, out)
	}
}
