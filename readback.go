package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// The read-back (spec 3.5.2): GET /v1/workloads on the ingress lists this
// node's ingress-reported workloads, so a producer that restarted can ask
// which of its jobs the node still shows, and close those it no longer
// runs. It reads the re-sync set a slice at a time, activeMu released in
// between, and streams the answer as it goes: no request holds the lock
// for more than a slice, or the answer in memory.

// readBackPath is the read-back's path on the ingress.
const readBackPath = "/v1/workloads"

const (
	// readBackDefaultLimit and readBackMaxLimit bound the workloads of
	// one answer (the limit parameter); the cursor goes on from there.
	readBackDefaultLimit = 1000
	readBackMaxLimit     = 10000
	// readBackPageBytes ends an answer once its workload objects reach
	// this many bytes, whatever the limit (a page always holds at least
	// one): 10,000 workloads of a 256 KiB line each would be gigabytes.
	readBackPageBytes = 8 << 20
	// readBackScanMax ends an answer once it has looked at this many
	// entries of the set, listed or not, so a filter that matches little
	// in a large set is answered in bounded time; the cursor goes on.
	readBackScanMax = 100_000
	// readBackSlice is the most entries one hold of activeMu visits.
	readBackSlice = 256
	// maxCursorBytes bounds the cursor parameter: a cursor this node gives
	// is at most 5 varints and four 256-byte fields, base64url-encoded.
	maxCursorBytes = 1440
)

// readBackWriteTimeout bounds how long a client may take to read an
// answer: the ingress has no write timeout of its own (3.5), and a client
// that stops reading must not keep the request forever. A variable only so
// a test need not wait 30 s.
var readBackWriteTimeout = 30 * time.Second

// readBackStats are the read-back's counters; the answers themselves are
// counted with the ingress's (nvpair_wlm_ingress_responses_total).
type readBackStats struct {
	listed   atomic.Uint64 // workloads listed in answers
	cutBytes atomic.Uint64 // answers ended by readBackPageBytes
	cutScan  atomic.Uint64 // answers ended by readBackScanMax
}

// readBackQuery is a read-back request's parameters.
type readBackQuery struct {
	limit     int
	requester *string // requesterId: list only workloads whose requesterId is this
	cursor    *readBackCursor
}

// readBackCursor is a place in the re-sync set's pass order: the entry an
// answer ended on, by its order and its key (its origin is this node's).
// The next answer starts after it, at once when the entry is still in the
// set, else at the first entry of a higher order.
type readBackCursor struct {
	order                     uint64
	origin, engine, runID, id string
}

// encode renders the cursor as the opaque token a client passes back.
func (c readBackCursor) encode() string {
	b := binary.AppendUvarint(nil, c.order)
	for _, f := range []string{c.origin, c.engine, c.runID, c.id} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

var errBadCursor = errors.New("not a cursor this node gave; start again without one")

// decodeCursor reads a token that encode wrote.
func decodeCursor(s string) (readBackCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return readBackCursor{}, errBadCursor
	}
	var c readBackCursor
	var n int
	if c.order, n = binary.Uvarint(b); n <= 0 {
		return readBackCursor{}, errBadCursor
	}
	b = b[n:]
	fields := []*string{&c.origin, &c.engine, &c.runID, &c.id}
	for _, f := range fields {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > maxKeyFieldBytes || uint64(len(b)-n) < l {
			return readBackCursor{}, errBadCursor
		}
		*f = string(b[n : n+int(l)])
		b = b[n+int(l):]
	}
	if len(b) != 0 {
		return readBackCursor{}, errBadCursor
	}
	return c, nil
}

// parseReadBackQuery reads the query string: limit, cursor and
// requesterId, each at most once. Anything else is the caller's mistake,
// refused with the parameter named.
func parseReadBackQuery(raw string) (readBackQuery, error) {
	q := readBackQuery{limit: readBackDefaultLimit}
	values, err := url.ParseQuery(raw)
	if err != nil {
		return q, fmt.Errorf("query: %v", err)
	}
	names := make([]string, 0, len(values))
	for k := range values {
		names = append(names, k)
	}
	slices.Sort(names) // one answer for one query, whatever the map's order
	for _, k := range names {
		vs := values[k]
		if len(vs) > 1 {
			return q, fmt.Errorf("%s given %d times: give it once", clipReason(k), len(vs))
		}
		v := vs[0]
		switch k {
		case "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > readBackMaxLimit {
				return q, fmt.Errorf("limit %q: must be a whole number from 1 to %d", clipReason(v), readBackMaxLimit)
			}
			q.limit = n
		case "requesterId":
			if len(v) > maxKeyFieldBytes {
				return q, fmt.Errorf("requesterId is %d bytes, over its %d-byte bound", len(v), maxKeyFieldBytes)
			}
			if !utf8.ValidString(v) {
				return q, errors.New("requesterId must be valid UTF-8")
			}
			q.requester = &v
		case "cursor":
			if len(v) > maxCursorBytes {
				return q, fmt.Errorf("cursor is %d bytes: %w", len(v), errBadCursor)
			}
			c, err := decodeCursor(v)
			if err != nil {
				return q, fmt.Errorf("cursor: %w", err)
			}
			q.cursor = &c
		default:
			return q, fmt.Errorf("unknown query parameter %q: the read-back takes limit, cursor and requesterId", clipReason(k))
		}
	}
	return q, nil
}

