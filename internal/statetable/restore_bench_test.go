package statetable

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nvpair-workload-manager/internal/statejournal"
)

// BenchmarkRestore measures a start's restore (spec 7.1): the journal read
// and the table rebuilt from it, for the shapes issue 36 measured: a
// journal of 100,000 runs at the default bounds (--max-live-workloads
// 100,000 and --max-live-workload-bytes 256 MiB: lines of about 2.6 KiB),
// the same with every run written twice (the size a compaction waits
// for: twice what the table holds), and one of 1e6 small records
// (100,000 leased runs renewed ten times).
// It reports the peak of the heap's objects during the restore
// (runtime/metrics, sampled every millisecond) and the file's size.
func BenchmarkRestore(b *testing.B) {
	cases := []struct {
		name          string
		runs, renewed int
		pad           int
	}{
		{"100000runs-default-bounds", 100_000, 1, 2400},
		{"100000runs-twice-at-compaction", 100_000, 2, 2400},
		{"1e6-small-records", 100_000, 10, 0},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			path := benchJournal(b, c.runs, c.renewed, c.pad)
			st, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			var peak, rss, table float64
			for b.Loop() {
				runtime.GC()
				debug.FreeOSMemory()
				resetPeakRSS()
				stop := samplePeakHeap()
				again := New(benchConfig())
				rs := restoreFile(b, again, path)
				if rs.Runs != c.runs || rs.Refused != 0 {
					b.Fatalf("restored %+v, want %d runs", rs, c.runs)
				}
				peak = max(peak, float64(stop())/(1<<20))
				rss = max(rss, float64(peakRSS())/(1<<20))
				runtime.GC()
				table = heapObjects() / (1 << 20)
				runtime.KeepAlive(again)
			}
			b.ReportMetric(float64(st.Size())/(1<<20), "fileMiB")
			b.ReportMetric(table, "tableHeapMiB")
			b.ReportMetric(peak, "peakHeapMiB")
			if rss > 0 {
				b.ReportMetric(rss, "peakRSSMiB")
			}
		})
	}
}

func benchConfig() Config {
	return Config{Self: self, Retention: retention, MaxLive: 100_000, MaxLiveBytes: 256 << 20, MaxEndedBytes: 64 << 20,
		MemberClaim: time.Hour}
}

// benchJournals caches the journals built, one per shape, for the run.
var benchJournals sync.Map

// benchJournal writes a journal of runs leased runs, each committed
// renewed times, with pad bytes of note in each line.
func benchJournal(b *testing.B, runs, renewed, pad int) string {
	key := fmt.Sprint(runs, renewed, pad)
	if p, ok := benchJournals.Load(key); ok {
		return p.(string)
	}
	dir, err := os.MkdirTemp("", "restore-bench-")
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, "bench.journal")
	j := openBenchJournal(b, path)
	cfg := benchConfig()
	cfg.Journal = j
	tb := New(cfg)
	note := `"note":"` + strings.Repeat("n", pad) + `"`
	for r := range renewed {
		for i := range runs {
			extra := []string{`"requesterId":"bench"`, `"seq":` + strconv.Itoa(r+1)}
			if pad > 0 {
				extra = append(extra, note)
			}
			ev := event(b, fmt.Sprintf("job-%06d", i), "running", extra...)
			if o, _ := tb.Commit(&Frame{Source: FromProducer, Life: ev, LeaseSeconds: 600}); o != Applied {
				b.Fatalf("commit %d: %s", i, o)
			}
		}
	}
	if err := j.Close(); err != nil {
		b.Fatal(err)
	}
	benchJournals.Store(key, path)
	return path
}

// samplePeakHeap samples the heap's object bytes every millisecond until
// the returned function is called, which returns the peak.
func samplePeakHeap() func() uint64 {
	var peak atomic.Uint64
	done := make(chan struct{})
	stopped := make(chan struct{})
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() {
		metrics.Read(s)
		if v := s[0].Value.Uint64(); v > peak.Load() {
			peak.Store(v)
		}
	}
	go func() {
		defer close(stopped)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			read()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-stopped
		read()
		return peak.Load()
	}
}

// heapObjects is the bytes of the heap's objects now.
func heapObjects() float64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return float64(s[0].Value.Uint64())
}

// resetPeakRSS resets the process's peak resident size (Linux: "5" to
// /proc/self/clear_refs); elsewhere it does nothing.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS is the process's peak resident size since resetPeakRSS (Linux's
// VmHWM), 0 where unknown.
func peakRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(l, []byte("VmHWM:")); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(string(v)), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func TestMain(m *testing.M) {
	code := m.Run()
	benchJournals.Range(func(_, v any) bool { os.RemoveAll(filepath.Dir(v.(string))); return true })
	os.Exit(code)
}

func openBenchJournal(b *testing.B, path string) *statejournal.Journal {
	j, err := statejournal.Open(path, statejournal.Options{NoSync: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return j
}

// restoreFile restores t from the journal at path as the daemon does at
// start: the records streamed from Open into a Restorer.
func restoreFile(b *testing.B, t *Table, path string) RestoreStats {
	r := t.BeginRestore(5 * time.Second)
	j, err := statejournal.Open(path, statejournal.Options{NoSync: true}, r.Add)
	if err != nil {
		b.Fatal(err)
	}
	st := r.Finish()
	j.Close()
	return st
}
