package statetable

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"

	"nvpair-workload-manager/internal/wireframe"
)

// supersedes reports whether ev may replace the state e holds for its run.
//
// A producer may post each frame on its own goroutine, so one run's frames
// can reach the daemon in any order: its terminal frame before its running
// one, its running frame before its queued one. The peers' brokers keep the
// last frame they were sent, and the table is what every peer is sent, so
// it must end up holding the run's latest state whatever the arrival order,
// or the cluster would show a finished job as running, or a running one as
// queued, for good.
//
//   - A terminal frame always replaces: nothing follows the end of a run
//     (and a second terminal frame, a correction, is the later word).
//   - A non-terminal frame never replaces a terminal entry within its
//     retention: it is a late or replayed delivery, and a finished workload
//     must not be re-asserted as live. (Past its retention the entry no
//     longer holds its run, Commit's caller treats it as absent.)
//   - Between live frames, the producer's seq, when both carry one, is its
//     own order of events and decides: a lower seq is older. An equal seq
//     replaces, as a resent frame always did.
//   - Otherwise the lifecycle order decides: a queued frame does not replace
//     a running entry. A state outside queued and running has no rank (the
//     stdio and peer paths allow any state, and nothing says where it
//     falls), so it neither replaces by rank nor is refused by it.
func supersedes(ev *wireframe.Lifecycle, e *entry) bool {
	switch {
	case ev.Terminal():
		return true
	case e.kind != kindLive:
		return false
	case ev.Info.HasSeq && e.hasSeq:
		return ev.Info.Seq >= e.seq
	}
	return !rankOf(ev.Info.State).before(e.rank)
}

// lifecycleRank orders the live states: queued comes before running.
type lifecycleRank uint8

const (
	rankNone    lifecycleRank = iota // terminal or unknown: not ordered
	rankQueued                       // queued
	rankRunning                      // running
)

func rankOf(state string) lifecycleRank {
	switch state {
	case "queued":
		return rankQueued
	case "running":
		return rankRunning
	}
	return rankNone
}

// before reports whether a state of rank r comes before one of rank other in
// a run's life; a state without a rank comes before none and after none.
func (r lifecycleRank) before(other lifecycleRank) bool {
	return r != rankNone && other != rankNone && r < other
}

// ReassertionLine is the line a run is kept as: its notification with
// "resync": true first in its params, the marker that lets a re-assertion
// through the peers' dedup. A fresh send leaves the marker out
// (Line.Fresh), so one copy serves both.
//
// The line is kept for as long as its run is, so it is built in a pooled
// buffer and copied out at its exact length: a buffer grown for it would
// keep its slack (up to a size class more) per run held.
func ReassertionLine(method string, params json.RawMessage) []byte {
	s := lineScratches.Get().(*lineScratch)
	s.params = appendWithResync(s.params[:0], WithoutResync(params))
	s.line.Reset()
	wireframe.WriteNotification(&s.line, method, s.params)
	line := bytes.Clone(s.line.Bytes())
	if s.line.Cap() <= 64<<10 && cap(s.params) <= 64<<10 {
		lineScratches.Put(s)
	}
	return line
}

// lineScratch is where a line is built before its exact copy: the params
// with the marker, then the notification around them.
type lineScratch struct {
	line   bytes.Buffer
	params []byte
}

var lineScratches = sync.Pool{New: func() any { return new(lineScratch) }}

// appendWithResync appends params with "resync": true added first to dst.
func appendWithResync(dst []byte, params json.RawMessage) []byte {
	p := bytes.TrimSpace(params)
	rest := bytes.TrimSpace(p[1:]) // p is a JSON object: it starts with '{'
	dst = append(dst, `{"resync":true`...)
	if rest[0] != '}' {
		dst = append(dst, ',')
	}
	return append(dst, rest...)
}

