package brokerio

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/wireframe"
)

// Group commit to the broker (spec 6). Every frame the daemon writes up to
// its broker (an ingress post, a peer's frame, a lease expiry, an answer to
// the broker and the daemon's own notifications) takes its place in one
// order, and frames that are ready at the same time are written in one
// Write call, in that order.
//
// The shape is leader and followers. A caller whose frame finds no write in
// progress leads: a producer's post yields once, so that the frames of
// requests ready to run join the group forming behind it, then writes its
// own line and that group in one write, with no goroutine handoff; a lone
// producer, with nothing else ready, is back from the yield at once.
// (Without the yield a leader's write, a few microseconds, is over before
// posts answered by one journal fsync are parsed again, and nearly every
// frame was a write of its own.) Any other frame writes at once: nothing
// makes its fellows ready together (leadAlone). A caller that finds a write in
// progress appends its line to the group forming behind it, under a short
// lock, and waits. When the leader's Write returns it runs the after-write
// commits of its group in order (the ingress frames' tracking and queueing
// for the peers), answers its members, and hands the lead to the group that
// formed meanwhile: one of that group's members wakes and writes the whole
// group, newcomers forming the next. So no goroutine writes more than one
// group for others, and a group's commits all run before the next group is
// written, which keeps the broker order and the commit order one order.
//
// Why not a dedicated writer goroutine: it would cost every frame two
// handoffs (to the writer and back), the lone producer included, where the
// leader pays none; and a goroutine that outlives the Manager would need a
// shutdown of its own.

// GroupMaxBytes bounds the lines of one group, newlines included. A
// frame that would take a group past it starts the next group instead (a
// line longer than the bound is a group of its own), so the bound never
// refuses anything. It bounds what one failed Write fails together, the
// bytes the leader copies for others and the write buffer the writer
// keeps: 1 MiB is some 2,000 typical frames (about 500 bytes each), far
// more than the 64 peer and 64 ingress requests that may wait on the broker
// at once, so in practice only frames of hundreds of kilobytes reach it; and
// it is 16 times the 64 KiB a Linux pipe holds, so the bound costs no extra
// wake-up of the broker.
const GroupMaxBytes = 1 << 20

// brokerLineKeepBytes is the largest line buffer put back in the pool: a
// rare huge frame's buffer is left to the collector, not kept for good.
const brokerLineKeepBytes = 64 << 10

// brokerLines recycles the buffers lines are built in, so a frame costs no
// allocation for its line once the pool is warm.
// ErrGone is returned by every write after the first failed one: the
// broker is the daemon's parent, and a pipe that failed once does not heal.
var ErrGone = errors.New("broker channel closed")

var brokerLines = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func GetLine() *bytes.Buffer {
	b := brokerLines.Get().(*bytes.Buffer)
	b.Reset()
	return b
}

func PutLine(b *bytes.Buffer) {
	if b.Cap() <= brokerLineKeepBytes {
		brokerLines.Put(b)
	}
}

// Writer writes frames onto the broker's side of the local channel, in
// groups (see above).
type Writer struct {
	// mu guards w, err, leading, head and tail. It is a leaf lock, held only
	// to join a group, to seal one and to hand the lead on: never across a
	// Write, a line's copy or a commit.
	mu      sync.Mutex
	w       io.Writer
	err     error
	leading bool         // a caller writes a group now, or has been handed the lead
	head    *brokerGroup // the oldest group waiting for the lead
	tail    *brokerGroup // the newest, which a newcomer joins while it has room

	// wbuf is where the leader of a group of several lines puts them
	// together. Only the caller that leads touches it; the lead passes
	// through mu and a group's turn channel, which order those touches.
	wbuf []byte

	// gone is closed on the first failed write; the manager treats it as the
	// shutdown signal.
	gone     chan struct{}
	goneOnce sync.Once
	// lineMax bounds a line, its newline included; it never changes.
	lineMax int

	writes, failures atomic.Uint64 // frames written; Write calls that failed
	refused          atomic.Uint64 // lines over lineMax, never written
	writeCalls       atomic.Uint64 // Write calls: writes/writeCalls is the mean group
	groupsAtBound    atomic.Uint64 // groups closed because the next line would pass GroupMaxBytes
}

// brokerGroup is the lines that will go up in one Write, in the order they
// were accepted.
type brokerGroup struct {
	members []groupMember
	bytes   int
	next    *brokerGroup  // the group formed behind this one
	turn    chan struct{} // one value: the lead, taken by any one member
	done    chan struct{} // closed once the group is written and committed, or failed
	err     error         // the group's outcome, set before done is closed
}

