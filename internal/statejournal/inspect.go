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
// what the file's first line is: a file whose header is damaged and which
// holds no valid record is not a journal.
func Inspect(path string, maxRecordBytes int, record func(off int64, payload []byte) error, damage func(Damage) error) (string, error) {
	if maxRecordBytes == 0 {
		maxRecordBytes = DefaultMaxRecordBytes
	}
	if maxRecordBytes < 0 || maxRecordBytes > maxRecordLimit {
		return "", fmt.Errorf("statejournal: a record bound of %d outside 1..%d", maxRecordBytes, maxRecordLimit)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("statejournal: %s is not a regular file (%s)", path, st.Mode().Type())
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
		return "", fmt.Errorf("statejournal: reading %s: %w", path, err)
	}
	if hs == headerDamaged && records == 0 {
		hs = headerBad
	}
	return hs.String(), nil
}
