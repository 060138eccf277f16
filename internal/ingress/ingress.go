package ingress

import (
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// LeaseHeader carries a lease on an ingress lifecycle frame, in seconds;
// the relay reads its values (Relay.Ingest).
const LeaseHeader = "Workload-Lease"

// Relay is what the ingress asks of the daemon, and all it may: the
// handlers never see the daemon's state.
type Relay interface {
	// Ingest takes a producer's frame, its body and the values of its
	// Workload-Lease header, and returns once it is written to the broker
	// and committed, durably, or refused. Its error decides the answer
	// (refusalOf): ErrBadFrame, ErrBrokerWrite, ErrNotDurable,
	// *JournalDownError, *AtLimitError, *brokerio.BusyError, an ownership refusal
	// (statetable.IsBrokerOwned), *wireframe.WorkloadTooLargeError or
	// wireframe.ErrLineOverLimit.
	Ingest(body []byte, lease []string) (Frame, error)
	// NodeInfo is the answer to GET /v1/node.
	NodeInfo() NodeInfo
}

// Frame names what a producer posted, for the log: its method and
// workload id, as far as they could be read.
type Frame struct{ Method, WorkloadID string }

// Table is what the read-back reads of the state table.
type Table interface {
	ReadStart(mark *statetable.ReadMark, slice int, visited func(int)) statetable.ReadPos
	ReadSlice(pos statetable.ReadPos, requester *string, want, slice int) statetable.ReadVisit
}

// Config is what a Server is given. Every field is required.
type Config struct {
	Addr             string // a loopback address; New refuses any other
	WorkloadMaxBytes int    // --workload-max-bytes
	Relay            Relay
	Table            Table
	Conns            *httpguard.ConnLimiter // the ingress's connection cap
	Bodies           *httpguard.BodyBudget  // its request-body budget
	Waiters          *brokerio.Waiters      // its requests waiting on the broker
	Stats            *Stats                 // the read-back's and Fetch Metadata's counters
	// The daemon's counters the ingress adds to.
	Responses, WorkloadBoundRefusals *promtext.CounterVec
	Log                              *slog.Logger
}

// New returns the ingress's server for cfg.Addr, not yet bound (Listen).
// A non-loopback address is refused.
func New(cfg Config) (*Server, error) {
	b, err := httpguard.NewLoopbackBinding("local ingress", cfg.Addr, cfg.Conns)
	if err != nil {
		return nil, err
	}
	return &Server{LoopbackBinding: b, cfg: cfg, log: cfg.Log, rejects: httpguard.NewSourceLog()}, nil
}

// IdleTimeout is how long the ingress keeps an idle keep-alive
// connection from a producer.
const IdleTimeout = 60 * time.Second

// Errors the Relay's Ingest returns, mapped to the producer's answer. A
// frame whose line to the broker would be over its line limit is
// wireframe.ErrLineOverLimit: 413, final.
var (
	ErrBadFrame    = errors.New("bad frame")          // 400: the producer's mistake
	ErrBrokerWrite = errors.New("broker unavailable") // 500: the producer may retry
	// ErrNotDurable is a frame applied whose journal record could not be
	// made durable: 500, and a retry of it is harmless.
	ErrNotDurable = errors.New("not durable: the journal write failed")
)

// Server is the opt-in, plaintext, loopback-only HTTP door through
// which third-party producers on this machine report their workloads.
//
// Loopback does not keep a browser out: a web page can POST to 127.0.0.1,
// and a DNS-rebinding page reaches it under its own host name. So before
// the body is read, a request is refused when it carries an Origin header
// (only browsers send one), when its Host is not a loopback name with the
// bound port (a rebinding page's Host is its own name) or when its content
// type is not JSON (the only types a page can send without a preflight are
// form and text types).
type Server struct {
	*httpguard.LoopbackBinding
	cfg     Config
	log     *slog.Logger
	rejects *httpguard.SourceLog // its refusals and failures, rate-limited per source
}

// EnvelopeAllowance is what an ingress body may hold beyond its
// params' byte bound: the envelope (jsonrpc, method, an id) and the
// whitespace a pretty-printing producer puts around them, a few hundred
// bytes in practice.
const EnvelopeAllowance = 16 << 10

// BodyMax is the ingress's body cap: the workload byte bound plus
// the envelope allowance, 32 KiB at the defaults, never more than the
// 1 MiB frame cap. A body over it could only carry params over the bound,
// so it is refused (413) before any of it is reserved or read; and the
// ingress's connections together, 512 at the default cap, can then reserve
// 16 MiB at most, half the ingress's body budget, so bodies declared and
// never sent cannot take the room that producers' posts need.
func BodyMax(workloadMax int) int64 {
	return min(int64(workloadMax)+EnvelopeAllowance, wireframe.MaxBytes)
}

// Start serves the ingress on ln, which Listen bound.
func (s *Server) Start(wg *sync.WaitGroup, ln net.Listener) *http.Server {
	return s.Serve(wg, ln, s, IdleTimeout, s.log)
}

// ServeHTTP answers a producer, logs the answer and counts it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == ReadBackPath {
		s.serveReadBack(w, r) // readback.go: the same Origin and Host checks first
		return
	}
	if r.URL.Path == NodeInfoPath {
		s.serveNodeInfo(w, r) // nodeinfo.go: the same browser checks first
		return
	}
	status, reason, f := s.decide(w, r)
	reason = httpguard.ClipReason(reason)
	s.cfg.Responses.Inc(httpguard.StatusCode(status))
	// The method and path come from the request: clipped, like every
	// value a client chooses.
	log := httpguard.NewRequestLog(s.log, "ingress", r.RemoteAddr)
	log.With("httpMethod", httpguard.ClipReason(r.Method))
	log.With("path", httpguard.ClipReason(r.URL.Path))
	switch {
	case status == http.StatusOK:
		if log.Enabled(slog.LevelDebug) {
			log.Logger().Debug("ingress frame accepted", "method", f.Method, "id", httpguard.ClipLogged(f.WorkloadID))
		}
	case brokerio.IsBusy(status, reason):
		s.cfg.Waiters.NoteRefusal(s.log)
	case status >= http.StatusInternalServerError:
		s.rejects.Log(log.Logger(), slog.LevelError, r.RemoteAddr, status, "ingress frame not accepted", "status", status, "reason", reason)
	default:
		s.rejects.Log(log.Logger(), slog.LevelWarn, r.RemoteAddr, status, "ingress request rejected", "status", status, "reason", reason)
	}
	httpguard.Answer(w, status, reason)
}

