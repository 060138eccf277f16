package wireframe

import "fmt"

// The workload bound: one workload frame's content, its params (the
// workloadInfo and any member beside it), is bounded on every path
// (--workload-max-bytes, issue 20).

const (
	// DefaultWorkloadMaxBytes bounds one frame's params. The real
	// producer's frames are under 2 KiB, and the Jobs list shows only the
	// fields the daemon knows; 16 KiB leaves a producer eight times that
	// for fields of its own and an error text.
	DefaultWorkloadMaxBytes = 16 << 10
	// MinWorkloadMaxBytes is the least --workload-max-bytes accepted: any
	// removal fits (its two fields are at most 1,538 bytes of JSON text
	// each, spec 3.2), and so does a lifecycle frame with the fields the
	// daemon knows at ordinary lengths.
	MinWorkloadMaxBytes = 4 << 10
	// MaxWorkloadMaxBytes is the most: no path takes a frame longer than
	// MaxBytes, so a larger bound could refuse nothing.
	MaxWorkloadMaxBytes = MaxBytes
)

// CheckWorkloadMaxBytes refuses a --workload-max-bytes outside its range.
func CheckWorkloadMaxBytes(n int) error {
	if n < MinWorkloadMaxBytes || n > MaxWorkloadMaxBytes {
		return fmt.Errorf("must be between %d and %d bytes", MinWorkloadMaxBytes, MaxWorkloadMaxBytes)
	}
	return nil
}

// WorkloadTooLargeError refuses a frame whose params are over the workload
// bound: a 413 on the ingress and the peer port (each batch element alike),
// a rate-limited warning on the local channel.
type WorkloadTooLargeError struct {
	Size, Limit int
}

func (e *WorkloadTooLargeError) Error() string {
	return fmt.Sprintf("params (the workload and the members beside it) are %d bytes, over their %d-byte bound (--workload-max-bytes)", e.Size, e.Limit)
}

// CheckWorkloadBytes refuses a scanned frame whose params are over limit
// bytes, and slack more (the peer port's peerwire.WorkloadSlack; the reason
// names the bound itself). What is measured is the params object's text as it arrived,
// whitespace and escapes included: the bytes the daemon relays and keeps,
// which the scan has already delimited, so the check costs a length and
// allocates nothing on the way through. A frame without params (or with
// params that are not an object) passes here and is refused by the checks
// that name what is missing.
func CheckWorkloadBytes(s *Scan, limit, slack int) error {
	if n := len(s.levels[levelParams].raw); n-slack > limit {
		return &WorkloadTooLargeError{Size: n, Limit: limit}
	}
	return nil
}
