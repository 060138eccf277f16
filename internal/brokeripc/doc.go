// Package brokeripc opens the daemon's local channel when the broker gives
// it as a socket (--ipc) rather than as the daemon's stdin and stdout: a
// Unix domain socket, or on Windows a named pipe opened as a file. It owns
// only the opening; what goes over the channel is the root's. It must
// never import another package of this module.
package brokeripc
