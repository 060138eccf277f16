package statejournal

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
)

// fuzzMax is the record bound under fuzzing: small, so lengths over it are
// easy to reach.
const fuzzMax = 64

// FuzzOpen opens arbitrary bytes as a journal file: Open never panics, never
// fails on a regular file, returns exactly the records an independent
// decoder finds before the first bad one, never more bytes of records than
// the file holds, and leaves the file holding exactly those records.
func FuzzOpen(f *testing.F) {
	f.Add([]byte(header))
	f.Add(encode([]byte("a"), []byte(""), []byte("ccc")))
	f.Add(append(encode([]byte("a")), 0, 0, 0, 0, 0, 0, 0, 0))
	f.Add(binary.LittleEndian.AppendUint32([]byte(header), 1<<30))
	dir, err := os.MkdirTemp("", "statejournal-fuzz")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "state.journal")
	f.Fuzz(func(t *testing.T, file []byte) {
		// A fresh file each time: rewriting one in place with O_TRUNC makes
		// ext4 flush it on close (auto_da_alloc), some milliseconds a run.
		os.Remove(path)
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		opt, _ := options()
		opt.MaxRecordBytes = fuzzMax
		j, recs, err := Open(path, opt)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		size := j.Size()
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		asideFiles, _ := filepath.Glob(path + ".aside-*")
		for _, a := range asideFiles {
			os.Remove(a)
		}
		want, ok := refDecode(file)
		if !ok {
			want = nil
		}
		total := 0
		for _, r := range recs {
			total += len(r)
			if len(r) > fuzzMax {
				t.Fatalf("a record of %d bytes, over the bound %d", len(r), fuzzMax)
			}
		}
		if total > len(file) {
			t.Fatalf("%d bytes of records from a %d-byte file", total, len(file))
		}
		if !equalRecords(recs, want) {
			t.Fatalf("Open returned %q, the reference decoder %q", recs, want)
		}
		if kept := encode(recs...); size != int64(len(kept)) || !bytes.Equal(fileBytesOrNil(path), kept) {
			t.Fatalf("the file after Open is not exactly its header and the %d records kept", len(recs))
		}
	})
}

// refDecode decodes a journal file by the format's definition, written
// apart from scan: ok is false if the header is not whole.
func refDecode(b []byte) (recs [][]byte, ok bool) {
	if !bytes.HasPrefix(b, []byte(header)) {
		return nil, false
	}
	b = b[len(header):]
	for len(b) >= 8 {
		n := binary.LittleEndian.Uint32(b)
		if n > fuzzMax || uint64(n) > uint64(len(b)-8) {
			break
		}
		sum := crc32.Checksum(b[:4], castagnoli)
		sum = crc32.Update(sum, castagnoli, b[8:8+n])
		if sum != binary.LittleEndian.Uint32(b[4:]) {
			break
		}
		recs = append(recs, b[8:8+n])
		b = b[8+n:]
	}
	return recs, true
}

func equalRecords(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func fileBytesOrNil(path string) []byte {
	b, _ := os.ReadFile(path)
	return b
}
