//go:build !linux

package promtext

// WriteProcessMetrics renders nothing off Linux: the process_* families
// are read from /proc (process_linux.go) and are absent elsewhere.
func WriteProcessMetrics(*Text) {}
