// Package promtext is the daemon's metrics exposition: counters told apart
// by label values, the Prometheus text format (version 0.0.4) they are
// rendered in, and the process_* families read from /proc on Linux.
//
// It owns how a number is kept and written, never which numbers the daemon
// has: each component of the daemon keeps its own counts and renders its
// own families through a Text, and the root package's Manager.writeMetrics
// orders them into one page. It must never import another package of this
// module (the frame format, server protection, the PAIR installation), so
// that the exposition can change without touching what it exposes; it
// needs nothing but the standard library, and not net/http.
package promtext
