//go:build !windows

package brokerio

import (
	"fmt"
	"io"
	"net"
)

// Open dials the broker's Unix domain socket.
func Open(path string) (io.ReadWriteCloser, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial broker socket %s: %w", path, err)
	}
	return c, nil
}
