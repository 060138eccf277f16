package peerwire

import "time"

// ServerIdleTimeout is how long the peer server keeps an idle connection.
// ClientIdleTimeout is shorter, so a sender always closes an idle
// connection before the server does and never sends a request onto a
// connection the server is closing.
const (
	ServerIdleTimeout = 120 * time.Second
	ClientIdleTimeout = ServerIdleTimeout / 2
)
