package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/statejournal"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// Issue 36, item 5: one flipped byte inside the journal cost every record
// after it. 200 leased jobs are answered 200 by the real binary, which is
// then killed with SIGKILL; a byte is flipped at every tenth offset of a
// copy of its real journal in turn. Each answered job must be restored
// as the producer's, or counted in the figure the start logs for what it
// lost: the ERROR line's recordsLost for damage that valid records
// follow, the torn tail's recordsDropped for damage that none follows (a
// flip in the last record reads as a write cut short, spec 5.3). Never
// silently gone.
//
// Every sampled offset is restored in process, through the daemon's own
// read (statejournal.Open into statetable's Restorer) of the flipped
// file; a handful are restored by the binary itself, with the broker's
// replay, and judged by the producer's renewals: a 409 is a job the
// producer was locked out of.
func TestProcessAFlippedByteInTheJournalCostsOnlyTheRecordItHit(t *testing.T) {
	t.Parallel()
	const jobs = 200
	nodes := writeCluster(t, 1)
	a := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0")
	a.WaitMethod("ready", 1)
	ingress := a.loggedValue("local ingress listening", "addr")
	id := func(i int) string { return "flip-" + itoa(i) }
	postAll(t, jobs, func(i int) (int, string) {
		return testkit.PostIngress(t, ingress, string(testframe.Lifecycle(leasedInfo(id(i), "running", 1), nil)), leaseHeader, "600")
	}, http.StatusOK)
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	<-a.readDone
	replay := replayLines(a)
	journal := filepath.Join(nodes[0].AppDir, journalFileName)
	original, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]wireframe.WorkloadKey, jobs)
	for i := range keys {
		keys[i] = wireframe.WorkloadKey{Origin: nodes[0].ID, Engine: "llamacpp", RunID: "run-" + id(i), ID: id(i)}
	}

	phase := time.Now()
	// Every tenth offset of the records, restored in process: as many at
	// once as cores. The journal is written within zeros ahead of its
	// records (spec 5.3); a flip in them is sampled a few times, not a
	// MiB's worth: zeros after the last record are the file's end, and a
	// byte in them is one torn tail like any other.
	records := len(bytes.TrimRight(original, "\x00"))
	var offsets []int
	for off := 0; off < records; off += 10 {
		offsets = append(offsets, off)
	}
	for off := records; off < len(original) && off < records+64<<10; off += 4 << 10 {
		offsets = append(offsets, off)
	}
	var mu sync.Mutex
	var restored sync.Map
	var worst string
	silent, counted := 0, 0
	work := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			dir := scratchDir(t)
			for off := range work {
				lost, figure, what := restoreFlipped(t, dir, nodes[0].ID, original, off, keys, &restored)
				mu.Lock()
				counted += lost
				if lost > figure {
					silent += lost - figure
					if worst == "" {
						worst = fmt.Sprintf("offset %d: %d jobs lost, the start counted %d (%s)", off, lost, figure, what)
					}
				}
				mu.Unlock()
			}
		})
	}
	for _, off := range offsets {
		work <- off
	}
	close(work)
	wg.Wait()
	t.Logf("%d-byte journal of %d answered jobs, a byte flipped at each of %d offsets, restored in process in %s: %d jobs lost in all (at most one per offset), %d not counted",
		len(original), jobs, len(offsets), time.Since(phase).Round(time.Millisecond), counted, silent)
	if silent != 0 || counted > len(offsets) {
		t.Fatalf("%d jobs lost without being counted, %d lost over %d flips; first: %s", silent, counted, len(offsets), worst)
	}

	// A handful with the binary: the header, the first record's length,
	// a payload in the middle, the last record (a torn tail).
	last := bytes.LastIndex(original, []byte("flip-"))
	for _, off := range []int{10, len("nvpair-statejournal v1\n"), records / 2, last} {
		flipped := bytes.Clone(original)
		flipped[off] ^= 0xff
		clearJournalFiles(t, journal)
		if err := os.WriteFile(journal, flipped, 0o600); err != nil {
			t.Fatal(err)
		}
		binaryRestore(t, nodes[0], replay, flipped, off, id, jobs)
	}
}