type groupMember struct {
	line  []byte // newline included
	after func() // the frame's commit, run by the leader after the write; nil for none
}

// NewWriter returns a writer to w whose lines, newline included, are
// at most lineMax bytes.
func NewWriter(w io.Writer, lineMax int) *Writer {
	return &Writer{w: w, gone: make(chan struct{}), lineMax: lineMax}
}

// Turn is a frame's place in the broker order, taken by enter. wait
// writes it, or waits for it to be written.
type Turn struct {
	bw    *Writer
	buf   *bytes.Buffer // the frame's line, given back to the pool by wait
	g     *brokerGroup  // the group it joined; nil when its caller leads
	after func()        // for a caller that leads: its own commit
}

// enter checks the line in buf (its newline included) against the line
// limit and gives it its place in the broker order. Nothing waits here
// beyond the writer's short lock, so a caller may enter under a lock that
// orders its frames (the ingress's ingestMu) and wait after releasing it.
// after, when not nil, is run once the line is written, in the broker
// order, before any later frame's after and before the frame's caller is
// answered; it is not run when the write fails. A line over the limit is
// refused alone: the error wraps wireframe.ErrLineOverLimit and the channel stays up.
// On an error buf is back in the pool.
func (bw *Writer) Enter(buf *bytes.Buffer, after func()) (Turn, error) {
	if size := buf.Len(); size > bw.lineMax {
		PutLine(buf)
		bw.refused.Add(1)
		return Turn{}, &wireframe.LineOverLimitError{Size: size, Limit: bw.lineMax}
	}
	bw.mu.Lock()
	defer bw.mu.Unlock()
	if bw.err != nil {
		PutLine(buf)
		return Turn{}, ErrGone
	}
	if !bw.leading {
		bw.leading = true
		return Turn{bw: bw, buf: buf, after: after}, nil
	}
	return Turn{bw: bw, buf: buf, g: bw.joinLocked(groupMember{line: buf.Bytes(), after: after})}, nil
}

// joinLocked appends a member to the newest group, or to a new one when
// there is none or the newest has no room for it. Called with mu held.
func (bw *Writer) joinLocked(m groupMember) *brokerGroup {
	g := bw.tail
	if g != nil && g.bytes+len(m.line) > GroupMaxBytes {
		bw.groupsAtBound.Add(1)
		g = nil
	}
	if g == nil {
		g = &brokerGroup{turn: make(chan struct{}, 1), done: make(chan struct{})}
		if bw.tail == nil {
			bw.head = g
		} else {
			bw.tail.next = g
		}
		bw.tail = g
	}
	g.members = append(g.members, m)
	g.bytes += len(m.line)
	return g
}

// wait writes the frame, or waits until its group is written, and returns
// the outcome: nil once the line is written and the frame's commit has run,
// or the write's error, shared by the whole group.
func (t Turn) Wait() error {
	defer PutLine(t.buf)
	if t.g == nil {
		return t.bw.leadAlone(t)
	}
	select {
	case <-t.g.turn:
		t.bw.lead(t.g)
	case <-t.g.done:
	}
	return t.g.err
}

// leadAlone writes the line of a caller that found no write in progress.
// A frame with a commit (a producer's post) first yields once: the frames
// of other requests that are ready to run (posts answered together by one
// journal fsync come back together) join the group forming behind it
// meanwhile, and it writes that group with its own line, in one Write, in
// the order they were accepted. A lone caller, with nothing else ready to
// run, is back at once. A frame without one (a peer's event, an answer to
// the broker) does not yield: nothing makes its fellows ready together,
// and the yield cost a peer's frame more than the groups it formed saved
// (issue 39: 51.7 against 41.3 us of CPU a frame from 4 peers, the
// ingress's figures unchanged or worse without it at 32 producers).
func (bw *Writer) leadAlone(t Turn) error {
	if t.after != nil {
		runtime.Gosched()
	}
	bw.mu.Lock()
	var g *brokerGroup
	if bw.head != nil && t.buf.Len()+bw.head.bytes <= GroupMaxBytes {
		g = bw.popHeadLocked() // else the group's own lead writes it: one write stays within the bound
	}
	w, gone := bw.w, bw.err
	bw.mu.Unlock()
	var err error
	switch {
	case gone != nil:
		err = ErrGone
	case g == nil:
		err = bw.write(w, t.buf.Bytes(), 1)
	default:
		err = bw.write(w, bw.joinLines(t.buf.Bytes(), g), 1+len(g.members))
	}
	if err == nil && t.after != nil {
		t.after()
	}
	if g != nil {
		g.finish(err)
	}
	bw.handOn()
	return err
}

