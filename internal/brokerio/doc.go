// Package brokerio owns the daemon's channel up to its broker: the Writer
// that gives every frame written up (an ingress post, a peer's frame, a
// lease's expiry, an answer to the broker, the daemon's notifications) its
// place in one order and writes the frames that are ready together in one
// Write (group commit, spec 3.1 and 6); the Waiters that bound the
// requests of each channel waiting on that write (spec 7.1); and the
// LineLog that counts the broker's bad lines by kind and rate-limits
// their warnings. Open opens the channel when the broker gives it as a
// socket (--ipc) rather than as the daemon's stdin and stdout: a Unix
// domain socket, or on Windows a named pipe opened as a file.
//
// It may import the standard library and this module's wireframe,
// httpguard, promtext and ratelog. It must never import the daemon
// (package main), the peer packages, the ingress or the state table.
package brokerio
