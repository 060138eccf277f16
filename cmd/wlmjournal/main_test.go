package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/statejournal"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

const self = "11111111-2222-3333-4444-555555555555"

// writeJournal writes a real journal through the state table: three
// leased producer jobs (one of them run twice), one ended, one removed,
// and a member's mark; it returns its path.
func writeJournal(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "workload-manager.journal")
	j, err := statejournal.Open(path, statejournal.Options{NoSync: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tb := statetable.New(statetable.Config{Self: self, Retention: time.Minute, MaxLive: 100, MaxLiveBytes: 1 << 20,
		MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Journal: j})
	commit := func(id, state string, seq int) {
		w := testframe.Workload(id, state, self, map[string]any{"seq": seq})
		frame := testframe.Lifecycle(w, nil)
		var env struct {
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal(frame, &env); err != nil {
			t.Fatal(err)
		}
		ev, err := wireframe.ParseLifecycle(env.Method, env.Params)
		if err != nil {
			t.Fatal(err)
		}
		if o, _ := tb.Commit(&statetable.Frame{Source: statetable.FromProducer, Life: &ev, LeaseSeconds: 30}); o != statetable.Applied {
			t.Fatalf("commit %s %s: %s", id, state, o)
		}
	}
	commit("job-a", "running", 1)
	commit("job-b", "running", 1)
	commit("job-a", "running", 2)
	commit("job-c", "completed", 1)
	rm, err := wireframe.ParseRemove(json.RawMessage(fmt.Sprintf(`{"workloadId":"job-b","originatedFrom":%q}`, self)))
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := tb.Commit(&statetable.Frame{Source: statetable.FromProducer, Removal: &rm}); o != statetable.Applied {
		t.Fatalf("removal: %s", o)
	}
	m := tb.Join("peer-1")
	tb.Ack(m, tb.Version())
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// dumpOf runs the command on path and returns its exit status, stdout and
// stderr.
func dumpOf(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

var recordLinePattern = regexp.MustCompile(`(?m)^offset=(\d+) length=(\d+) kind=(put|forget|ack|drop)`)

// Every record of a real journal is one line, at its offset, with its
// kind, version, entry, owner and key; the summary counts them; exit 0.
func TestItPrintsEachRecordOfARealJournalOnALine(t *testing.T) {
	path := writeJournal(t)
	code, out, errOut := dumpOf(t, path)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var offsets []int64
	var kinds []string
	for _, l := range lines[:len(lines)-1] {
		m := recordLinePattern.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("not a record line: %q", l)
		}
		var off int64
		fmt.Sscan(m[1], &off)
		offsets = append(offsets, off)
		kinds = append(kinds, m[3])
	}
	// The offsets are the file's: each record starts where the reader
	// finds it, the first right after the header line.
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if first := int64(bytes.IndexByte(file, '\n') + 1); offsets[0] != first {
		t.Fatalf("the first record at %d, want %d (after the header)", offsets[0], first)
	}
	for i, l := range lines[:len(lines)-1] {
		var n int64
		fmt.Sscanf(strings.Fields(l)[1], "length=%d", &n)
		if int64(binary.LittleEndian.Uint32(file[offsets[i]:])) != n {
			t.Fatalf("line %q: the file's length field at %d says %d", l, offsets[i], binary.LittleEndian.Uint32(file[offsets[i]:]))
		}
	}
	for _, want := range []string{
		`kind=put version=1 entry=live owner=producer origin="` + self + `" engine="llamacpp" runId="run-job-a" id="job-a" lease=30`,
		`kind=put version=3 entry=live owner=producer origin="` + self + `" engine="llamacpp" runId="run-job-a" id="job-a" lease=30`,
		`kind=put version=4 entry=terminal owner=producer`,
		`entry=removed owner=producer origin="` + self + `" engine="" runId="" id="job-b"`,
		`kind=ack member="peer-1"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, `refused="`) || !strings.Contains(lines[len(lines)-1], fmt.Sprintf("records=%d refused=0 damagedRegions=0", len(kinds))) {
		t.Fatalf("a refusal, or a summary that does not count %d records:\n%s", len(kinds), out)
	}
}

// A journal damaged in its middle is printed without being changed: the
// records on both sides, the damaged region between them with its length
// and reason, a summary with the loss; exit 1.
func TestItPrintsADamagedJournalsRegionsAndLeavesTheFileAlone(t *testing.T) {
	path := writeJournal(t)
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, out, _ := dumpOf(t, path)
	m := recordLinePattern.FindAllStringSubmatch(out, -1)
	if len(m) < 4 {
		t.Fatalf("%d records in the whole journal", len(m))
	}
	var off, n int
	fmt.Sscan(m[2][1], &off)
	fmt.Sscan(m[2][2], &n)
	damaged := bytes.Clone(whole)
	damaged[off+8+n/2] ^= 0xff // a byte in the third record's payload
	if err := os.WriteFile(path, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	code, out, _ := dumpOf(t, path)
	if code != 1 {
		t.Fatalf("exit %d for a damaged journal, want 1:\n%s", code, out)
	}
	want := fmt.Sprintf("offset=%d length=%d kind=DAMAGE records=1 recordsExact=true tail=false reason=%q", off, n+8, "a record whose checksum does not match")
	if !strings.Contains(out, want) {
		t.Fatalf("the output lacks %q:\n%s", want, out)
	}
	if got := len(recordLinePattern.FindAllString(out, -1)); got != len(m)-1 {
		t.Fatalf("%d records printed around the damage, want %d", got, len(m)-1)
	}
	if !strings.Contains(out, fmt.Sprintf("damagedRegions=1 bytesLost=%d recordsLost=1 recordsLostIs=exact", n+8)) {
		t.Fatalf("the summary does not give the loss:\n%s", out)
	}
	after, _ := os.Stat(path)
	if got, _ := os.ReadFile(path); !bytes.Equal(got, damaged) || !after.ModTime().Equal(before.ModTime()) {
		t.Fatal("the command changed the file")
	}
	if left, _ := filepath.Glob(path + ".*"); len(left) != 0 {
		t.Fatalf("the command left files beside the journal: %q", left)
	}
}

// A file that is not a journal, one it cannot read, and wrong arguments
// are told apart by the exit status.
func TestItsExitStatusSaysWhatItFound(t *testing.T) {
	dir := t.TempDir()
	notJournal := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notJournal, []byte("just some notes, not a journal at all\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		code int
	}{
		{"not a journal", []string{notJournal}, 1},
		{"no such file", []string{filepath.Join(dir, "missing")}, 2},
		{"a directory", []string{dir}, 2},
		{"no file named", nil, 2},
		{"a bad flag value", []string{"--max-record-bytes", "lots", notJournal}, 2},
	} {
		if code, out, errOut := dumpOf(t, c.args...); code != c.code {
			t.Errorf("%s: exit %d, want %d\n%s%s", c.name, code, c.code, out, errOut)
		}
	}
}