// lead writes group g, which has been handed the lead, in one Write; runs
// its commits in order when the write succeeded; answers its members; and
// hands the lead on.
func (bw *Writer) lead(g *brokerGroup) {
	bw.mu.Lock()
	// g is the head: the lead goes to the oldest group.
	bw.popHeadLocked()
	w, gone := bw.w, bw.err
	bw.mu.Unlock()
	var err error
	if gone != nil {
		err = ErrGone
	} else {
		err = bw.write(w, bw.groupBytes(g), len(g.members))
	}
	g.finish(err)
	bw.handOn()
}

// finish runs the commits of g's members in order when its write (err)
// succeeded, then answers them.
func (g *brokerGroup) finish(err error) {
	if err == nil {
		for _, m := range g.members {
			if m.after != nil {
				m.after()
			}
		}
	}
	g.err = err
	close(g.done)
}

// groupBytes returns g's lines as one buffer: the line itself for a group
// of one, else the lines copied into the writer's buffer, which the caller,
// as the leader, owns.
func (bw *Writer) groupBytes(g *brokerGroup) []byte {
	if len(g.members) == 1 {
		return g.members[0].line
	}
	return bw.joinLines(nil, g)
}

// joinLines is first, then g's members' lines, in the writer's buffer
// (held by the lead only).
func (bw *Writer) joinLines(first []byte, g *brokerGroup) []byte {
	b := append(bw.wbuf[:0], first...)
	for _, m := range g.members {
		b = append(b, m.line...)
	}
	bw.wbuf = b
	return b
}

// popHeadLocked takes the oldest group off the queue and returns it.
// Sealed here, it takes no more members; newcomers form the next group.
// Called with mu held and a head queued.
func (bw *Writer) popHeadLocked() *brokerGroup {
	g := bw.head
	bw.head = g.next
	if bw.head == nil {
		bw.tail = nil
	}
	g.next = nil
	return g
}

// handOn gives the lead to the oldest waiting group, or gives it up when
// there is none.
func (bw *Writer) handOn() {
	bw.mu.Lock()
	next := bw.head
	if next == nil {
		bw.leading = false
	}
	bw.mu.Unlock()
	if next != nil {
		next.turn <- struct{}{} // buffered: each group is handed the lead once
	}
}

// write makes one Write call of b, which holds frames lines. A failed write
// marks the channel gone: the broker is the daemon's parent, and a pipe
// that failed once does not heal.
func (bw *Writer) write(w io.Writer, b []byte, frames int) error {
	bw.writeCalls.Add(1)
	if _, err := w.Write(b); err != nil {
		bw.failures.Add(1)
		bw.mu.Lock()
		if bw.err == nil {
			bw.err = err
		}
		bw.mu.Unlock()
		bw.goneOnce.Do(func() { close(bw.gone) })
		return fmt.Errorf("write to broker: %w", err)
	}
	bw.writes.Add(uint64(frames))
	return nil
}

// send enters the line in buf and waits for it: the whole of a write for a
// frame whose order nothing else decides.
func (bw *Writer) Send(buf *bytes.Buffer) error {
	t, err := bw.Enter(buf, nil)
	if err != nil {
		return err
	}
	return t.Wait()
}

// writeLine writes one frame, given without its newline. A line over the
// limit is not written: the error wraps wireframe.ErrLineOverLimit, and the channel
// is not marked gone.
func (bw *Writer) WriteLine(line []byte) error {
	b := GetLine()
	b.Write(line)
	b.WriteByte('\n')
	return bw.Send(b)
}

// notify sends a notification to the broker, its line built once.
func (bw *Writer) Notify(method string, params json.RawMessage) error {
	b := GetLine()
	wireframe.WriteNotification(b, method, params)
	b.WriteByte('\n')
	return bw.Send(b)
}

// respond answers a request of the broker's with a result, or with rerr when
// it is not nil. A nil result is sent as "result": null, which JSON-RPC
// requires for a successful answer.
func (bw *Writer) Respond(id json.RawMessage, result any, rerr *wireframe.RPCError) error {
	var resp any
	if rerr != nil {
		resp = struct {
			JSONRPC string              `json:"jsonrpc"`
			ID      json.RawMessage     `json:"id"`
			Error   *wireframe.RPCError `json:"error"`
		}{"2.0", id, rerr}
	} else {
		resp = struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Result  any             `json:"result"`
		}{"2.0", id, result}
	}
	line, err := json.Marshal(resp)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	return bw.WriteLine(line)
}

