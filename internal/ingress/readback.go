package ingress

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

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// The read-back (spec 3.5.2): GET /v1/workloads on the ingress lists this
// node's ingress-reported workloads, so a producer that restarted can ask
// which of its jobs the node still shows, and close those it no longer
// runs. It reads the state table's pass order a slice at a time, its lock released in
// between, and streams the answer as it goes: no request holds the lock
// for more than a slice, or the answer in memory.
//
// A web page must not be able to make it work (spec 3.5.2): a page's
// request is refused by its Origin or its Fetch Metadata (internal/httpguard/fetchmetadata.go)
// before anything is looked at, and a read-back must carry a header no page
// can send without a CORS preflight, which the daemon never allows. What a
// local program can make it do is bounded: ReadBackMaxInProgress answers
// at once, each looking at no more than ReadBackScanMax entries. And every
// answer looks at the same entries whatever its filter matches, so its time
// does not tell whether a requester has jobs on this node.

// ReadBackPath is the read-back's path on the ingress.
const ReadBackPath = "/v1/workloads"

const (
	// ReadBackDefaultLimit and ReadBackMaxLimit bound the workloads of
	// one answer (the limit parameter); the cursor goes on from there.
	ReadBackDefaultLimit = 1000
	ReadBackMaxLimit     = 10000
	// ReadBackPageBytes ends an answer once its workload objects reach
	// this many bytes, whatever the limit (a page always holds at least
	// one): 10,000 workloads of a 256 KiB line each would be gigabytes.
	ReadBackPageBytes = 8 << 20
	// ReadBackScanMax ends an answer once it has looked at this many
	// entries of the set, listed or not, so a filter that matches little
	// in a large set is answered in bounded time; the cursor goes on.
	ReadBackScanMax = 100_000
	// ReadBackSlice is the most entries one hold of the table's lock visits.
	ReadBackSlice = 256
	// MaxCursorBytes bounds the cursor parameter: a cursor this node gives
	// is at most 5 varints and four 256-byte fields, base64url-encoded.
	MaxCursorBytes = 1440
	// ReadBackHeader must be on every read-back, once, with the value
	// ReadBackHeaderValue. It is not a CORS-safelisted header: a page's
	// no-cors fetch drops it, and its cors fetch sends a preflight first,
	// which the daemon refuses (it carries Origin). A browser that sends
	// no Fetch Metadata still cannot have a page read back.
	ReadBackHeader      = "Workload-Read-Back"
	ReadBackHeaderValue = "1"
	// ReadBackMaxInProgress bounds the read-backs answered at once; one
	// more is refused at once with 503 and Retry-After, never queued. A
	// read-back is a producer's restart-time question, so two at once is
	// room for a restarting producer and one more, and bounds what a local
	// program looping on it takes to two walks' worth of CPU.
	ReadBackMaxInProgress = 2
)

// ReadBackWriteTimeout bounds how long a client may take to read an
// answer: the ingress has no write timeout of its own (3.5), and a client
// that stops reading must not keep the request forever. A variable only so
// a test need not wait 30 s.
var ReadBackWriteTimeout = 30 * time.Second

// Stats are the read-back's counters; the answers themselves are
// counted with the ingress's (nvpair_wlm_ingress_responses_total).
type Stats struct {
	listed   atomic.Uint64 // workloads listed in answers
	cutBytes atomic.Uint64 // answers ended by ReadBackPageBytes
	cutScan  atomic.Uint64 // answers ended by ReadBackScanMax
	scanned  atomic.Uint64 // entries of the set looked at by the walks
	// inProgress is the read-backs being answered, at most
	// ReadBackMaxInProgress; busy counts those refused at that bound.
	inProgress atomic.Int64
	busy       atomic.Uint64
	// fetchMetadataRefused counts the requests refused by their Fetch
	// Metadata on any ingress path (internal/httpguard/fetchmetadata.go): the check is there
	// for the read-back's sake.
	fetchMetadataRefused atomic.Uint64
}

// FetchMetadataRefused counts the requests refused by their Fetch Metadata.
func (s *Stats) FetchMetadataRefused() uint64 { return s.fetchMetadataRefused.Load() }

