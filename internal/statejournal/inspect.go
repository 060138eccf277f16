package statejournal

import (
	"fmt"
	"os"
)

// String names what a file's first line is, as Inspect reports it.
func (h headerState) String() string {
	switch h {
	case headerGood:
		return "good (" + header[:len(header)-1] + ")"
	case headerTorn:
		return "torn: a creation cut short before its header was whole"
	case headerOther:
		return "another version of the format"
	case headerDamaged:
		return "damaged"
	}
	return "not a journal"
}

// Inspect reads the journal file at path as Open would, without changing
// it: record gets each valid record (its offset and payload, valid only
// during the call) and damage each damaged region, in file order.
// maxRecordBytes is Options.MaxRecordBytes (0: the default). It returns
// whether the file is a journal of this version (one whose header is
// damaged is, if it holds a valid record; Open would take its records),
// and what its first line is.
func Inspect(path string, maxRecordBytes int, record func(off int64, payload []byte) error, damage func(Damage) error) (journal bool, header string, err error) {
	if maxRecordBytes == 0 {
		maxRecordBytes = DefaultMaxRecordBytes
	}
	if maxRecordBytes < 0 || maxRecordBytes > maxRecordLimit {
		return false, "", fmt.Errorf("statejournal: a record bound of %d outside 1..%d", maxRecordBytes, maxRecordLimit)
	}
	f, err := os.Open(path)
	if err != nil {
		return false, "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, "", err
	}
	if !st.Mode().IsRegular() {
		return false, "", fmt.Errorf("statejournal: %s is not a regular file (%s)", path, st.Mode().Type())
	}
	records := 0
	v := visitor{
		record: func(off int64, frame []byte) error {
			records++
			return record(off, frame[frameHeader:])
		},
		damage: damage,
	}
	hs, err := scan(f, st.Size(), maxRecordBytes, v)
	if err != nil {
		return false, "", fmt.Errorf("statejournal: reading %s: %w", path, err)
	}
	if hs == headerDamaged && records == 0 {
		hs = headerBad
	}
	return hs == headerGood || hs == headerDamaged || hs == headerTorn, hs.String(), nil
}