// WithoutResync returns params without any member that encoding/json would
// decode as the resync marker.
func WithoutResync(params json.RawMessage) json.RawMessage {
	if !MayHoldResync(params) {
		return params
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(params, &m); err != nil {
		return params // the frame's parse already decoded it; unreachable
	}
	found := false
	for k := range m {
		if strings.EqualFold(k, "resync") {
			delete(m, k)
			found = true
		}
	}
	if !found {
		return params
	}
	b, err := json.Marshal(m)
	if err != nil {
		return params
	}
	return b
}

// MayHoldResync reports whether params could hold a member that
// encoding/json decodes as resync: a name with an escape, or one spelt
// resync in any case, with "ſ" (U+017F, which folds to s) for the s. When
// it reports false no such member exists and params need no decoding.
func MayHoldResync(params []byte) bool {
	if bytes.IndexByte(params, '\\') >= 0 {
		return true
	}
	for i := 0; i+6 <= len(params); i++ {
		if params[i]|0x20 != 'r' || params[i+1]|0x20 != 'e' {
			continue
		}
		j := i + 2
		switch {
		case params[j]|0x20 == 's':
			j++
		case j+1 < len(params) && params[j] == 0xc5 && params[j+1] == 0xbf: // ſ
			j += 2
		default:
			continue
		}
		if j+3 <= len(params) && params[j]|0x20 == 'y' && params[j+1]|0x20 == 'n' && params[j+2]|0x20 == 'c' {
			return true
		}
	}
	return false
}

// markerAt is where a run's line holds the marker `"resync":true` and the
// comma after it, if any: Fresh leaves [at, at+n) out.
func markerAt(line []byte) (at, n int) {
	// The method is a lifecycle method, which needs no escaping, so the
	// first occurrence is the one ReassertionLine wrote.
	const marker = `"params":{"resync":true`
	i := bytes.Index(line, []byte(marker))
	if i < 0 {
		return 0, 0
	}
	at = i + len(`"params":{`)
	n = len(`"resync":true`)
	if at+n < len(line) && line[at+n] == ',' {
		n++
	}
	return at, n
}

// Line is an entry's frame as a peer is sent it. Its bytes are never
// modified once stored, so a sender holds it without the lock.
type Line struct {
	b   []byte
	run bool // a run's line, kept with the re-assertion marker
	// asserted says the run's fresh send keeps the marker: the broker
	// re-asserted it explicitly (entry.asserted).
	asserted bool
}

// RunLine is a run's stored line (a read-back item's) as a Line.
func RunLine(b []byte) Line { return Line{b: b, run: true} }

// Reassertion is the line with the marker, as the heartbeat sends it.
func (l Line) Reassertion() []byte { return l.b }

// Fresh is the line as a fresh frame, in two pieces to write one after
// the other: a run's without the marker (but for one the broker
// re-asserted, which keeps it), a removal's as it was relayed.
func (l Line) Fresh() (head, tail []byte) {
	if !l.run || l.asserted {
		return l.b, nil
	}
	at, n := markerAt(l.b)
	if n == 0 {
		return l.b, nil
	}
	return l.b[:at], l.b[at+n:]
}

// FreshBytes is Fresh in one slice: the body of a single frame's request.
// It copies only a run's line, whose marker it leaves out.
func (l Line) FreshBytes() []byte {
	head, tail := l.Fresh()
	if len(tail) == 0 {
		return head
	}
	return append(append(make([]byte, 0, len(head)+len(tail)), head...), tail...)
}

// FreshLen is the length of Fresh's two pieces together.
func (l Line) FreshLen() int {
	h, t := l.Fresh()
	return len(h) + len(t)
}

// Params returns a run line's params without the marker, as the frame was
// committed (a new slice).
func (l Line) Params() json.RawMessage {
	at, n := markerAt(l.b)
	if n == 0 {
		return nil
	}
	end := len(l.b) - 1 // the line ends with the envelope's '}'
	out := make([]byte, 0, end-at+1)
	out = append(out, '{')
	return append(out, l.b[at+n:end]...)
}

// compactKeep are the workloadInfo members an end keeps in its small form:
// what names the run, its state and its order (PAIR's store orders a
// run's events by seq), and its times. What goes is detail: an error's
// text, a producer's own members.
var compactKeep = map[string]bool{
	"id": true, "model": true, "engine": true, "state": true, "originatedFrom": true, "runId": true,
	"scheduledOn": true, "seq": true, "createdAt": true, "startedAt": true, "completedAt": true, "requesterId": true,
}

// compactLine is an end's line in its small form: a run's with only the
// compactKeep members of its workloadInfo and no other params; a
// removal's as it is (it names the workload and nothing else). A line
// that does not decode (unreachable: the table keeps only lines it
// parsed) is kept whole.
func compactLine(e *entry) []byte {
	if e.kind == kindRemoved {
		return e.line
	}
	var env struct {
		Method string                     `json:"method"`
		Params map[string]json.RawMessage `json:"params"`
	}
	if json.Unmarshal(e.line, &env) != nil {
		return e.line
	}
	var info map[string]json.RawMessage
	if json.Unmarshal(env.Params["workloadInfo"], &info) != nil {
		return e.line
	}
	for k := range info {
		if !compactKeep[k] {
			delete(info, k)
		}
	}
	b, err := json.Marshal(map[string]any{"workloadInfo": info})
	if err != nil {
		return e.line
	}
	return ReassertionLine(env.Method, b)
}
