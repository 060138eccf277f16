package pairbroker

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// LineMax is the longest line PAIR's broker reads from its workload
// manager's stdout, newline included: a longer line stops its reader for
// the rest of the process's life (its workload manager's reader, as
// ../shared/upstream/NOTICE.md sums it up). The daemon's --broker-line-max
// defaults to it.
const LineMax = 256 << 10

// ErrLineTooLong is ReadLines' error for a line over LineMax.
var ErrLineTooLong = fmt.Errorf("a line over %d bytes: PAIR's broker stops reading the workload manager's stdout for good", LineMax)

// ReadLines calls fn with each line of r, its newline (and a carriage
// return before it) removed, as PAIR's broker reads its workload manager's
// stdout, until r ends (nil) or a line is longer than LineMax
// (ErrLineTooLong): after that, nothing more of r is read, as PAIR's reader
// has stopped. fn must not keep the slice.
func ReadLines(r io.Reader, fn func(line []byte)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), LineMax)
	for sc.Scan() {
		fn(sc.Bytes())
	}
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		return ErrLineTooLong
	}
	return sc.Err()
}
