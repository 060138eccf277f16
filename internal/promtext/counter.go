package promtext

import (
	"slices"
	"sync"
	"sync/atomic"
)

// CounterVec is a family of counters told apart by label values. The set
// of label values is bounded by the callers (known methods, status codes).
type CounterVec struct {
	mu     sync.RWMutex // guards series; a leaf lock
	series map[string]*LabelledCounter
}

type LabelledCounter struct {
	values []string
	n      atomic.Uint64
}

func NewCounterVec() *CounterVec { return &CounterVec{series: map[string]*LabelledCounter{}} }

// Inc adds one to the counter with these label values.
// It is on every frame's path: a series that exists is found under the
// read lock with a key built on the stack, with no allocation; only a new
// series takes the write lock and copies its values.
func (v *CounterVec) Inc(values ...string) {
	var stack [128]byte
	key := appendSeriesKey(stack[:0], values)
	v.mu.RLock()
	c := v.series[string(key)]
	v.mu.RUnlock()
	if c == nil {
		c = v.add(string(key), values)
	}
	c.n.Add(1)
}

// add returns the series for key, making it if no caller has yet.
func (v *CounterVec) add(key string, values []string) *LabelledCounter {
	v.mu.Lock()
	defer v.mu.Unlock()
	c := v.series[key]
	if c == nil {
		c = &LabelledCounter{values: slices.Clone(values)}
		v.series[key] = c
	}
	return c
}

// appendSeriesKey appends the key of a series: its label values, each
// followed by a NUL.
func appendSeriesKey(dst []byte, values []string) []byte {
	for _, val := range values {
		dst = append(append(dst, val...), 0)
	}
	return dst
}

// Get returns the counter's value, for tests.
func (v *CounterVec) Get(values ...string) uint64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if c := v.series[string(appendSeriesKey(nil, values))]; c != nil {
		return c.n.Load()
	}
	return 0
}

// Snapshot returns the series sorted by label values.
func (v *CounterVec) Snapshot() []*LabelledCounter {
	v.mu.Lock()
	out := make([]*LabelledCounter, 0, len(v.series))
	for _, c := range v.series {
		out = append(out, c)
	}
	v.mu.Unlock()
	slices.SortFunc(out, func(a, b *LabelledCounter) int { return slices.Compare(a.values, b.values) })
	return out
}

// Touch creates the counter with these label values, at zero, when it
// does not exist yet.
func (v *CounterVec) Touch(values ...string) {
	v.add(string(appendSeriesKey(nil, values)), values)
}
