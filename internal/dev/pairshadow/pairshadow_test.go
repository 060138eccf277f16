package pairshadow

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/stockwlm"
)

// An upstream tree without PAIR's broker store is no shadow: ErrNotFound,
// saying where it looked, which a caller turns into its one line.
func TestFindWithoutTheStoreIsErrNotFound(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(stockwlm.EnvDir, dir)
	_, err := Find(".")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Find = %v, want ErrNotFound naming %s", err, dir)
	}
}

// Diff compares the two lists as multisets keyed like both stores key a
// workload, ignoring order and JSON spacing, and names each job that
// differs.
func TestDiffNamesEachJobThatDiffers(t *testing.T) {
	a := json.RawMessage(`{"id":"a","originatedFrom":"n1","state":"running"}`)
	aSpaced := json.RawMessage(`{ "id": "a", "originatedFrom": "n1", "state": "running" }`)
	b := json.RawMessage(`{"id":"b","originatedFrom":"n2","engine":"e","runId":"r","state":"queued"}`)
	bFailed := json.RawMessage(`{"id":"b","originatedFrom":"n2","engine":"e","runId":"r","state":"failed"}`)
	if d := Diff("Jobs list", []json.RawMessage{a, b}, []json.RawMessage{b, aSpaced}); d != nil {
		t.Fatalf("equal lists in another order differ: %q", d)
	}
	d := Diff("Jobs list", []json.RawMessage{a, b}, []json.RawMessage{bFailed})
	if len(d) != 2 || !strings.HasPrefix(d[0], `Jobs list: job n1/a: the model holds {"id":"a"`) ||
		!strings.HasSuffix(d[0], "PAIR's store holds nothing") ||
		!strings.HasPrefix(d[1], `Jobs list: job n2/b (engine "e", runId "r"): the model holds`) {
		t.Fatalf("Diff = %q", d)
	}
}
