package statetable

import (
	"fmt"

	"nvpair-workload-manager/internal/wireframe"
)

// RecordInfo is what one journal record says, for the inspection command
// (cmd/wlmjournal): its fields as written, and whether a restore takes
// it. The format is record.go's; nothing else decodes it.
type RecordInfo struct {
	Kind    string // put, forget, ack, drop, or unknown
	Version uint64 // a put's or a forget's version; an ack's mark
	Entry   string // a put's or a forget's: live, terminal or removed
	Owner   string // a put's: broker or producer
	Key     wireframe.WorkloadKey
	Member  string // an ack's or a drop's member id
	// LeaseSeconds, Runs and LineBytes are a put's: its lease (0: none), a
	// removal's runs, and its line's length.
	LeaseSeconds uint64
	Runs         int
	LineBytes    int
	// Refused says why a restore would refuse the record, "" if it takes
	// it. A put's line is parsed too, as the restore parses the line of a
	// key's winning record.
	Refused string
}

// Describe decodes one journal record; it never fails (a record it
// cannot read says so in Refused).
func Describe(rec []byte) RecordInfo {
	var ri RecordInfo
	if len(rec) == 0 {
		return RecordInfo{Kind: "unknown", Refused: "an empty record"}
	}
	r := &reader{b: rec[1:], whole: rec}
	switch rec[0] {
	case recPut:
		ri.Kind = "put"
		describePut(&ri, rec)
	case recForget:
		ri.Kind = "forget"
		ri.Version = r.uvarint()
		ri.Entry = kindName(kind(r.byte()))
		ri.Key = r.key()
	case recAck:
		ri.Kind = "ack"
		ri.Member = r.string(wireframe.MaxKeyFieldBytes)
		ri.Version = r.uvarint()
		r.varint()
	case recMarks:
		ri.Kind = "marks"
		for r.err == nil && len(r.b) > 0 {
			ri.Member = r.string(wireframe.MaxKeyFieldBytes)
			ri.Version = max(ri.Version, r.uvarint())
			r.varint()
		}
	case recDropMember:
		ri.Kind = "drop"
		ri.Member = r.string(wireframe.MaxKeyFieldBytes)
		if r.err == nil && len(r.b) != 0 {
			r.err = errRecord
		}
	default:
		return RecordInfo{Kind: "unknown", Refused: fmt.Sprintf("an unknown record type %q", rec[0])}
	}
	if r.err != nil && ri.Refused == "" {
		ri.Refused = "malformed"
	}
	return ri
}

// describePut fills ri from a put: its leading fields as they read, then
// the restore's verdict.
func describePut(ri *RecordInfo, rec []byte) {
	r := &reader{b: rec[1:], whole: rec}
	ri.Version = r.uvarint()
	ri.Entry = kindName(kind(r.byte()))
	ri.Owner = ownerName(Owner(r.byte()))
	r.byte()
	r.varint()
	ri.LeaseSeconds = r.uvarint()
	r.varint()
	ri.Key = r.key()
	e, err := (&Table{}).decodePut(&reader{b: rec[1:], whole: rec})
	switch {
	case err != nil:
		ri.Refused = "malformed, or over a bound the live paths enforce"
	case checkLine(e) != nil:
		ri.Refused = "its line is not the frame it claims to be"
	}
	if e != nil {
		ri.Runs, ri.LineBytes = len(e.runs), len(e.line)
	}
}

func kindName(k kind) string {
	switch k {
	case kindLive:
		return "live"
	case kindTerminal:
		return "terminal"
	case kindRemoved:
		return "removed"
	}
	return fmt.Sprintf("kind-%d", k)
}

func ownerName(o Owner) string {
	switch o {
	case Broker:
		return "broker"
	case Producer:
		return "producer"
	}
	return fmt.Sprintf("owner-%d", o)
}
