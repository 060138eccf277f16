package statejournal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// header opens every journal file: the format's name and version on a line
// of its own, so `head -1` tells what the file is.
const header = "nvpair-statejournal v1\n"

// headerName is the header without its version: a file that starts with it,
// then digits and a newline, is a journal of another version.
const headerName = "nvpair-statejournal v"

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
// records, so that a damaged length is caught even when the bytes it
// points at happen to look like a record, and so that the search for the
// next record after damage (resync) finds a false one at an offset only
// with a chance of 2^-32.
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
	headerGood    headerState = iota // the header, whole
	headerTorn                       // a strict prefix of it (an empty file too): a creation cut short
	headerOther                      // the header of another version of the format
	headerBad                        // shorter than a header and not a prefix of it: not a journal
	headerDamaged                    // a header's length of other bytes: damage, or not a journal at all
)

// Damage is one damaged region of a journal file: the bytes from Offset to
// End hold no valid record, and a valid record (or the end of the file, or
// the zeros that end it) starts at End.
type Damage struct {
	Offset, End int64
	// Reason says why the record at Offset is not valid.
	Reason string
	// Records is how many records the region held: the hops of its own
	// length fields from Offset when they lead exactly to End
	// (RecordsExact), else 1, the least a region of damage costs. A
	// region that is the damaged header alone held none.
	Records      int
	RecordsExact bool
	// Tail: the region runs to the end of the file and nothing valid
	// follows it: a write cut short (a torn tail), or damage at the end.
	Tail bool
	// Unsearched: the search for the next valid record spent its budget
	// (resyncBudget) before the end of the file; the region runs to the
	// end, and valid records may lie in it.
	Unsearched bool
}

// Bytes is the region's length.
func (d Damage) Bytes() int64 { return d.End - d.Offset }

// visitor receives what a scan finds, in file order. frame is a record's
// frame header and payload, valid only during the call.
type visitor struct {
	record func(off int64, frame []byte) error
	damage func(d Damage) error
}

// scanChunk is what the scanner reads at once.
const scanChunk = 1 << 20

// resyncBudget bounds the bytes the search for the next record after
// damage may checksum, for a file of size bytes. An offset whose length
// field is impossible costs no checksum; one whose length is possible
// costs a checksum of up to MaxRecordBytes, so a file crafted to make
// every offset plausible would otherwise cost size times MaxRecordBytes.
// CRC32-C runs at over 10 GB/s, so the budget costs at most a few seconds
// for the largest journal compaction allows, and far less for damage met
// by chance, which is crossed within a record or two.
func resyncBudget(size int64) int64 { return 8*size + 64<<20 }

// scanner reads a journal file through a window of it: a record's frame is
// a slice of the window, so reading costs no allocation per record, and
// the memory held is one window (scanChunk, or one record at the bound).
type scanner struct {
	r      io.ReaderAt
	size   int64
	max    int64
	buf    []byte // the file's bytes from base
	base   int64
	budget int64 // bytes the resync may still checksum
}

func newScanner(r io.ReaderAt, size int64, maxRecord int) *scanner {
	return &scanner{r: r, size: size, max: int64(maxRecord), budget: resyncBudget(size)}
}

// at returns the n bytes of the file at off, valid until the next call.
// The caller has checked that they are in the file.
func (s *scanner) at(off int64, n int64) ([]byte, error) {
	if off >= s.base && off+n <= s.base+int64(len(s.buf)) {
		i := off - s.base
		return s.buf[i : i+n], nil
	}
	want := min(max(n, scanChunk), s.size-off)
	if int64(cap(s.buf)) < want {
		s.buf = make([]byte, want)
	}
	s.buf = s.buf[:want]
	got, err := s.r.ReadAt(s.buf, off)
	if int64(got) < want {
		s.buf, s.base = s.buf[:0], 0
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the file shrank while it was read
		}
		return nil, fmt.Errorf("reading %d bytes at %d: %w", want, off, err)
	}
	s.base = off
	return s.buf[:n], nil
}

