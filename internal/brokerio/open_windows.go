//go:build windows

package brokerio

import (
	"fmt"
	"io"
	"os"
)

// Open opens the broker's named pipe (\\.\pipe\...) as a file: the broker
// creates the pipe, and a client end of a named pipe is an ordinary handle.
func Open(path string) (io.ReadWriteCloser, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open broker pipe %s: %w", path, err)
	}
	return f, nil
}
