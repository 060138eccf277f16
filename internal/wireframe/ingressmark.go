package wireframe

import (
	"encoding/json"
	"fmt"
)

// The ingress mark (spec 3.5.3). PAIR's broker keeps the workload object
// of every upsert whole and replays it to a restarted daemon, so a member
// the daemon adds to the object it writes up comes back with the replay.
// The daemon adds one to each ingress frame's object on the broker line
// only (the peers are sent the frame as the producer posted it), and the
// broker's replay of a job a crash took out of the journal then says it
// was a producer's. What the mark's value proves is the daemon's business
// (internal/ingressmark); the format only names it, keeps producers from
// sending it, and cuts it out of a frame the broker sent.

// IngressMarkName is the mark's member in a workload object.
const IngressMarkName = "wlmIngress"

// ingressMarkFolded is the name folded: a producer may send it in no
// spelling, as it may not send resync.
var ingressMarkFolded = foldKey(IngressMarkName)

// checkNoIngressMark refuses a producer's workload object that has a
// member whose name folds to the mark's: a producer's value would reach
// the broker beside the daemon's and the peers without it.
func checkNoIngressMark(il *scanLevel) error {
	var buf [64]byte
	for i := range il.n {
		m := il.member(i)
		if string(m.foldedName(buf[:0])) == ingressMarkFolded {
			return fmt.Errorf("workloadInfo: %q is reserved for the mark the daemon adds for its broker", m.nameString())
		}
	}
	return nil
}

// InfoMember returns the value of the scanned workload object's member
// named exactly name, and how many members are named so (0 or 1 in any
// frame the daemon wrote).
func (s *Scan) InfoMember(name string) (value []byte, n int) {
	il := &s.levels[levelInfo]
	for i := range il.n {
		if il.nameIs(i, name) {
			if n == 0 {
				value = il.member(i).value
			}
			n++
		}
	}
	return value, n
}

// ParamsWithoutInfoMember returns the scanned frame's params with every
// member of its workload object named exactly name left out, or the params
// as they are when there is none. The rest of the params and every member
// kept are the text as it came, byte for byte; only the white space
// between the object's members goes (PAIR's broker writes none). The
// frame must have been scanned with ScanFrame.
func (s *Scan) ParamsWithoutInfoMember(name string) json.RawMessage {
	pl, il := &s.levels[levelParams], &s.levels[levelInfo]
	if _, n := s.InfoMember(name); n == 0 {
		return pl.raw
	}
	out := make([]byte, 0, len(pl.raw))
	out = append(out, s.b[pl.off:il.off]...)
	out = append(out, '{')
	kept := 0
	for i := range il.n {
		if il.nameIs(i, name) {
			continue
		}
		if kept > 0 {
			out = append(out, ',')
		}
		m := il.member(i)
		out = append(out, s.b[m.nameOff:m.off+len(m.value)]...)
		kept++
	}
	out = append(out, '}')
	return append(out, s.b[il.off+len(il.raw):pl.off+len(pl.raw)]...)
}