// Scanned counts the entries of the table the read-back's walks looked at.
func (s *Stats) Scanned() uint64 { return s.scanned.Load() }

// CutBytes and CutScan count the answers a bound ended (the page's bytes,
// the entries looked at); InProgress is the read-backs being answered, and
// Busy those refused because ReadBackMaxInProgress were.
func (s *Stats) CutBytes() uint64  { return s.cutBytes.Load() }
func (s *Stats) CutScan() uint64   { return s.cutScan.Load() }
func (s *Stats) InProgress() int64 { return s.inProgress.Load() }
func (s *Stats) Busy() uint64      { return s.busy.Load() }

// begin takes one of the ReadBackMaxInProgress places, or reports that
// none is free (and counts the refusal). It never waits.
func (s *Stats) begin() bool {
	for {
		n := s.inProgress.Load()
		if n >= ReadBackMaxInProgress {
			s.busy.Add(1)
			return false
		}
		if s.inProgress.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// end gives back the place begin took.
func (s *Stats) end() { s.inProgress.Add(-1) }

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
		if n <= 0 || l > wireframe.MaxKeyFieldBytes || uint64(len(b)-n) < l {
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
	q := readBackQuery{limit: ReadBackDefaultLimit}
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
			return q, fmt.Errorf("%s given %d times: give it once", httpguard.ClipReason(k), len(vs))
		}
		v := vs[0]
		switch k {
		case "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > ReadBackMaxLimit {
				return q, fmt.Errorf("limit %q: must be a whole number from 1 to %d", httpguard.ClipReason(v), ReadBackMaxLimit)
			}
			q.limit = n
		case "requesterId":
			if len(v) > wireframe.MaxKeyFieldBytes {
				return q, fmt.Errorf("requesterId is %d bytes, over its %d-byte bound", len(v), wireframe.MaxKeyFieldBytes)
			}
			if !utf8.ValidString(v) {
				return q, errors.New("requesterId must be valid UTF-8")
			}
			q.requester = &v
		case "cursor":
			if len(v) > MaxCursorBytes {
				return q, fmt.Errorf("cursor is %d bytes: %w", len(v), errBadCursor)
			}
			c, err := decodeCursor(v)
			if err != nil {
				return q, fmt.Errorf("cursor: %w", err)
			}
			q.cursor = &c
		default:
			return q, fmt.Errorf("unknown query parameter %q: the read-back takes limit, cursor and requesterId", httpguard.ClipReason(k))
		}
	}
	return q, nil
}

// checkReadBackHeader returns 400 naming ReadBackHeader unless the
// request carries it once with its value, else 0.
func checkReadBackHeader(h http.Header) (int, string) {
	switch vs := h.Values(ReadBackHeader); {
	case len(vs) == 1 && vs[0] == ReadBackHeaderValue:
		return 0, ""
	case len(vs) == 0:
		return http.StatusBadRequest, "the read-back requires the header " + ReadBackHeader + ": " + ReadBackHeaderValue + " (a web page cannot send it)"
	}
	return http.StatusBadRequest, "header " + ReadBackHeader + " must be given once, as " + ReadBackHeaderValue
}

// serveReadBack answers GET /v1/workloads: the Origin (403), Host (421)
// and Fetch Metadata (403) checks first, as on the events path, then the
// method (405 with Allow), then the read-back header (400), then the
// query (400), then a place among the read-backs in progress (503), then
// the listing. Nothing before the listing looks at the set.
func (s *Server) serveReadBack(w http.ResponseWriter, r *http.Request) {
	log := func() *slog.Logger {
		return s.log.With("channel", "ingress", "remote", r.RemoteAddr, "httpMethod", httpguard.ClipReason(r.Method), "path", ReadBackPath)
	}
	status, reason := s.refusePages(r)
	if status == 0 && r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		status, reason = http.StatusMethodNotAllowed, "method must be GET"
	}
	if status == 0 {
		status, reason = checkReadBackHeader(r.Header)
	}
	var q readBackQuery
	if status == 0 {
		var err error
		if q, err = parseReadBackQuery(r.URL.RawQuery); err != nil {
			status, reason = http.StatusBadRequest, err.Error()
		}
	}
	if status == 0 && !s.cfg.Stats.begin() {
		w.Header().Set("Retry-After", "1")
		status, reason = http.StatusServiceUnavailable, fmt.Sprintf("%d read-backs are in progress, the most this node answers at once; retry after 1 s", ReadBackMaxInProgress)
	}
	if status != 0 {
		reason = httpguard.ClipReason(reason)
		s.cfg.Responses.Inc(httpguard.StatusCode(status))
		s.rejects.Log(log(), slog.LevelWarn, r.RemoteAddr, status, "ingress request rejected", "status", status, "reason", reason)
		httpguard.Answer(w, status, reason)
		return
	}
	defer s.cfg.Stats.end()
	s.cfg.Responses.Inc("200")
	listed, cut := s.readBack(w, q)
	if s.log.Enabled(r.Context(), slog.LevelDebug) {
		log().Debug("ingress read-back answered", "status", http.StatusOK, "listed", listed, "cutBy", cut)
	}
}

