package procstat

import (
	"os"
	"testing"
	"time"
)

// utime and stime are fields 14 and 15, counted after the command's last
// ')': a command holding spaces and parentheses does not shift them.
func TestParseCPUCountsFieldsAfterTheCommandsLastParen(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
	for _, line := range []string{
		"4242 (nvpair (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 123 456 789\n",
		"4242 (odd) name (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0\n",
	} {
		if got, err := ParseCPU([]byte(line)); err != nil || got != 3*time.Second {
			t.Errorf("ParseCPU(%q) = %s, %v; want 300 ticks = 3s", line, got, err)
		}
	}
	for _, bad := range []string{"4242 (x) S 1 2", "4242 (x S 1"} {
		if _, err := ParseCPU([]byte(bad)); err == nil {
			t.Errorf("ParseCPU(%q) read a line it cannot", bad)
		}
	}
}

func TestCPUReadsThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	if _, err := CPU(os.Getpid()); err != nil {
		t.Fatal(err)
	}
}