// serveReadBack answers GET /v1/workloads: the Origin (403) and Host (421)
// checks first, as on the events path, then the method (405 with Allow),
// then the query (400), then the listing.
func (li *localIngress) serveReadBack(w http.ResponseWriter, r *http.Request) {
	log := func() *slog.Logger {
		return li.m.log.With("channel", "ingress", "remote", r.RemoteAddr, "httpMethod", clipReason(r.Method), "path", readBackPath)
	}
	status, reason := li.refuseBrowsers(r)
	if status == 0 && r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		status, reason = http.StatusMethodNotAllowed, "method must be GET"
	}
	var q readBackQuery
	if status == 0 {
		var err error
		if q, err = parseReadBackQuery(r.URL.RawQuery); err != nil {
			status, reason = http.StatusBadRequest, err.Error()
		}
	}
	if status != 0 {
		reason = clipReason(reason)
		li.m.ingressResponses.inc(statusCode(status))
		li.rejects.log(log(), slog.LevelWarn, r.RemoteAddr, status, "ingress request rejected", "status", status, "reason", reason)
		answer(w, status, reason)
		return
	}
	li.m.ingressResponses.inc("200")
	listed, cut := li.m.readBack(w, q)
	if li.m.log.Enabled(r.Context(), slog.LevelDebug) {
		log().Debug("ingress read-back answered", "status", http.StatusOK, "listed", listed, "cutBy", cut)
	}
}

// readBackItem is one workload of an answer, copied out under activeMu.
type readBackItem struct {
	line     []byte // the entry's re-assertion line: never modified
	cursor   readBackCursor
	deadline time.Time // zero: no lease
}

// readBack streams the answer to q and returns how many workloads it
// listed and which bound, if any, ended it before the end of the set:
// "limit", "bytes" or "scan" ("client" when the client went away).
func (m *Manager) readBack(w http.ResponseWriter, q readBackQuery) (int, string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	// No other origin may read it, not even as an opaque response: the
	// browser drops a cross-origin no-cors answer before a page sees it.
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(readBackWriteTimeout))
	w.WriteHeader(http.StatusOK)

	var buf bytes.Buffer
	buf.WriteString(`{"workloads":[`)
	pos := m.readBackStart(q.cursor)
	listed, pageBytes, visited := 0, 0, 0
	var next *readBackCursor
	cut := ""
	for pos != nil && cut == "" {
		items, last, n, after := m.readBackSlice(pos)
		pos, visited = after, visited+n
		for i, it := range items {
			info, ok := readBackInfo(it.line, q.requester)
			if !ok {
				continue
			}
			if listed > 0 {
				buf.WriteByte(',')
			}
			buf.WriteString(`{"workloadInfo":`)
			buf.Write(info)
			buf.WriteString(`,"leaseDeadline":`)
			if it.deadline.IsZero() {
				buf.WriteString("null")
			} else {
				buf.WriteString(strconv.FormatInt(it.deadline.UnixMilli(), 10))
			}
			buf.WriteByte('}')
			listed++
			pageBytes += len(info)
			// The answer goes out as it is built: a request holds at
			// most 64 KiB of it and one workload, never the page.
			if buf.Len() >= 64<<10 {
				if _, err := w.Write(buf.Bytes()); err != nil {
					return listed, "client"
				}
				buf.Reset()
			}
			if listed < q.limit && pageBytes < readBackPageBytes {
				continue
			}
			cut = "limit"
			if pageBytes >= readBackPageBytes {
				cut = "bytes"
				m.readBacks.cutBytes.Add(1)
			}
			if pos != nil || i < len(items)-1 {
				c := it.cursor
				next = &c
			}
			break
		}
		if cut == "" && pos != nil && visited >= readBackScanMax {
			cut = "scan"
			m.readBacks.cutScan.Add(1)
			next = &last
		}
	}
	buf.WriteString(`],"next":`)
	if next == nil {
		buf.WriteString("null")
	} else {
		buf.WriteString(strconv.Quote(next.encode()))
	}
	buf.WriteString("}\n")
	m.readBacks.listed.Add(uint64(listed))
	if _, err := w.Write(buf.Bytes()); err != nil {
		return listed, "client"
	}
	return listed, cut
}

