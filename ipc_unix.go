//go:build !windows

package main

import (
	"fmt"
	"io"
	"net"
)

// openIPC dials the broker's Unix domain socket.
func openIPC(path string) (io.ReadWriteCloser, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial broker socket %s: %w", path, err)
	}
	return c, nil
}
