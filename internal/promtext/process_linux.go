package promtext

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// The process_* metrics in the names every Prometheus client library
// gives them, read from /proc as they read it, so the dashboards written
// for those work unchanged. Linux only: elsewhere the families are absent
// (process_other.go).

// userHZ is the kernel's clock tick for /proc's times (USER_HZ): 100 on
// every Linux architecture Go supports, and what the Prometheus clients
// assume too.
const userHZ = 100

// WriteProcessMetrics renders the process_* families. A file that cannot
// be read leaves its families out rather than reporting a wrong zero.
func WriteProcessMetrics(t *Text) {
	if st, ok := readSelfStat(); ok {
		t.Single("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", float64(st.utime+st.stime)/userHZ)
		if boot, ok := bootTime(); ok {
			t.Single("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", float64(boot)+float64(st.starttime)/userHZ)
		}
		t.Single("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", float64(st.vsize))
		t.Single("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", float64(st.rss*int64(os.Getpagesize())))
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		t.Single("process_open_fds", "gauge", "Number of open file descriptors.", float64(len(fds)))
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		t.Single("process_max_fds", "gauge", "Maximum number of open file descriptors.", float64(lim.Cur))
	}
}

// selfStat holds the fields of /proc/self/stat the metrics use.
type selfStat struct {
	utime, stime, starttime int64 // clock ticks
	vsize                   int64 // bytes
	rss                     int64 // pages
}

// readSelfStat parses /proc/self/stat (proc(5)). The command name, field
// 2, is in parentheses and may hold spaces and parentheses itself, so the
// fields are counted from the last ')'.
func readSelfStat() (selfStat, bool) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return selfStat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return selfStat{}, false
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, state
	field := func(n int) (int64, bool) { // n: proc(5)'s 1-based field number
		if n-3 >= len(f) {
			return 0, false
		}
		v, err := strconv.ParseInt(f[n-3], 10, 64)
		return v, err == nil
	}
	var st selfStat
	ok := true
	for _, x := range []struct {
		n   int
		dst *int64
	}{{14, &st.utime}, {15, &st.stime}, {22, &st.starttime}, {23, &st.vsize}, {24, &st.rss}} {
		v, good := field(x.n)
		*x.dst, ok = v, ok && good
	}
	return st, ok
}

// bootTime is the btime line of /proc/stat: the boot, in seconds since the
// epoch, which a process's start time in ticks counts from.
func bootTime() (int64, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
