package workloadstore

import "time"

// SetClock sets the store's clock. It is compiled into PAIR's package only
// through go build's -overlay, by internal/dev/pairshadow: the store reads the
// time from a field its own tests set, and a shadow driven beside the
// model must read the model's clock, or the staleness sweep and the replay
// window would judge two different instants. No file of PAIR's is changed.
func (s *Store) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}