// decide runs the checks in a fixed order, so every request gets one
// deterministic answer, and ingests the frame when they pass. The first
// checks are decided from the headers alone.
func (s *Server) decide(w http.ResponseWriter, r *http.Request) (int, string, Frame) {
	if status, reason := s.checkRequest(r); status != 0 {
		// The body is not read, so the connection cannot be reused: closing
		// it also means the answer goes out at once, even when the declared
		// body never arrives.
		w.Header().Set("Connection", "close")
		if status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", http.MethodPost) // RFC 9110: a 405 names what is allowed
		}
		return status, reason, Frame{}
	}
	// Reserved and read only once the checks above passed, so a page or a
	// misdirected request holds nothing of the ingress's budget; given
	// back once the frame is written.
	body, hold, err := s.cfg.Bodies.ReadBody(w, r, BodyMax(s.cfg.WorkloadMaxBytes))
	if err != nil {
		status, reason := httpguard.BodyRefusal(w, err)
		if status == http.StatusRequestEntityTooLarge {
			// The cap follows the workload bound: the producer is told the
			// bound it met, and it is counted, as a frame over it is.
			s.cfg.WorkloadBoundRefusals.Inc("ingress")
			reason = fmt.Sprintf("%s: its params would be over their %d-byte bound (--workload-max-bytes)", reason, s.cfg.WorkloadMaxBytes)
		}
		return status, reason, Frame{}
	}
	defer hold.Release()
	f, err := s.cfg.Relay.Ingest(body, r.Header.Values(LeaseHeader))
	if err == nil {
		return http.StatusOK, "ok", f
	}
	status, reason := refusalOf(w, err)
	return status, reason, f
}