// recordAt returns the frame of the record at off, or why there is no
// valid record there. err is a failure to read, not damage. A length is
// checked against the bound and against the bytes left before anything is
// read for it, so a damaged or hostile length costs nothing.
func (s *scanner) recordAt(off int64) (frame []byte, why string, err error) {
	left := s.size - off
	if left < frameHeader {
		return nil, fmt.Sprintf("a record header cut short: %d bytes at the end of the file", left), nil
	}
	h, err := s.at(off, frameHeader)
	if err != nil {
		return nil, "", err
	}
	n := int64(binary.LittleEndian.Uint32(h[:4]))
	if n > s.max {
		return nil, fmt.Sprintf("a record length of %d bytes, over the %d-byte bound", n, s.max), nil
	}
	if n > left-frameHeader {
		return nil, fmt.Sprintf("a record of %d bytes with %d left in the file", n, left-frameHeader), nil
	}
	frame, err = s.at(off, frameHeader+n)
	if err != nil {
		return nil, "", err
	}
	if checksum(frame[:4], frame[frameHeader:]) != binary.LittleEndian.Uint32(frame[4:frameHeader]) {
		return nil, "a record whose checksum does not match", nil
	}
	return frame, "", nil
}

// zeroRun returns where the run of zero bytes that starts at off ends: the
// offset of the first byte that is not zero, or the file's size.
func (s *scanner) zeroRun(off int64) (int64, error) {
	for off < s.size {
		n := min(scanChunk, s.size-off)
		b, err := s.at(off, n)
		if err != nil {
			return off, err
		}
		for i, c := range b {
			if c != 0 {
				return off + int64(i), nil
			}
		}
		off += n
	}
	return s.size, nil
}

// zeroHeader reports whether the frame header at off, which is in the
// file, is all zeros: never a record's, since a record's length and
// checksum are never both zero (an empty payload's checksum is not).
func (s *scanner) zeroHeader(off int64) (bool, error) {
	h, err := s.at(off, frameHeader)
	if err != nil {
		return false, err
	}
	return binary.LittleEndian.Uint64(h) == 0, nil
}

// zerosToEnd reports whether the file holds nothing but zeros from off,
// a record's place, to its end: the end of the records. The writer writes
// zeros ahead of its groups (preallocBytes), and a file system may leave
// zeros after the last record a crash cut short; neither is damage.
func (s *scanner) zerosToEnd(off int64) (bool, error) {
	if s.size-off >= frameHeader {
		// The common miss, a record's header, costs no scan.
		if zero, err := s.zeroHeader(off); err != nil || !zero {
			return false, err
		}
	}
	end, err := s.zeroRun(off)
	return end == s.size, err
}

// resync finds the first offset at or after from where a whole record's
// length and checksum check out. It says found false when there is none
// before the end of the file (next is then the file's size, or where the
// zeros that end it begin), and exhausted when it stopped at its budget
// (next is then where it stopped).
func (s *scanner) resync(from int64) (next int64, found, exhausted bool, err error) {
	for p := from; p+frameHeader <= s.size; p++ {
		h, err := s.at(p, frameHeader)
		if err != nil {
			return p, false, false, err
		}
		if binary.LittleEndian.Uint64(h) == 0 {
			// No record starts with a zero header: skip the run of zeros,
			// to the first offset whose header reaches past it (a record
			// may start at most 7 bytes before its first byte that is
			// not zero). Zeros to the end are the end.
			end, err := s.zeroRun(p)
			if err != nil {
				return p, false, false, err
			}
			if end == s.size {
				return p, false, false, nil // the zeros are the file's end, not damage
			}
			p = max(p, end-frameHeader)
			continue
		}
		n := int64(binary.LittleEndian.Uint32(h[:4]))
		if n > s.max || n > s.size-p-frameHeader {
			continue // impossible: no checksum needed
		}
		if n > s.budget {
			return p, false, true, nil
		}
		s.budget -= n
		frame, err := s.at(p, frameHeader+n)
		if err != nil {
			return p, false, false, err
		}
		if checksum(frame[:4], frame[frameHeader:]) == binary.LittleEndian.Uint32(frame[4:frameHeader]) {
			return p, true, false, nil
		}
	}
	return s.size, false, false, nil
}

