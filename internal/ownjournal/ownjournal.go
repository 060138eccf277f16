// Package ownjournal owns the workload manager's ownership journal on disk:
// its file format, its atomic write (temporary file, fsync, rename, fsync of
// the directory) and its bounded, checked decode. The journal is what lets a
// restarted daemon know which workloads its producers own, their leases and
// the removals they made (spec 3.5.3); what those mean is the relay's
// business, not this package's.
//
// It imports nothing of this module and never net/http: it is a file format
// and a write discipline, fuzzed alone (FuzzDecode).
package ownjournal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
)

// FileName is the journal's name in the app dir, beside node-id.json.
const FileName = "workload-manager-journal.json"

// DefaultMaxBytes bounds the journal file: 16 MiB holds the removal
// memory's 65,536 entries and some 100,000 owned workloads at typical id
// lengths.
const DefaultMaxBytes = 16 << 20

// magic opens the header line: the format's name and version.
const magic = "nvpair-wlm-journal v1"

// headerMax is the longest header line Decode accepts.
const headerMax = 96

// Owned is a workload a producer owns: it entered through the ingress.
// LeaseSeconds is 0 for an unleased one; LeaseDeadline is then 0 too.
type Owned struct {
	Origin, ID    string
	LeaseSeconds  int
	LeaseDeadline int64 // Unix milliseconds
}

// Removed is a producer's removal of a workload it owned, at At (Unix
// milliseconds).
type Removed struct {
	Origin, ID string
	At         int64
}

// State is what the journal holds.
type State struct {
	Owned   []Owned
	Removed []Removed // oldest first
}

// body is the JSON body: each entry an array, so an entry costs its
// strings and a few bytes.
type body struct {
	Owned   [][]json.RawMessage `json:"owned"`
	Removed [][]json.RawMessage `json:"removed"`
}

// entryOverhead is what an entry costs beside its strings, at most: quotes,
// brackets, commas and two 13-digit numbers.
const entryOverhead = 48

// Cost is the bytes an entry with these strings costs in the file at most,
// escapes aside: what a caller counts against the bound while it collects
// entries, so it copies no more than can be written.
func Cost(origin, id string) int { return len(origin) + len(id) + entryOverhead }

// MinCost is the least an entry costs (an empty origin, a one-byte id): a
// caller sizes its copies to the bound over it.
const MinCost = 1 + entryOverhead

// Encode renders s as a journal file of at most maxBytes. Entries are kept
// in priority order: owned ones in the order given, then removals newest
// first; those that would take the file past maxBytes are left out, and
// their number is returned. Removals kept stay oldest first in the file.
func Encode(s State, maxBytes int) (file []byte, omitted int) {
	budget := maxBytes - headerMax - len(`{"owned":[],"removed":[]}`) - 1
	var b bytes.Buffer
	b.Grow(min(maxBytes, 64<<10))
	b.WriteString(`{"owned":[`)
	for i, o := range s.Owned {
		mark := b.Len()
		if i > 0 {
			b.WriteByte(',')
		}
		appendEntry(&b, o.Origin, o.ID, int64(o.LeaseSeconds), o.LeaseDeadline)
		if b.Len()-mark > budget {
			b.Truncate(mark)
			omitted += len(s.Owned) - i
			break
		}
		budget -= b.Len() - mark
	}
	b.WriteString(`],"removed":[`)
	// The newest removals are the ones kept: find how many fit, newest
	// first, then write those oldest first.
	first := len(s.Removed)
	var scratch bytes.Buffer
	for i := len(s.Removed) - 1; i >= 0; i-- {
		scratch.Reset()
		r := s.Removed[i]
		appendEntry(&scratch, r.Origin, r.ID, r.At)
		if scratch.Len()+1 > budget {
			omitted += i + 1
			break
		}
		budget -= scratch.Len() + 1
		first = i
	}
	for i, r := range s.Removed[first:] {
		if i > 0 {
			b.WriteByte(',')
		}
		appendEntry(&b, r.Origin, r.ID, r.At)
	}
	b.WriteString("]}")
	out := fmt.Appendf(nil, "%s crc32c=%08x bytes=%d\n", magic, crc32.Checksum(b.Bytes(), castagnoli), b.Len())
	return append(out, b.Bytes()...), omitted
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func appendEntry(b *bytes.Buffer, origin, id string, nums ...int64) {
	b.WriteByte('[')
	appendString(b, origin)
	b.WriteByte(',')
	appendString(b, id)
	var n [20]byte
	for _, v := range nums {
		b.WriteByte(',')
		b.Write(strconv.AppendInt(n[:0], v, 10))
	}
	b.WriteByte(']')
}

// appendString writes s as a JSON string: as it is when it needs no
// escape (printable ASCII without a quote or backslash, as ids nearly
// always are), else as encoding/json escapes it.
func appendString(b *bytes.Buffer, s string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			b.Write(q)
			return
		}
	}
	b.WriteByte('"')
	b.WriteString(s)
	b.WriteByte('"')
}

