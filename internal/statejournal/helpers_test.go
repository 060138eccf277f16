package statejournal

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// warnings collects what a journal logs, so a test can count its warnings.
type warnings struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *warnings) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// count is the WARN lines logged so far.
func (w *warnings) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Count(w.buf.String(), "level=WARN")
}

func (w *warnings) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// options returns test options logging to a fresh warnings.
func options() (Options, *warnings) {
	w := &warnings{}
	return Options{Logger: slog.New(slog.NewTextHandler(w, nil)), NoSync: true}, w
}

// journalPath is a journal path in a fresh directory.
func journalPath(t testing.TB) string {
	return filepath.Join(t.TempDir(), "state.journal")
}

// mustOpen opens the journal at path and returns it and a copy of every
// record Open handed over.
func mustOpen(t testing.TB, path string, opt Options) (*Journal, [][]byte) {
	t.Helper()
	j, recs, err := openCollect(path, opt)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return j, recs
}

// openCollect is Open with a function that keeps a copy of each record.
func openCollect(path string, opt Options) (*Journal, [][]byte, error) {
	var recs [][]byte
	j, err := Open(path, opt, func(p []byte) error {
		recs = append(recs, bytes.Clone(p))
		return nil
	})
	return j, recs, err
}

func mustAppendWait(t testing.TB, j *Journal, payloads ...[]byte) {
	t.Helper()
	for _, p := range payloads {
		seq, err := j.Append(p)
		if err != nil {
			t.Fatalf("Append(%q): %v", p, err)
		}
		if err := j.Wait(seq); err != nil {
			t.Fatalf("Wait(%d): %v", seq, err)
		}
	}
}

func mustClose(t testing.TB, j *Journal) {
	t.Helper()
	if err := j.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// payloads makes n distinct payloads.
func payloads(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "record %d %s", i, strings.Repeat("x", i%7))
	}
	return out
}

func sameRecords(t testing.TB, got, want [][]byte) {
	t.Helper()
	if !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("records:\n got %d: %q\nwant %d: %q", len(got), clipList(got), len(want), clipList(want))
	}
}

func clipList(r [][]byte) [][]byte {
	if len(r) > 8 {
		return r[:8]
	}
	return r
}

// eventually waits for cond, failing the test after a deadline.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s, still not %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// fileBytes reads a whole file.
func fileBytes(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// recordsThenZeros reports whether the file at path holds want (header and
// records) and nothing but zeros after: the preallocated end the writer
// keeps ahead of its groups, or none.
func recordsThenZeros(t testing.TB, path string, want []byte) bool {
	t.Helper()
	got := fileBytes(t, path)
	return len(got) >= len(want) && bytes.Equal(got[:len(want)], want) && allZero(got[len(want):])
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// encode builds a journal file holding recs.
func encode(recs ...[]byte) []byte {
	b := []byte(header)
	for _, r := range recs {
		b = appendFrame(b, r)
	}
	return b
}

// asides lists the files set aside beside path.
func asides(t testing.TB, path string) []string {
	t.Helper()
	m, err := filepath.Glob(path + ".aside-*")
	if err != nil {
		t.Fatal(err)
	}
	return m
}
