// Command wlmjournal prints the records of a workload manager's journal
// (<app-dir>/workload-manager.journal, spec 5.3), one per line, and its
// damaged regions, without changing the file: the journal's counterpart
// of etcd's etcd-dump-logs and hashicorp/raft-wal's waldump. Run it on a
// journal, or on a damaged one kept beside it (.damaged-<unixnano>):
//
//	go run ./cmd/wlmjournal <app-dir>/workload-manager.journal
//
// Each record is a line of key=value pairs: its offset and length in the
// file, its kind (put, forget, ack, drop), its version (an ack's mark),
// what entry it is (live, terminal, removed), its owner, its key and, for
// a record a restore would refuse, why. Each damaged region is a line of
// kind=DAMAGE with its length, the records it held and the reason. A
// summary line ends the output.
//
// It reads the file as the daemon's start does (internal/statejournal's
// reader, internal/statetable's decoding), so what it prints is what a
// start would restore. It exits 0 for a whole journal, 1 when it found
// damage or a file that is not a journal, 2 when it cannot read the file
// or its flags are wrong.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"nvpair-workload-manager/internal/cliflags"
	"nvpair-workload-manager/internal/statejournal"
	"nvpair-workload-manager/internal/statetable"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wlmjournal", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	maxRecord := fs.Int("max-record-bytes", statejournal.DefaultMaxRecordBytes, "the longest record to read as one (the daemon's bound)")
	explain := cliflags.Explain(fs, map[string]string{"max-record-bytes": "N"})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "usage: wlmjournal [flags] JOURNAL\n\nPrints a journal's records, one per line, and its damaged regions, without changing it.\n\n")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(stderr, "wlmjournal: %v\n", explain(err))
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "wlmjournal: name one journal file, like wlmjournal <app-dir>/workload-manager.journal")
		return 2
	}
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	sum, err := dump(fs.Arg(0), *maxRecord, w)
	if err != nil {
		w.Flush()
		fmt.Fprintf(stderr, "wlmjournal: %v\n", err)
		return 2
	}
	if sum.regions > 0 || !sum.journal {
		return 1
	}
	return 0
}

// summary is what dump found.
type summary struct {
	journal                                bool // the file is a journal
	records, refused                       int
	regions, bytesLost, recordsLost, exact int64
}

// dump prints the journal at path to w, one line per record and per
// damaged region, then a summary line.
func dump(path string, maxRecord int, w io.Writer) (summary, error) {
	var s summary
	record := func(off int64, payload []byte) error {
		s.records++
		ri := statetable.Describe(payload)
		if ri.Refused != "" {
			s.refused++
		}
		_, err := fmt.Fprintln(w, recordLine(off, len(payload), ri))
		return err
	}
	damage := func(d statejournal.Damage) error {
		s.regions++
		s.bytesLost += d.Bytes()
		s.recordsLost += int64(d.Records)
		if d.RecordsExact {
			s.exact++
		}
		_, err := fmt.Fprintln(w, damageLine(d))
		return err
	}
	journal, hdr, err := statejournal.Inspect(path, maxRecord, record, damage)
	if err != nil {
		return s, err
	}
	s.journal = journal
	_, err = fmt.Fprintf(w, "# file=%s header=%q records=%d refused=%d damagedRegions=%d bytesLost=%d recordsLost=%d recordsLostIs=%s\n",
		strconv.Quote(path), hdr, s.records, s.refused, s.regions, s.bytesLost, s.recordsLost, lostIs(s))
	return s, err
}

func lostIs(s summary) string {
	if s.exact == s.regions {
		return "exact"
	}
	return "atLeast"
}

// recordLine is one record's line. The key's fields are quoted: they
// may hold any byte.
func recordLine(off int64, n int, ri statetable.RecordInfo) string {
	line := fmt.Sprintf("offset=%d length=%d kind=%s", off, n, ri.Kind)
	switch ri.Kind {
	case "put", "forget":
		line += fmt.Sprintf(" version=%d entry=%s", ri.Version, ri.Entry)
		if ri.Owner != "" {
			line += " owner=" + ri.Owner
		}
		line += fmt.Sprintf(" origin=%q engine=%q runId=%q id=%q", ri.Key.Origin, ri.Key.Engine, ri.Key.RunID, ri.Key.ID)
		if ri.Kind == "put" {
			line += fmt.Sprintf(" lease=%d runs=%d line=%d", ri.LeaseSeconds, ri.Runs, ri.LineBytes)
		}
	case "ack":
		line += fmt.Sprintf(" member=%q mark=%d", ri.Member, ri.Version)
	case "drop":
		line += fmt.Sprintf(" member=%q", ri.Member)
	}
	if ri.Refused != "" {
		line += fmt.Sprintf(" refused=%q", ri.Refused)
	}
	return line
}

// damageLine is one damaged region's line.
func damageLine(d statejournal.Damage) string {
	line := fmt.Sprintf("offset=%d length=%d kind=DAMAGE records=%d recordsExact=%t tail=%t", d.Offset, d.Bytes(), d.Records, d.RecordsExact, d.Tail)
	if d.Unsearched {
		line += " unsearched=true"
	}
	return line + fmt.Sprintf(" reason=%q", d.Reason)
}