// refusalOf maps the Relay's Ingest error to the producer's answer, setting the
// headers it needs.
func refusalOf(w http.ResponseWriter, err error) (int, string) {
	var atLimit *AtLimitError
	var down *JournalDownError
	var busy *brokerio.BusyError
	var tooLarge *wireframe.WorkloadTooLargeError
	switch {
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge, err.Error()
	case errors.As(err, &busy):
		brokerio.SetBusyHeaders(w)
		return http.StatusServiceUnavailable, err.Error()
	case statetable.IsBrokerOwned(err):
		return http.StatusConflict, err.Error()
	case errors.As(err, &atLimit):
		w.Header().Set("Retry-After", strconv.Itoa(atLimit.RetryAfterSeconds()))
		return http.StatusServiceUnavailable, err.Error()
	case errors.As(err, &down):
		w.Header().Set("Retry-After", strconv.Itoa(down.RetryAfterSeconds()))
		return http.StatusServiceUnavailable, err.Error()
	case errors.Is(err, wireframe.ErrLineOverLimit):
		return http.StatusRequestEntityTooLarge, err.Error()
	case errors.Is(err, ErrBrokerWrite), errors.Is(err, ErrNotDurable):
		return http.StatusInternalServerError, err.Error()
	}
	return http.StatusBadRequest, err.Error()
}

// checkRequest applies the checks that need no body, in order, and returns
// the status and reason of the first that fails, or 0.
func (s *Server) checkRequest(r *http.Request) (int, string) {
	if status, reason := s.refusePages(r); status != 0 { // internal/httpguard/fetchmetadata.go
		return status, reason
	}
	if r.URL.Path != wireframe.EventsPath {
		return http.StatusNotFound, "no such endpoint; POST to " + wireframe.EventsPath
	}
	if r.Method != http.MethodPost {
		return http.StatusMethodNotAllowed, "method must be POST"
	}
	if ct := r.Header.Values("Content-Type"); len(ct) != 1 || !isJSONMediaType(ct[0]) {
		return http.StatusUnsupportedMediaType, "Content-Type must be application/json"
	}
	return 0, ""
}

func isJSONMediaType(ct string) bool {
	if ct == "application/json" {
		return true // what producers send, without a parse
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// JournalDownError is an ingress frame refused before anything is written
// because the journal cannot make a record durable now (spec 5.3): 503,
// with the time until the next rebuild of the journal as Retry-After.
type JournalDownError struct{ After time.Duration }

func (e *JournalDownError) Error() string {
	return fmt.Sprintf("not durable: the journal is down and being rebuilt; nothing was written; retry after %d s", e.RetryAfterSeconds())
}

func (e *JournalDownError) RetryAfterSeconds() int {
	return max(1, int((e.After+time.Second-1)/time.Second))
}

// AtLimitError is an ingress frame refused because the re-sync set is at a
// bound: it would start a new workload while the set holds
// --max-live-workloads, or take the set's bytes past
// --max-live-workload-bytes. 503, with the time until room may free as
// Retry-After.
type AtLimitError struct {
	Bound statetable.Limit
	Limit int64
	Held  int64 // the set's bytes, for the byte bound
	After time.Duration
}

func (e *AtLimitError) Error() string {
	if e.Bound == statetable.LimitBytes {
		return fmt.Sprintf("this node holds %d bytes of workloads, and this frame would take it past its limit of %d (--max-live-workload-bytes); retry after %d s", e.Held, e.Limit, e.RetryAfterSeconds())
	}
	return fmt.Sprintf("this node holds %d workloads, its limit (--max-live-workloads); retry after %d s", e.Limit, e.RetryAfterSeconds())
}

func (e *AtLimitError) RetryAfterSeconds() int {
	return max(1, int((e.After+time.Second-1)/time.Second))
}

// refusePages applies the ingress's browser checks, in order: Origin (403)
// and Host (421) as on every loopback listener, then Fetch Metadata (403),
// counted. It returns 0 when none applies. Every ingress path runs it
// first, before it reads a body or looks at the re-sync set.
func (s *Server) refusePages(r *http.Request) (int, string) {
	if status, reason := s.RefuseBrowsers(r); status != 0 {
		return status, reason
	}
	status, reason := httpguard.RefuseFetchMetadata(r.Header)
	if status != 0 {
		s.cfg.Stats.fetchMetadataRefused.Add(1)
	}
	return status, reason
}
