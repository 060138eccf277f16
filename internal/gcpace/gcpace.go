// Package gcpace owns the collector's headroom: how far the heap may grow
// past its live data before the next collection. The runtime's default
// (GOGC 100) lets it reach twice the live data, which a small heap can
// afford and a large state table cannot: at 100,000 live workloads the
// headroom alone would be as large as the table (spec 4.1,
// docs/decisions/0050-the-collectors-headroom.md). So the headroom follows
// the live heap: the default while it is at most SmallHeap, then held at
// SmallHeap, then at MinPercent of the live heap once that is smaller. It
// also reads what the collector has cost (ReadCollectorStats), for the
// metrics page.
//
// It imports only the standard library and must never import a package of
// this module: it knows the runtime, not the daemon.
package gcpace

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync/atomic"
)

// The pacing. SmallHeap is the most headroom the default gives before the
// pacer holds it: below it the collector runs as the runtime would, so a
// daemon with a small table pays no more collections than it did. From
// 32 MiB of live heap the headroom stays at 32 MiB, until it is MinPercent
// of the live heap (at 80 MiB, some 90,000 live workloads), and from there
// it is MinPercent: a table of 100,000 workloads then takes at most 1.4
// times its live bytes, within the 1 KiB per workload beyond its frame that
// spec 4.1 promises. A smaller percent would collect more often for
// little: the heap's own overheads (size classes, a map's free slots) are
// some tenths of its live bytes.
const (
	SmallHeap      = 32 << 20
	MinPercent     = 40
	DefaultPercent = 100
)

// Percent is the GOGC for a live heap of live bytes: DefaultPercent while
// that headroom is at most SmallHeap, then the percent that keeps it at
// SmallHeap, never below MinPercent. It is rounded down to a multiple of 5,
// so a heap that grows by a few bytes does not change it.
func Percent(live uint64) int {
	if live <= SmallHeap {
		return DefaultPercent
	}
	p := int(100 * SmallHeap / live)
	return max(p-p%5, MinPercent)
}

// Pacer sets the collector's percent from the live heap, each Step. Its
// zero value is not usable: New.
type Pacer struct {
	on   bool                        // false when the operator set GOGC: theirs wins
	live func() uint64               // the live heap after the last collection
	set  func(percent int) (old int) // debug.SetGCPercent
	cur  atomic.Int64                // the percent in force
}

// New returns the daemon's pacer: off (it leaves the collector alone) when
// GOGC is set in the environment, since an operator who sets it means it.
func New() *Pacer {
	return newPacer(os.Getenv("GOGC"), liveHeap, debug.SetGCPercent)
}

// Off returns a pacer that leaves the collector alone and reports the
// percent the runtime took from GOGC: for a daemon in a test, which must
// not change a collector it shares.
func Off() *Pacer {
	p := newPacer(os.Getenv("GOGC"), liveHeap, debug.SetGCPercent)
	p.on = false
	return p
}

func newPacer(gogc string, live func() uint64, set func(int) int) *Pacer {
	p := &Pacer{on: gogc == "", live: live, set: set}
	p.cur.Store(int64(envPercent(gogc)))
	return p
}

// envPercent is the percent the runtime read from GOGC at start: the
// default when unset or not a number (the runtime's reading), -1 for off.
func envPercent(gogc string) int {
	if gogc == "off" {
		return -1
	}
	if n, err := strconv.Atoi(gogc); err == nil {
		return n
	}
	return DefaultPercent
}

// liveMetric is the runtime's count of the heap's live bytes, as marked by
// the last collection: reading it costs no collection.
const liveMetric = "/gc/heap/live:bytes"

func liveHeap() uint64 {
	s := []metrics.Sample{{Name: liveMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0 // a runtime without the metric: the default pacing
	}
	return s[0].Value.Uint64()
}

// Step reads the live heap and sets the percent when it changed. The
// daemon calls it once a second (its prune loop): the live heap of a node
// taking 10,000 new workloads a second grows by some 9 MB meanwhile, well
// within the headroom.
func (p *Pacer) Step() {
	if !p.on {
		return
	}
	want := Percent(p.live())
	if int64(want) == p.cur.Load() {
		return
	}
	p.set(want)
	p.cur.Store(int64(want))
}

// Current is the percent in force: what the pacer set, or the operator's
// GOGC (-1 for off), for the metric.
func (p *Pacer) Current() int { return int(p.cur.Load()) }

// CollectorStats are the collector's totals since the process started, as
// the runtime counts them: its completed cycles and the CPU time it spent
// (the runtime's estimate, marking and sweeping by its workers, by the
// goroutines it made assist, and on idle processors). Operators read them
// beside process_cpu_seconds_total to see what a large state table costs
// in collection: a new job per frame grows the heap the collector marks.
type CollectorStats struct {
	Cycles     uint64
	CPUSeconds float64
}

// The runtime/metrics the stats are read from.
const (
	cyclesMetric = "/gc/cycles/total:gc-cycles"
	gcCPUMetric  = "/cpu/classes/gc/total:cpu-seconds"
)

// ReadCollectorStats reads the collector's totals; a runtime without one
// of the metrics reports it as 0.
func ReadCollectorStats() CollectorStats {
	s := []metrics.Sample{{Name: cyclesMetric}, {Name: gcCPUMetric}}
	metrics.Read(s)
	var st CollectorStats
	if s[0].Value.Kind() == metrics.KindUint64 {
		st.Cycles = s[0].Value.Uint64()
	}
	if s[1].Value.Kind() == metrics.KindFloat64 {
		st.CPUSeconds = s[1].Value.Float64()
	}
	return st
}