// Decode reads a journal file of at most maxBytes. Anything but a whole
// file as Encode wrote it, a valid header, its length and checksum, and a
// body of well-formed entries, is an error: the caller starts fresh.
func Decode(file []byte, maxBytes int) (State, error) {
	if len(file) > maxBytes {
		return State{}, fmt.Errorf("%d bytes, over its %d-byte bound", len(file), maxBytes)
	}
	nl := bytes.IndexByte(file, '\n')
	if nl < 0 || nl > headerMax {
		return State{}, errors.New("no header line")
	}
	var sum uint32
	var n int
	hdr := string(file[:nl])
	if _, err := fmt.Sscanf(hdr, magic+" crc32c=%08x bytes=%d", &sum, &n); err != nil || hdr != fmt.Sprintf("%s crc32c=%08x bytes=%d", magic, sum, n) {
		return State{}, fmt.Errorf("header %q is not %q", clip(hdr), magic+" crc32c=<hex> bytes=<n>")
	}
	b := file[nl+1:]
	if len(b) != n {
		return State{}, fmt.Errorf("body is %d bytes, the header says %d: a torn write", len(b), n)
	}
	if crc32.Checksum(b, castagnoli) != sum {
		return State{}, errors.New("checksum mismatch")
	}
	var raw body
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return State{}, fmt.Errorf("body: %v", err)
	}
	var s State
	for _, e := range raw.Owned {
		origin, id, nums, err := decodeEntry(e, 2)
		if err != nil {
			return State{}, fmt.Errorf("owned entry: %v", err)
		}
		if nums[0] < 0 || nums[0] > 1<<31 || (nums[0] == 0) != (nums[1] == 0) {
			return State{}, errors.New("owned entry: bad lease")
		}
		s.Owned = append(s.Owned, Owned{Origin: origin, ID: id, LeaseSeconds: int(nums[0]), LeaseDeadline: nums[1]})
	}
	for _, e := range raw.Removed {
		origin, id, nums, err := decodeEntry(e, 1)
		if err != nil {
			return State{}, fmt.Errorf("removed entry: %v", err)
		}
		s.Removed = append(s.Removed, Removed{Origin: origin, ID: id, At: nums[0]})
	}
	return s, nil
}

func decodeEntry(e []json.RawMessage, nums int) (origin, id string, out []int64, err error) {
	if len(e) != 2+nums {
		return "", "", nil, fmt.Errorf("%d members, want %d", len(e), 2+nums)
	}
	if json.Unmarshal(e[0], &origin) != nil || json.Unmarshal(e[1], &id) != nil || id == "" {
		return "", "", nil, errors.New("origin and id must be strings, the id not empty")
	}
	for _, m := range e[2:] {
		n, err := strconv.ParseInt(string(m), 10, 64)
		if err != nil || n < 0 {
			return "", "", nil, errors.New("a number that is not a whole one from 0")
		}
		out = append(out, n)
	}
	return origin, id, out, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}

// Read reads and decodes the journal at path. A file that does not exist
// is an empty State and no error; anything but a regular file (a named
// pipe, a device, a directory) is refused without blocking on its open;
// a larger file than maxBytes is refused without reading past the bound.
func Read(path string, maxBytes int) (State, error) {
	f, err := openForRead(path)
	if errors.Is(err, os.ErrNotExist) {
		return State{}, nil
	}
	if err != nil {
		return State{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return State{}, err
	}
	if !st.Mode().IsRegular() {
		return State{}, errors.New("not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(maxBytes)+1))
	if err != nil {
		return State{}, err
	}
	return Decode(b, maxBytes)
}

// Write replaces the journal at path with file atomically: it is written
// to a temporary file in the same directory, synced, renamed over path,
// and the directory synced, so a crash at any point leaves either the
// previous journal or this one, whole. The temporary file has one fixed
// name, TempName(path), truncated at each write: the app dir's lock makes
// this daemon its only writer, and a write a kill cut short leaves one
// file the next write reuses, never one more per kill.
func Write(path string, file []byte) error {
	dir := filepath.Dir(path)
	name := TempName(path)
	tmp, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, werr := tmp.Write(file)
	if werr == nil {
		werr = tmp.Sync()
	}
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(name, path)
	}
	if werr != nil {
		os.Remove(name)
		return werr
	}
	return syncDir(dir)
}

// SetAside moves an unusable journal at path to path+".unusable",
// replacing one set aside earlier, and returns that name: the caller
// starts fresh, and its next write would otherwise replace a journal that
// may still be good (one a newer version wrote, or one it could not read
// for a while).
func SetAside(path string) (string, error) {
	to := path + ".unusable"
	return to, os.Rename(path, to)
}

// TempName is the temporary file Write writes before its rename.
func TempName(path string) string { return path + ".tmp" }

// syncDir makes the rename durable. Windows cannot open a directory for
// syncing; its rename (MoveFileEx) is written through by NTFS's journal.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
