package statetable

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// A restore is fed as statejournal.Open feeds it: each record in a buffer
// reused for the next. What it keeps it copies: the lines restored are
// the records' own, whatever the buffer held after.
func TestARestoreCopiesWhatItKeeps(t *testing.T) {
	tb, c, j := newTable(t)
	for i := range 20 {
		if o, _ := tb.Commit(&Frame{Source: FromProducer, Life: event(t, fmt.Sprintf("job-%d", i), "running"), LeaseSeconds: 30}); o != Applied {
			t.Fatal(o)
		}
	}
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	r := again.BeginRestore(5 * time.Second)
	var window []byte
	for _, rec := range j.records() {
		window = append(window[:0], rec...)
		r.Add(window)
		copy(window, bytes.Repeat([]byte{'#'}, len(window))) // the reader's next record
	}
	if st := r.Finish(); st.Runs != 20 || st.Refused != 0 {
		t.Fatalf("restore %+v, want 20 runs", st)
	}
	for i := range 20 {
		lines, _ := again.Latest(wireframe.WorkloadRef{Origin: self, ID: fmt.Sprintf("job-%d", i)})
		if len(lines) != 1 || !strings.Contains(string(lines[0].Reassertion()), fmt.Sprintf(`"id":"job-%d"`, i)) {
			t.Fatalf("job-%d restored as %d lines, or a line the reader's buffer overwrote", i, len(lines))
		}
	}
}

// A journal that holds a run many times (a lease renewed between two
// compactions) costs the restore one line for the run, not one per
// record: a winner's line takes the buffer of the record it displaces.
func TestARestoreHoldsOneLinePerKeyNotOnePerRecord(t *testing.T) {
	tb, c, _ := newTable(t)
	pad := `"note":"` + strings.Repeat("n", 10<<10) + `"`
	if o, _ := tb.Commit(&Frame{Source: FromProducer, Life: event(t, "renewed", "running", pad), LeaseSeconds: 30}); o != Applied {
		t.Fatal(o)
	}
	rec := make([]byte, 0, 64<<10) // the reader's window
	tb.mu.Lock()
	e := *tb.byKey[wireframe.WorkloadKey{Origin: self, Engine: "e", RunID: "r-renewed", ID: "renewed"}]
	tb.mu.Unlock()
	const records = 5000 // 50 MiB of lines
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	r := again.BeginRestore(5 * time.Second)
	var before, after runtime.MemStats
	var got uint64 // what the restore allocated, its records' encoding apart
	for v := range records {
		e.version = uint64(v + 1)
		rec = encodePut(rec[:0], &e)
		runtime.ReadMemStats(&before)
		r.Add(rec)
		runtime.ReadMemStats(&after)
		got += after.TotalAlloc - before.TotalAlloc
	}
	if st := r.Finish(); st.Runs != 1 || st.Refused != 0 {
		t.Fatalf("restore %+v, want the one run", st)
	}
	if got > 5<<20 {
		t.Fatalf("%d records of one run allocated %d bytes: a line per record (%d bytes of lines)", records, got, records*len(e.line))
	}
}