// readBack streams the answer to q and returns how many workloads it
// listed and which bound, if any, ended it before the end of the set:
// "limit", "bytes" or "scan" ("client" when the client went away).
//
// The walk looks at the same entries whatever the filter matches: from
// the cursor to the end of the set, or to ReadBackScanMax entries (rounded
// up to a slice), and never stops at the limit. An answer that stopped at
// its limit (or its byte bound) looks on without listing, only to learn
// whether a further workload matched: if one did, next names the last one
// listed; if not, next goes on from where the walk ended, or is null at
// the end of the set. Were the walk to stop at the limit, a filter that
// matches early would be answered in one slice and one that matches
// nothing after every entry: the time of ?requesterId=X&limit=1 would say
// whether X has jobs on this node. What still differs is the work on the
// workloads listed, at most limit of them, which is the answer itself.
func (s *Server) readBack(w http.ResponseWriter, q readBackQuery) (int, string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	// No other origin may read it, not even as an opaque response: the
	// browser drops a cross-origin no-cors answer before a page sees it.
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(ReadBackWriteTimeout))
	w.WriteHeader(http.StatusOK)

	var buf bytes.Buffer
	buf.WriteString(`{"workloads":[`)
	pos := s.cfg.Table.ReadStart(q.cursor.mark(), ReadBackSlice, func(n int) { s.cfg.Stats.scanned.Add(uint64(n)) })
	listed, pageBytes, visited := 0, 0, 0
	var last, lastListed readBackCursor
	// stopped is the bound that ended the listing ("limit" or "bytes"),
	// more whether a workload to list was found after it.
	stopped, more := "", false
	for !pos.AtEnd() && visited < ReadBackScanMax {
		want := 0
		if stopped == "" {
			want = q.limit - listed
		}
		v := s.cfg.Table.ReadSlice(pos, q.requester, want, ReadBackSlice)
		s.cfg.Stats.scanned.Add(uint64(v.Visited))
		pos, visited, last = v.Next, visited+v.Visited, cursorOf(v.Last)
		more = more || v.Beyond
		for i, it := range v.Items {
			info, ok := readBackInfo(it.Line)
			if !ok {
				continue
			}
			if listed > 0 {
				buf.WriteByte(',')
			}
			buf.WriteString(`{"workloadInfo":`)
			buf.Write(info)
			buf.WriteString(`,"leaseDeadline":`)
			if it.Deadline.IsZero() {
				buf.WriteString("null")
			} else {
				buf.WriteString(strconv.FormatInt(it.Deadline.UnixMilli(), 10))
			}
			buf.WriteByte('}')
			listed++
			pageBytes += len(info)
			lastListed = cursorOf(it.Mark)
			// The answer goes out as it is built: a request holds at
			// most 64 KiB of it and one workload, never the page.
			if buf.Len() >= 64<<10 {
				if _, err := w.Write(buf.Bytes()); err != nil {
					return listed, "client"
				}
				buf.Reset()
			}
			switch {
			case pageBytes >= ReadBackPageBytes:
				stopped = "bytes"
			case listed >= q.limit:
				stopped = "limit"
			default:
				continue
			}
			more = more || i < len(v.Items)-1
			break
		}
	}
	var next *readBackCursor
	cut := ""
	switch {
	case stopped != "" && more:
		next, cut = &lastListed, stopped
	case !pos.AtEnd():
		next, cut = &last, "scan"
	}
	switch cut {
	case "bytes":
		s.cfg.Stats.cutBytes.Add(1)
	case "scan":
		s.cfg.Stats.cutScan.Add(1)
	}
	buf.WriteString(`],"next":`)
	if next == nil {
		buf.WriteString("null")
	} else {
		buf.WriteString(strconv.Quote(next.encode()))
	}
	buf.WriteString("}\n")
	s.cfg.Stats.listed.Add(uint64(listed))
	if _, err := w.Write(buf.Bytes()); err != nil {
		return listed, "client"
	}
	return listed, cut
}

