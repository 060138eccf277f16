//go:build !race

package statetable

const raceEnabled = false
