package pairinstall

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// waitTimeout bounds every wait in these tests: a read that should return
// at once is given this long before the test calls it blocked.
const waitTimeout = 10 * time.Second

// logBuffer collects a trust's log output for assertions.
type logBuffer struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// contains reports whether some log line holds every fragment.
func (l *logBuffer) contains(fragments ...string) bool {
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

// writeFile writes content to path, making its directory first.
func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