// cursorOf is the cursor that names an entry's place.
func cursorOf(r statetable.ReadMark) readBackCursor {
	return readBackCursor{order: r.Order, origin: r.Key.Origin, engine: r.Key.Engine, runID: r.Key.RunID, id: r.Key.ID}
}

// mark is the table's name for the cursor's place; nil for none.
func (c *readBackCursor) mark() *statetable.ReadMark {
	if c == nil {
		return nil
	}
	return &statetable.ReadMark{Order: c.order, Key: wireframe.WorkloadKey{Origin: c.origin, Engine: c.engine, RunID: c.runID, ID: c.id}}
}

// readBackInfo returns the workload object of a re-assertion line.
func readBackInfo(line []byte) (json.RawMessage, bool) {
	params := statetable.RunLine(line).Params()
	pm, err := wireframe.ValidObjectMembers(params)
	if err != nil {
		return nil, false
	}
	return wireframe.MemberNamed(pm, "workloadInfo")
}

// WriteMetrics renders the read-back's counters and bounds, and the
// ingress's Fetch Metadata refusals.
func (st *Stats) WriteMetrics(t *promtext.Text) {
	t.Single("nvpair_wlm_readback_listed_total", "counter", "Workloads listed by the ingress read-back (GET /v1/workloads).", float64(st.listed.Load()))
	t.Family("nvpair_wlm_readback_pages_cut_total", "counter", "Read-back answers ended before the limit by a bound, with a cursor to go on: bytes (the page's byte bound) or scan (the entries one answer looks at).")
	t.Sample("nvpair_wlm_readback_pages_cut_total", []string{"bound"}, []string{"bytes"}, float64(st.cutBytes.Load()))
	t.Sample("nvpair_wlm_readback_pages_cut_total", []string{"bound"}, []string{"scan"}, float64(st.cutScan.Load()))
	t.Single("nvpair_wlm_readback_limit_max", "gauge", "The most workloads one read-back answer lists (its limit parameter's maximum).", ReadBackMaxLimit)
	t.Single("nvpair_wlm_readback_page_bytes_max", "gauge", "The bytes of workload objects after which a read-back answer ends, whatever its limit.", ReadBackPageBytes)
	t.Single("nvpair_wlm_readback_scan_max", "gauge", "The entries of the re-sync set one read-back answer looks at before it ends with a cursor.", ReadBackScanMax)
	t.Single("nvpair_wlm_readback_entries_scanned_total", "counter", "Entries of the re-sync set the read-back's walks looked at, listed or not: an answer looks at the same entries whatever its filter matches.", float64(st.scanned.Load()))
	t.Single("nvpair_wlm_readback_in_progress", "gauge", "Read-backs being answered.", float64(st.inProgress.Load()))
	t.Single("nvpair_wlm_readback_in_progress_max", "gauge", "The most read-backs answered at once; one more is refused 503 with Retry-After.", ReadBackMaxInProgress)
	t.Single("nvpair_wlm_readback_busy_refusals_total", "counter", "Read-backs refused 503 because the most were in progress.", float64(st.busy.Load()))
	n := st.fetchMetadataRefused.Load()
	t.Single("nvpair_wlm_ingress_fetch_metadata_refusals_total", "counter", "Ingress requests refused 403 because a browser marked them as a web page's (Sec-Fetch-Site other than none, or Sec-Fetch-Mode no-cors).", float64(n))
}
