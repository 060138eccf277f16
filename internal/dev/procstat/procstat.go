// Package procstat reads a process's CPU time from Linux's /proc, for the
// benchmarks (cmd/wlmbench, cmd/devcluster scale): on a shared machine CPU
// per unit of work is steadier than a rate, as it does not depend on how
// much of the CPU the process was given. It imports nothing of this module
// and no network package.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/<pid>/stat's utime and stime: USER_HZ, 100
// on every Linux platform Go supports.
const userHZ = 100

// CPU is the CPU time (user and system) pid has used.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return ParseCPU(b)
}

// ParseCPU reads utime and stime (fields 14 and 15) of a /proc/<pid>/stat
// line. The command (field 2) is in parentheses and may hold spaces and
// parentheses itself: the fields are counted after its last ')'.
func ParseCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no command field")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): utime is field 14, f[11]; stime f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command, want at least 13", len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc stat: %w", err)
	}
	return time.Duration(ut+st) * time.Second / userHZ, nil
}