// countRecords fills d.Records: it follows the region's length fields from
// its first record (after the header) and counts the hops when they lead
// exactly to its end.
func (s *scanner) countRecords(d *Damage) error {
	p := max(d.Offset, int64(len(header)))
	hops := 0
	for p < d.End {
		if d.End-p < frameHeader {
			d.Records, d.RecordsExact = 1, false
			return nil
		}
		h, err := s.at(p, 4)
		if err != nil {
			return err
		}
		n := int64(binary.LittleEndian.Uint32(h))
		if n > s.max || n > d.End-p-frameHeader {
			d.Records, d.RecordsExact = 1, false
			return nil
		}
		p += frameHeader + n
		hops++
	}
	d.Records, d.RecordsExact = hops, true
	return nil
}

// readHeader classifies the start of the file.
func (s *scanner) readHeader() (headerState, error) {
	n := min(s.size, int64(len(headerName)+24))
	b, err := s.at(0, n)
	if err != nil {
		return headerBad, err
	}
	switch {
	case bytes.HasPrefix(b, []byte(header)):
		return headerGood, nil
	case n < int64(len(header)) && string(b) == header[:n]:
		return headerTorn, nil
	case otherVersion(b):
		return headerOther, nil
	case n < int64(len(header)):
		return headerBad, nil
	}
	return headerDamaged, nil
}

// otherVersion reports whether b starts with the header line of another
// version of the format: the name, digits, a newline.
func otherVersion(b []byte) bool {
	rest, ok := bytes.CutPrefix(b, []byte(headerName))
	if !ok {
		return false
	}
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	return i > 0 && i < len(rest) && rest[i] == '\n'
}

// scan reads a journal file of size bytes from r and tells v each valid
// record and each damaged region, in file order. After a record that is
// not valid it searches forward for the next offset where a whole
// record's length and checksum check out (resync), so damage costs the
// records it hit and no more. A header that is neither this version's
// nor another's is taken as damage: the records after it are read as if
// it were whole; the caller decides, by whether any was valid, whether
// the file was a journal at all. err is a failure to read, or v's.
func scan(r io.ReaderAt, size int64, maxRecord int, v visitor) (headerState, error) {
	return newScanner(r, size, maxRecord).run(v)
}

// run is scan's work.
func (s *scanner) run(v visitor) (headerState, error) {
	size := s.size
	hs, err := s.readHeader()
	if err != nil || (hs != headerGood && hs != headerDamaged) {
		return hs, err
	}
	// start is where the damaged region being crossed began; -1 if none.
	start, why := int64(-1), ""
	if hs == headerDamaged {
		start, why = 0, "the header line is damaged"
	}
	off := int64(len(header))
	for off < size {
		frame, bad, err := s.recordAt(off)
		if err != nil {
			return hs, err
		}
		if bad != "" && start < 0 {
			end, err := s.zerosToEnd(off)
			if err != nil {
				return hs, err
			}
			if end {
				return hs, nil // the preallocated end, or a crash's zeros: no record, no damage
			}
		}
		if bad == "" {
			if start >= 0 {
				if err := s.emit(v, Damage{Offset: start, End: off, Reason: why}); err != nil {
					return hs, err
				}
				start = -1
				continue // the window moved: read the record again
			}
			if err := v.record(off, frame); err != nil {
				return hs, err
			}
			off += int64(len(frame))
			continue
		}
		if start < 0 {
			start, why = off, bad
		}
		next, found, exhausted, err := s.resync(off + 1)
		if err != nil {
			return hs, err
		}
		if !found {
			end := next // where the zeros that end the file begin, or its size
			if exhausted {
				end = size
			}
			d := Damage{Offset: start, End: end, Reason: why, Tail: !exhausted, Unsearched: exhausted}
			if exhausted {
				d.Reason += fmt.Sprintf("; the search for the next record stopped at %d, its budget spent", next)
			}
			return hs, s.emit(v, d)
		}
		off = next
	}
	if start >= 0 {
		// A damaged header and nothing after it.
		return hs, s.emit(v, Damage{Offset: start, End: size, Reason: why, Tail: true})
	}
	return hs, nil
}

// emit counts d's records and tells v.
func (s *scanner) emit(v visitor, d Damage) error {
	if err := s.countRecords(&d); err != nil {
		return err
	}
	return v.damage(d)
}

// ErrTooLarge is returned by Append for a payload over Options.MaxRecordBytes.
var ErrTooLarge = errors.New("statejournal: record over the size bound")
