package ownjournal

import (
	"fmt"
	"hash/crc32"
	"strconv"
)

func crc(s string) uint32  { return crc32.Checksum([]byte(s), castagnoli) }
func hex8(v uint32) string { return fmt.Sprintf("%08x", v) }
func itoa(n int) string    { return strconv.Itoa(n) }
