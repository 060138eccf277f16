package main

import (
	"os"
	"runtime/debug"
)

// memoryBudget is the memory the daemon aims to stay within for a re-sync
// set of maxLive workloads: 64 MiB for the runtime, the connections and the
// queues, and 1 KiB per workload (an entry holds its re-assertion line,
// typically under 500 bytes, and under 400 bytes of keys and indexes).
func memoryBudget(maxLive int) int64 { return 64<<20 + 1024*int64(maxLive) }

// applyMemoryLimit sets the Go runtime's soft memory limit to the budget,
// unless the operator set GOMEMLIMIT. Without it the collector lets the heap
// grow to twice the live data before it runs, so a node holding a large set
// would use twice the memory it needs; with it, the collector runs as often
// as it takes to stay under the budget while the live data fits, and never
// refuses an allocation (the limit is soft). It returns the limit in force.
func applyMemoryLimit(maxLive int) int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1) // -1 reads the limit without changing it
	}
	limit := memoryBudget(maxLive)
	debug.SetMemoryLimit(limit)
	return limit
}
