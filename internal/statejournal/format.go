package statejournal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// header opens every journal file: the format's name and version on a line
// of its own, so `head -1` tells what the file is.
const header = "nvpair-statejournal v1\n"

// frameHeader is the bytes before each payload: its length and its checksum,
// both 4-byte little-endian.
const frameHeader = 8

// DefaultMaxRecordBytes is the longest payload when Options.MaxRecordBytes is
// 0: far above one run's state, far below what a corrupt length could ask
// Open to allocate.
const DefaultMaxRecordBytes = 2 << 20

// maxRecordLimit is the largest MaxRecordBytes Open accepts: a length must fit
// the 4-byte field, and a bound of a GiB is already no bound worth having.
const maxRecordLimit = 1 << 30

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum is the CRC32-C of a record's length field and payload. The length
// is covered too so that a run of zero bytes (what some file systems leave at
// the end of a file after a crash) is not read as a series of valid empty
// records, and so that a damaged length is caught even when the bytes it
// points at happen to look like a record.
func checksum(lenField []byte, payload []byte) uint32 {
	return crc32.Update(crc32.Checksum(lenField, castagnoli), castagnoli, payload)
}

// appendFrame appends payload framed as a record to b.
func appendFrame(b []byte, payload []byte) []byte {
	var h [frameHeader]byte
	binary.LittleEndian.PutUint32(h[:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[4:], checksum(h[:4], payload))
	b = append(b, h[:]...)
	return append(b, payload...)
}

// headerState says what the start of a file held.
type headerState int

const (
	headerGood headerState = iota // the header, whole
	headerTorn                    // a strict prefix of it (an empty file too): a creation cut short
	headerBad                     // anything else: not a journal of this version
)

// scanResult is what a scan of a journal file found.
type scanResult struct {
	header  headerState
	records [][]byte
	good    int64  // bytes from the start through the last good record
	damage  string // why the scan stopped before the end; "" if it did not
}

// scan decodes a journal file of size bytes from r. It stops at the first
// record that is not whole and valid, and says why; good is then where the
// file should be cut. A record's length is checked against maxRecord and
// against the bytes left in the file before its payload is allocated, so a
// corrupt or hostile length costs nothing.
func scan(r io.Reader, size int64, maxRecord int) scanResult {
	br := bufio.NewReaderSize(r, 64<<10)
	var res scanResult
	if hs := readHeader(br, size); hs != headerGood {
		res.header = hs
		return res
	}
	res.good = int64(len(header))
	for res.good < size {
		payload, why := readRecord(br, size-res.good, maxRecord)
		if why != "" {
			res.damage = why
			return res
		}
		res.records = append(res.records, payload)
		res.good += int64(frameHeader + len(payload))
	}
	return res
}

// readHeader reads and classifies the header line.
func readHeader(br *bufio.Reader, size int64) headerState {
	n := int64(len(header))
	if size < n {
		n = size
	}
	got := make([]byte, n)
	if _, err := io.ReadFull(br, got); err != nil {
		return headerBad
	}
	if string(got) != header[:n] {
		return headerBad
	}
	if n < int64(len(header)) {
		return headerTorn
	}
	return headerGood
}

// readRecord reads one record with left bytes remaining in the file, or says
// why it cannot.
func readRecord(br *bufio.Reader, left int64, maxRecord int) ([]byte, string) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return nil, "a record header cut short: " + err.Error()
	}
	n := binary.LittleEndian.Uint32(h[:4])
	if uint64(n) > uint64(maxRecord) {
		return nil, fmt.Sprintf("a record length of %d bytes, over the %d-byte bound", n, maxRecord)
	}
	if int64(n) > left-frameHeader {
		return nil, fmt.Sprintf("a record of %d bytes with %d left in the file", n, left-frameHeader)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(br, payload); err != nil {
		return nil, "reading a record: " + err.Error()
	}
	if checksum(h[:4], payload) != binary.LittleEndian.Uint32(h[4:]) {
		return nil, "a record whose checksum does not match"
	}
	return payload, ""
}

// ErrTooLarge is returned by Append for a payload over Options.MaxRecordBytes.
var ErrTooLarge = errors.New("statejournal: record over the size bound")