// cursorOf is the cursor that names e's place.
func cursorOf(e *resyncEntry) readBackCursor {
	return readBackCursor{order: e.order, origin: e.key.origin, engine: e.key.engine, runID: e.key.runID, id: e.key.id}
}

// readBackStart returns the first entry an answer visits: the head of the
// pass order without a cursor; with one, the entry after the cursor's when
// it is still in the set (one lookup), else the first entry of a higher
// order, found by walking from the head a slice at a time, activeMu
// released in between. An entry removed meanwhile keeps its next pointer
// (resyncSet.unlink), so the walk goes on from it.
func (m *Manager) readBackStart(c *readBackCursor) *resyncEntry {
	m.activeMu.Lock()
	defer m.activeMu.Unlock()
	s := m.resync
	if c == nil {
		return s.head
	}
	if e := s.entries[workloadKey{c.origin, c.engine, c.runID, c.id}]; e != nil && e.order == c.order {
		return e.next
	}
	p := s.head
	for {
		for n := 0; n < readBackSlice && p != nil && p.order <= c.order; n++ {
			p = p.next
		}
		if p == nil || p.order > c.order {
			return p
		}
		m.activeMu.Unlock()
		m.activeMu.Lock()
	}
}

// readBackSlice visits up to readBackSlice entries from pos under one hold
// of activeMu and returns the ingress runs among them that are in the set
// and not past their retention, the cursor of the last entry visited, how
// many it visited and where the next slice starts (nil at the end).
func (m *Manager) readBackSlice(pos *resyncEntry) (items []readBackItem, last readBackCursor, visited int, next *resyncEntry) {
	now := m.now()
	m.activeMu.Lock()
	defer m.activeMu.Unlock()
	s := m.resync
	for ; visited < readBackSlice && pos != nil; visited++ {
		e := pos
		pos, last = e.next, cursorOf(e)
		if s.entries[e.key] != e || !e.ingress || (!e.terminalAt.IsZero() && now.Sub(e.terminalAt) >= s.retention) {
			continue
		}
		it := readBackItem{line: e.line, cursor: last}
		it.deadline, _ = m.leases.deadlineOf(workloadRef{e.key.origin, e.key.id}, e.key)
		items = append(items, it)
	}
	return items, last, visited, pos
}

// readBackInfo returns the workload object of a re-assertion line, or
// false when requester is set and the object's requesterId is not it.
func readBackInfo(line []byte, requester *string) (json.RawMessage, bool) {
	params := (&resyncEntry{line: line}).params()
	pm, err := validObjectMembers(params)
	if err != nil {
		return nil, false
	}
	info, ok := member(pm, "workloadInfo")
	if !ok {
		return nil, false
	}
	if requester == nil {
		return info, true
	}
	ms, err := validObjectMembers(info)
	if err != nil {
		return nil, false
	}
	v, ok := member(ms, "requesterId")
	var got *string
	if !ok || json.Unmarshal(v, &got) != nil || got == nil {
		return nil, false
	}
	return info, *got == *requester
}

// writeReadBackMetrics renders the read-back's counters and bounds.
func (m *Manager) writeReadBackMetrics(t *metricsText) {
	t.single("nvpair_wlm_readback_listed_total", "counter", "Workloads listed by the ingress read-back (GET /v1/workloads).", float64(m.readBacks.listed.Load()))
	t.family("nvpair_wlm_readback_pages_cut_total", "counter", "Read-back answers ended before the limit by a bound, with a cursor to go on: bytes (the page's byte bound) or scan (the entries one answer looks at).")
	t.sample("nvpair_wlm_readback_pages_cut_total", []string{"bound"}, []string{"bytes"}, float64(m.readBacks.cutBytes.Load()))
	t.sample("nvpair_wlm_readback_pages_cut_total", []string{"bound"}, []string{"scan"}, float64(m.readBacks.cutScan.Load()))
	t.single("nvpair_wlm_readback_limit_max", "gauge", "The most workloads one read-back answer lists (its limit parameter's maximum).", readBackMaxLimit)
	t.single("nvpair_wlm_readback_page_bytes_max", "gauge", "The bytes of workload objects after which a read-back answer ends, whatever its limit.", readBackPageBytes)
	t.single("nvpair_wlm_readback_scan_max", "gauge", "The entries of the re-sync set one read-back answer looks at before it ends with a cursor.", readBackScanMax)
}
