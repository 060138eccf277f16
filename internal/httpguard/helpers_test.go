package httpguard

import (
	"io"
	"log"
	"testing"
	"time"
)

// waitTimeout bounds every wait in these tests: a condition that should
// hold at once is given this long before the test calls it broken.
const waitTimeout = 10 * time.Second

// eventually waits until cond holds or fails the test after waitTimeout.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// netMust fails the test on a network error it cannot go on without.
func netMust(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// netDiscardLog is a server's error log that writes nowhere.
func netDiscardLog() *log.Logger { return log.New(io.Discard, "", 0) }
