//go:build linux

package pairinstall

import (
	"bufio"
	"strings"
	"testing"
)

func TestHolderInReadsTheFlockLineOfTheFileNotAWaiters(t *testing.T) {
	locks := `1: POSIX  ADVISORY  WRITE 111 08:01:42 0 EOF
2: FLOCK  ADVISORY  WRITE 222 08:01:99 0 EOF
2: -> FLOCK  ADVISORY  WRITE 333 08:01:42 0 EOF
3: FLOCK  ADVISORY  WRITE 444 08:01:42 0 EOF
`
	if got := holderIn(bufio.NewScanner(strings.NewReader(locks)), "08:01:42"); got != 444 {
		t.Errorf("holder %d, want 444 (the FLOCK line of 08:01:42; the POSIX lock and the waiter hold no flock)", got)
	}
	if got := holderIn(bufio.NewScanner(strings.NewReader(locks)), "08:02:42"); got != 0 {
		t.Errorf("holder %d of a file with no lock, want 0", got)
	}
	if got := fileID(0x801, 42); got != "08:01:42" {
		t.Errorf("fileID %q, want 08:01:42", got)
	}
}
