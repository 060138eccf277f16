// Package testkit holds the test helpers the root's in-process tests and
// e2e share: the broker's side of a daemon's channel (a frame log), the
// Jobs list judged by PAIR's store, peer stand-ins, a producer's requests,
// a metrics scrape, a log buffer and Eventually.
//
// It may import the standard library and this module's internal/wireframe,
// internal/dev/devpki, internal/dev/pairbroker and internal/dev/pairshadow (and,
// through it, internal/dev/stockwlm). It must never be imported by non-test code
// (the root's layout_test.go and internal/dev/testframe's tests check both).
package testkit

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// WaitTimeout bounds every wait on a condition in the tests. Nothing in the
// tests sleeps and hopes: they wait for a condition until this deadline.
const WaitTimeout = 10 * time.Second

// Eventually waits until cond holds or fails the test after WaitTimeout.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !HoldsWithin(WaitTimeout, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// HoldsWithin waits until cond holds and reports whether it did before the
// timeout. Unlike Eventually it does not fail the test, so a goroutine other
// than the test's may wait with it.
func HoldsWithin(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// LogBuffer collects a daemon's log output for assertions.
type LogBuffer struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Contains reports whether some log line holds every fragment.
func (l *LogBuffer) Contains(fragments ...string) bool {
	for _, line := range strings.Split(l.String(), "\n") {
		all := true
		for _, f := range fragments {
			if !strings.Contains(line, f) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}
