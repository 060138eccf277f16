//go:build !linux

package main

// writeProcessMetrics renders nothing off Linux: the process_* families
// are read from /proc (processmetrics_linux.go) and are absent elsewhere.
func writeProcessMetrics(*metricsText) {}
