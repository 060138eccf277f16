//go:build unix && !linux && !darwin

package main

// inForeground is false where the terminal's foreground group is not
// asked: every signal is forwarded.
func inForeground() bool { return false }