// restoreFlipped restores the journal original with the byte at off
// flipped, in process, as the daemon's start does, in dir: the real file
// through statejournal.Open, its records into statetable's Restorer. It
// returns how many of keys are not restored as leased producer jobs, the
// loss the start counted (its ERROR's recordsLost, or its torn tail's
// recordsDropped), and the log. A table restored from the same records is
// the same table, so the restore of a set of records Open delivered
// before (a flip elsewhere in the same record) is taken from restored:
// the race detector makes each restore cost milliseconds.
func restoreFlipped(t *testing.T, dir, self string, original []byte, off int, keys []wireframe.WorkloadKey, restored *sync.Map) (lost, figure int, log string) {
	path := filepath.Join(dir, "journal-"+itoa(off))
	flipped := bytes.Clone(original)
	flipped[off] ^= 0xff
	if err := os.WriteFile(path, flipped, 0o600); err != nil {
		t.Error(err)
		return 0, 0, ""
	}
	var buf bytes.Buffer
	var all []byte
	var lens []int
	sum := sha256.New()
	j, err := statejournal.Open(path, statejournal.Options{NoSync: true, Logger: slog.New(slog.NewTextHandler(&buf, nil))}, func(p []byte) error {
		all = append(all, p...)
		lens = append(lens, len(p))
		sum.Write(binary.AppendUvarint(nil, uint64(len(p))))
		sum.Write(p)
		return nil
	})
	if err != nil {
		t.Errorf("offset %d: Open: %v", off, err)
		return 0, 0, ""
	}
	j.Close()
	key := string(sum.Sum(nil))
	if n, ok := restored.Load(key); ok {
		lost = n.(int)
	} else {
		records := make([][]byte, len(lens))
		for i, n := range lens {
			records[i], all = all[:n:n], all[n:]
		}
		tb := statetable.New(statetable.Config{Self: self, Retention: time.Minute, MaxLive: 100_000, MaxLiveBytes: 1 << 30,
			MaxEndedBytes: 64 << 20, MemberClaim: time.Hour})
		tb.Restore(records, 5*time.Second)
		for _, k := range keys {
			if tb.LeaseOf(k).IsZero() {
				lost++
			}
		}
		restored.Store(key, lost)
	}
	log = buf.String()
	figure = loggedInt(log, "recordsLost") + loggedInt(log, "recordsDropped")
	matches, _ := filepath.Glob(path + "*")
	for _, m := range matches {
		// The damaged file kept, every hundredth offset: the unit tests
		// and the binary's samples compare it always.
		if strings.Contains(m, ".damaged-") && off%1000 == 0 {
			if b, _ := os.ReadFile(m); !bytes.Equal(b, flipped) {
				t.Errorf("offset %d: the damaged journal kept as %s is not the file as it was", off, m)
			}
		}
		os.Remove(m)
	}
	return lost, figure, log
}

// binaryRestore starts the daemon of node over the flipped journal, with
// the broker's replay of every job before its ready, and holds it to the
// start's own count: the jobs whose producer's renewal is refused 409
// (the broker's replay took them) are no more than the loss it logged.
func binaryRestore(t *testing.T, node devpki.Node, replay []string, flipped []byte, off int, id func(int) string, jobs int) {
	t.Helper()
	d := startDaemon(t, nodeArgs(node, 0, "--local-ingress", "127.0.0.1:0", "--metrics", "127.0.0.1:0")...)
	for _, line := range replay {
		d.send(line)
	}
	// A request behind the replay: its answer says the replay was read.
	d.send(`{"jsonrpc":"2.0","id":"replayed","method":"log/set-level","params":{"level":"debug"}}`)
	d.WaitResponse(`"replayed"`)
	ingress := d.loggedValue("local ingress listening", "addr")
	metrics := d.loggedValue("metrics endpoint listening", "addr")
	log := d.stderr.String()
	figure := loggedInt(log, "recordsLost") + loggedInt(log, "recordsDropped")
	refused := postAll(t, jobs, func(i int) (int, string) {
		return testkit.PostIngress(t, ingress, string(testframe.Lifecycle(leasedInfo(id(i), "running", 2), nil)), leaseHeader, "600")
	}, http.StatusOK, http.StatusConflict)
	damaged := testkit.ScrapeValue(t, metrics, "nvpair_wlm_journal_damaged_records_total")
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	errLines, warnings := bytes.Count([]byte(log), []byte("level=ERROR")), bytes.Count([]byte(log), []byte("torn or damaged tail"))
	t.Logf("binary, byte %d flipped: %d renewals refused 409; the start logged %d error(s), %d torn tail(s), a loss of %d; damaged_records_total %v",
		off, refused, errLines, warnings, figure, damaged)
	if refused > figure || errLines+warnings > 1 || (errLines == 1 && int(damaged) != loggedInt(log, "recordsLost")) {
		t.Fatalf("byte %d flipped: %d jobs locked out, the start counted %d; %d errors, %d torn tails, damaged_records_total %v:\n%s",
			off, refused, figure, errLines, warnings, damaged, log)
	}
	if errLines == 1 {
		kept, _ := filepath.Glob(filepath.Join(node.AppDir, journalFileName) + ".damaged-*")
		if len(kept) != 1 {
			t.Fatalf("byte %d flipped: %d damaged files kept, want one", off, len(kept))
		}
		if b, _ := os.ReadFile(kept[0]); !bytes.Equal(b, flipped) {
			t.Fatalf("byte %d flipped: the damaged journal kept is not the file as it was", off)
		}
	}
}

// postAll posts n frames with 8 workers, fails the test on a status not in
// ok, and returns how many were answered the second of ok.
func postAll(t *testing.T, n int, post func(i int) (int, string), ok ...int) (second int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				st, text := post(i)
				mu.Lock()
				switch {
				case st == ok[0]:
				case len(ok) > 1 && st == ok[1]:
					second++
				default:
					t.Errorf("post %d: %d %s", i, st, text)
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return second
}

// scratchDir is a directory for the in-process restores' thousands of
// short-lived files: in memory (/dev/shm) where the system has one, so
// that the file system's own journal does not make each creation, link,
// rename and removal cost a disk's metadata write; else the test's
// temporary directory.
func scratchDir(t *testing.T) string {
	t.Helper()
	if dir, err := os.MkdirTemp("/dev/shm", "journal-flips-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return t.TempDir()
}

// clearJournalFiles removes the journal at path and every file a start
// set beside it.
func clearJournalFiles(t *testing.T, path string) {
	t.Helper()
	matches, _ := filepath.Glob(path + "*")
	for _, m := range matches {
		if err := os.Remove(m); err != nil {
			t.Fatal(err)
		}
	}
}

// loggedInt is the value of key in the log's first line holding it, 0
// if none does.
func loggedInt(log, key string) int {
	m := regexp.MustCompile(`\b` + key + `=(\d+)`).FindStringSubmatch(log)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