// UpsertLine builds the workloads:upsert line of a workload object, its
// newline included, in a pooled buffer: the bytes wireframe.EncodeNotification gives
// for params {"workloadInfo":info}, built in one pass.
func UpsertLine(info json.RawMessage) *bytes.Buffer {
	b := GetLine()
	b.WriteString(upsertPrefix)
	wireframe.WriteOneLine(b, info)
	b.WriteString("}}\n")
	return b
}

const upsertPrefix = `{"jsonrpc":"2.0","method":"` + wireframe.MethodUpsert + `","params":{"workloadInfo":`

// UpsertLineWith is UpsertLine with member (a `"name":value` pair, the
// ingress mark) added as the workload object's last member: the daemon's
// own word to its broker, which the broker keeps with the object.
func UpsertLineWith(info json.RawMessage, member []byte) *bytes.Buffer {
	b := GetLine()
	b.WriteString(upsertPrefix)
	start := b.Len()
	wireframe.WriteOneLine(b, info)
	obj := b.Bytes()[start:]
	end := bytes.LastIndexByte(obj, '}') // info is an object: it ends with its brace
	empty := len(bytes.TrimSpace(obj[bytes.IndexByte(obj, '{')+1:end])) == 0
	b.Truncate(start + end)
	if !empty {
		b.WriteByte(',')
	}
	b.Write(member)
	b.WriteString("}}}\n")
	return b
}

// RemoveLine builds the workloads:remove line of a removal, its newline
// included, in a pooled buffer.
func RemoveLine(r *wireframe.Removal) *bytes.Buffer {
	b := GetLine()
	wireframe.WriteNotification(b, wireframe.MethodRemove, r.BrokerParams())
	b.WriteByte('\n')
	return b
}

// WriteMetrics renders the writer's series: frames written, failed and
// refused writes, and the group commit's own.
func (bw *Writer) WriteMetrics(t *promtext.Text) {
	t.Single("nvpair_wlm_broker_writes_total", "counter", "Frames written to the broker.", float64(bw.writes.Load()))
	t.Single("nvpair_wlm_broker_write_failures_total", "counter", "Writes to the broker that failed.", float64(bw.failures.Load()))
	t.Single("nvpair_wlm_broker_lines_refused_total", "counter", "Frames not written to the broker because their line would exceed its line limit (--broker-line-max).", float64(bw.refused.Load()))
	t.Single("nvpair_wlm_broker_write_calls_total", "counter", "Write calls to the broker; nvpair_wlm_broker_writes_total over this is the mean frames per write (group commit).", float64(bw.writeCalls.Load()))
	t.Single("nvpair_wlm_broker_write_groups_at_bound_total", "counter", "Groups of broker frames closed because the next frame would take them past nvpair_wlm_broker_write_group_limit_bytes; that frame went up in the next write.", float64(bw.groupsAtBound.Load()))
	t.Single("nvpair_wlm_broker_write_group_limit_bytes", "gauge", "The most bytes of frames written to the broker in one write call, unless one frame alone is longer.", GroupMaxBytes)
}

// Gone is closed on the first failed write: the broker is the daemon's
// parent, and the Manager treats it as the signal to shut down.
func (bw *Writer) Gone() <-chan struct{} { return bw.gone }

// LineMax is the longest line the writer writes, its newline included.
func (bw *Writer) LineMax() int { return bw.lineMax }

// Counts is what the writer has done so far, for tests and benchmarks.
type Counts struct {
	Writes, Failures, Refused, WriteCalls, GroupsAtBound uint64
}

// Counts returns the writer's counters.
func (bw *Writer) Counts() Counts {
	return Counts{bw.writes.Load(), bw.failures.Load(), bw.refused.Load(), bw.writeCalls.Load(), bw.groupsAtBound.Load()}
}

// Queued counts the frames waiting in groups behind the write in progress.
func (bw *Writer) Queued() int {
	bw.mu.Lock()
	defer bw.mu.Unlock()
	n := 0
	for g := bw.head; g != nil; g = g.next {
		n += len(g.members)
	}
	return n
}

// SwapWriter replaces the writer's destination, for tests that hold the
// broker's side and then let it go.
func (bw *Writer) SwapWriter(w io.Writer) {
	bw.mu.Lock()
	bw.w = w
	bw.mu.Unlock()
}

// SendUpsert writes a workload object up to the broker as workloads:upsert.
func (bw *Writer) SendUpsert(info json.RawMessage) error { return bw.Send(UpsertLine(info)) }

// SendRemove writes a removal up to the broker as workloads:remove, naming
// the workload in the tokens it arrived with (Removal.BrokerParams).
func (bw *Writer) SendRemove(r *wireframe.Removal) error { return bw.Send(RemoveLine(r)) }
