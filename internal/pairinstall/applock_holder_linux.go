//go:build linux

package pairinstall

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// lockHolder returns the pid of the process holding flock's lock on path,
// as the kernel tells it in /proc/locks (the line whose device and inode
// are the file's), or 0 when it does not say. The kernel's answer, unlike
// the pid a daemon wrote into the file, cannot be stale.
func lockHolder(path string) int {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer f.Close()
	return holderIn(bufio.NewScanner(f), fileID(uint64(st.Dev), st.Ino))
}

// fileID is a file's device and inode as /proc/locks spells them:
// MAJOR:MINOR:INODE, the device numbers in hex.
func fileID(dev, ino uint64) string {
	major := (dev>>8)&0xfff | (dev>>32)&^0xfff
	minor := dev&0xff | (dev>>12)&^0xff
	return fmt.Sprintf("%02x:%02x:%d", major, minor, ino)
}

// holderIn returns the pid of the first FLOCK line of /proc/locks for the
// file id, or 0. A line reads "1: FLOCK  ADVISORY  WRITE 24535
// 08:01:1234567 0 EOF"; a waiter's line ("1: -> FLOCK ...") is skipped,
// since a waiter holds nothing.
func holderIn(sc *bufio.Scanner, id string) int {
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != id {
			continue
		}
		if pid, err := strconv.Atoi(fields[4]); err == nil && pid > 0 {
			return pid
		}
	}
	return 0
}

// holderHint says how an operator finds a holder the kernel did not name.
func holderHint(path string) string {
	return "the kernel does not name it; find it with: fuser " + path
}
