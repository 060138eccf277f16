package statejournal

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// fuzzMax is the record bound under fuzzing: small, so lengths over it are
// easy to reach.
const fuzzMax = 64

// FuzzOpen opens arbitrary bytes as a journal file: Open never panics, never
// fails on a regular file, returns exactly the records an independent
// decoder finds on both sides of any damage, never more bytes of records
// than the file holds, leaves the file holding exactly those records (and
// the zeros after them, its end), and keeps a file whose damage valid
// records follow, byte for byte.
func FuzzOpen(f *testing.F) {
	f.Add([]byte(header))
	f.Add(encode([]byte("a"), []byte(""), []byte("ccc")))
	f.Add(append(encode([]byte("a")), 0, 0, 0, 0, 0, 0, 0, 0))
	f.Add(binary.LittleEndian.AppendUint32([]byte(header), 1<<30))
	mid := encode([]byte("a"), []byte("bb"), []byte("ccc"))
	mid[len(header)+frameHeader+1+3] ^= 0x10
	f.Add(mid)
	hdr := encode([]byte("a"))
	hdr[3] ^= 0xff
	f.Add(hdr)
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
		j, recs, err := openCollect(path, opt)
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
		kept, _ := filepath.Glob(path + ".damaged-*")
		for _, k := range kept {
			b := fileBytesOrNil(k)
			os.Remove(k)
			if !bytes.Equal(b, file) {
				t.Fatalf("the damaged file kept as %s is not the file as it was", k)
			}
		}
		want, ok, crossed := refDecode(file)
		if !ok {
			want = nil
		}
		if len(kept) != map[bool]int{true: 1, false: 0}[ok && crossed] {
			t.Fatalf("%d damaged files kept; the reference decoder crossed damage: %v", len(kept), ok && crossed)
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
		// Zeros after the last record are the file's end (the writer's
		// preallocation, a crash's zeros), kept as they are.
		if kept, after := encode(recs...), fileBytesOrNil(path); size != int64(len(kept)) || len(after) < len(kept) ||
			!bytes.Equal(after[:len(kept)], kept) || !allZero(after[len(kept):]) {
			t.Fatalf("the file after Open is not its header and the %d records kept, then zeros or nothing", len(recs))
		}
	})
}

// refDecode decodes a journal file by the format's definition, written
// apart from scan: after a bad record it moves on one byte at a time until
// a valid one. ok is false if the file is not a journal: a header that is
// not whole, another version's, or a damaged one that no valid record
// follows. crossed says damage was followed by a valid record.
func refDecode(b []byte) (recs [][]byte, ok, crossed bool) {
	good := bytes.HasPrefix(b, []byte(header))
	if !good && (len(b) < len(header) || regexp.MustCompile(`^nvpair-statejournal v[0-9]+\n`).Match(b)) {
		return nil, false, false
	}
	bad := !good
	for b = b[len(header):]; len(b) >= 8; {
		n := binary.LittleEndian.Uint32(b)
		if n <= fuzzMax && uint64(n) <= uint64(len(b)-8) {
			sum := crc32.Checksum(b[:4], castagnoli)
			sum = crc32.Update(sum, castagnoli, b[8:8+n])
			if sum == binary.LittleEndian.Uint32(b[4:]) {
				recs = append(recs, b[8:8+n])
				b = b[8+n:]
				crossed = crossed || bad
				continue
			}
		}
		bad = true
		b = b[1:]
	}
	if !good && len(recs) == 0 {
		return nil, false, false
	}
	return recs, true, crossed
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
