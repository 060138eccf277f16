//go:build race

package statetable

// raceEnabled: the race detector drops a quarter of what sync.Pool is
// given, so an allocation count under it says nothing.
const raceEnabled = true
