//go:build !race

package ingressmark

const raceEnabled = false
