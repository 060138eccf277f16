package gcpace

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestASmallHeapKeepsTheRuntimesDefault(t *testing.T) {
	for _, live := range []uint64{0, 1 << 20, SmallHeap} {
		if got := Percent(live); got != DefaultPercent {
			t.Errorf("Percent(%d) = %d, want the default %d", live, got, DefaultPercent)
		}
	}
}

func TestTheHeadroomIsHeldAtSmallHeapThenAtMinPercent(t *testing.T) {
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{SmallHeap + 1, 95},     // just past it: the headroom stays at SmallHeap, rounded down
		{2 * SmallHeap, 50},     // 64 MiB live, 32 MiB of headroom
		{5 * SmallHeap / 2, 40}, // 80 MiB: 32 MiB is 40 %
		{100 << 20, MinPercent}, // 100,000 workloads and more: never below MinPercent
		{8 << 30, MinPercent},
	} {
		if got := Percent(tc.live); got != tc.want {
			t.Errorf("Percent(%d MiB) = %d, want %d", tc.live>>20, got, tc.want)
		}
		if headroom := uint64(Percent(tc.live)) * tc.live / 100; headroom > SmallHeap && Percent(tc.live) != MinPercent {
			t.Errorf("at %d MiB live the headroom is %d MiB, past SmallHeap", tc.live>>20, headroom>>20)
		}
	}
}

// pacer returns a pacer over a live heap the test sets, recording what it
// sets.
func pacer(gogc string) (*Pacer, *uint64, *[]int) {
	live, sets := new(uint64), new([]int)
	p := newPacer(gogc, func() uint64 { return *live }, func(n int) int { *sets = append(*sets, n); return 0 })
	return p, live, sets
}

func TestTheStepSetsThePercentOnlyWhenItChanges(t *testing.T) {
	p, live, sets := pacer("")
	if p.Current() != DefaultPercent {
		t.Fatalf("a fresh pacer reports %d", p.Current())
	}
	*live = 1 << 20
	p.Step()
	*live = 100 << 20
	p.Step()
	p.Step()
	*live = 101 << 20
	p.Step()
	*live = 1 << 20
	p.Step()
	if want := []int{MinPercent, DefaultPercent}; len(*sets) != 2 || (*sets)[0] != want[0] || (*sets)[1] != want[1] {
		t.Errorf("set %v, want %v: once per change", *sets, want)
	}
	if p.Current() != DefaultPercent {
		t.Errorf("Current = %d", p.Current())
	}
}

func TestAnOperatorsGOGCWins(t *testing.T) {
	for gogc, want := range map[string]int{"200": 200, "off": -1, "50": 50} {
		p, live, sets := pacer(gogc)
		*live = 1 << 30
		p.Step()
		if len(*sets) != 0 || p.Current() != want {
			t.Errorf("GOGC=%s: set %v, Current %d, want nothing set and %d", gogc, *sets, p.Current(), want)
		}
	}
}

func TestTheLiveHeapIsReadFromTheRuntime(t *testing.T) {
	keep := make([]byte, 8<<20)
	debug.FreeOSMemory() // a collection, so the live bytes are counted
	if got := liveHeap(); got < uint64(len(keep)) {
		t.Errorf("live heap %d bytes with %d held", got, len(keep))
	}
	keep[0] = 1
}

func TestOffLeavesTheCollectorAlone(t *testing.T) {
	p := Off()
	p.live = func() uint64 { return 1 << 30 }
	p.set = func(int) int { t.Error("a test's pacer changed the collector"); return 0 }
	p.Step()
}

func TestTheCollectorsTotalsCountACollection(t *testing.T) {
	before := ReadCollectorStats()
	runtime.GC()
	after := ReadCollectorStats()
	if after.Cycles <= before.Cycles {
		t.Errorf("cycles %d after a collection, %d before: want more", after.Cycles, before.Cycles)
	}
	if after.CPUSeconds <= 0 {
		t.Errorf("the collector's CPU is %v after a collection, want above 0", after.CPUSeconds)
	}
}
