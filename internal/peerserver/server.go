package peerserver

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/clustertrust"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/wireframe"
)

// Broker is where the server writes the events it takes: the broker's
// writer (brokerio.Writer), in the one order every frame to the broker
// shares.
type Broker interface {
	SendUpsert(info json.RawMessage) error
	SendRemove(r *wireframe.Removal) error
}

// Trust decides whether a client certificate chain is a pinned peer's
// (clustertrust.ClusterTrust), on every request.
type Trust interface {
	Authorize(chain []*x509.Certificate) error
}

// Config is what a Server is given. Every field is required.
type Config struct {
	Self             string // this node's id: no peer may claim it as an origin
	WorkloadMaxBytes int    // --workload-max-bytes; a frame's params may have WorkloadSlack more
	Trust            Trust
	Broker           Broker
	Bodies           *httpguard.BodyBudget // the peer channel's request-body budget
	Waiters          *brokerio.Waiters     // the peer channel's requests waiting on the broker
	// The daemon's counters the server adds to, under source "peer".
	FramesReceived, FieldBoundRefusals, WorkloadBoundRefusals *promtext.CounterVec
	Log                                                       *slog.Logger
}

// Server is the peer port's handler.
type Server struct {
	cfg         Config
	log         *slog.Logger
	dedup       *dedup
	origins     originGuard
	peerRejects *httpguard.SourceLog // the refusals, rate-limited per source

	batchesReceived     atomic.Uint64 // batches processed
	batchFramesReceived atomic.Uint64 // their elements
}

// New returns a Server with an empty dedup and no discovery snapshot: until
// the first, every principal may claim any origin but this node.
func New(cfg Config) *Server {
	return &Server{cfg: cfg, log: cfg.Log, dedup: newDedup(DedupCapacity), peerRejects: httpguard.NewSourceLog()}
}

// refusedOverBound reports whether err refuses a frame for a field over
// its bound, and counts it when it does.
func (s *Server) refusedOverBound(err error) bool {
	if !wireframe.IsFieldTooLong(err) {
		return false
	}
	s.cfg.FieldBoundRefusals.Inc("peer")
	return true
}

// refusedOverWorkloadBound reports whether err refuses a frame for params
// over the workload bound, and counts it when it does.
func (s *Server) refusedOverWorkloadBound(err error) bool {
	if !wireframe.IsWorkloadTooLarge(err) {
		return false
	}
	s.cfg.WorkloadBoundRefusals.Inc("peer")
	return true
}

// DedupLen is how many keys the dedup remembers.
func (s *Server) DedupLen() int { return s.dedup.len() }

// WriteDedupMetrics renders the dedup's series.
func (s *Server) WriteDedupMetrics(t *promtext.Text) {
	t.Single("nvpair_wlm_dedup_hits_total", "counter", "Peer frames not written to the broker because they were already seen.", float64(s.dedup.hits.Load()))
	t.Single("nvpair_wlm_dedup_keys", "gauge", fmt.Sprintf("Keys the peer dedup remembers (at most %d).", DedupCapacity), float64(s.dedup.len()))
	t.Single("nvpair_wlm_dedup_bytes", "gauge", fmt.Sprintf("Estimated heap bytes of the peer dedup's keys: %d per key, whatever the frames carried (at most %d).", DedupEntryBytes, DedupMaxBytes), float64(s.dedup.bytes()))
}

// WriteBatchMetrics renders the batches taken.
func (s *Server) WriteBatchMetrics(t *promtext.Text) {
	t.Single("nvpair_wlm_peer_batches_received_total", "counter", "Batch requests processed on the peer port.", float64(s.batchesReceived.Load()))
	t.Single("nvpair_wlm_peer_batch_frames_received_total", "counter", "Elements of the batches processed on the peer port.", float64(s.batchFramesReceived.Load()))
}

// Event is a validated frame from another member: a removal when
// isRemoval, a lifecycle event otherwise. It is held by value, so that a
// frame costs no allocation of its own on the way to the broker.
type Event struct {
	isRemoval bool
	life      wireframe.Lifecycle
	removal   wireframe.Removal
}

func (e *Event) Method() string {
	if e.isRemoval {
		return wireframe.MethodRemove
	}
	return e.life.Method
}

// origin is the node the event says it came from.
func (e *Event) origin() string {
	if e.isRemoval {
		return e.removal.Ref.Origin
	}
	return e.life.Info.OriginatedFrom
}

// ParseFrame validates a request body from a peer in one pass over it
// (wireframe.Scan); params over maxWorkload bytes, and the slack a frame at
// that bound may have gained on its way (peerwire.WorkloadSlack), are refused
// (*wireframe.WorkloadTooLargeError). It has no side effects.
func ParseFrame(body []byte, maxWorkload int) (Event, error) {
	if err := wireframe.CheckUTF8(body); err != nil {
		return Event{}, err
	}
	var s wireframe.Scan
	if err := s.ScanFrame(body); err != nil {
		return Event{}, fmt.Errorf("not a JSON-RPC frame: %w", err)
	}
	env, err := wireframe.EnvelopeOf(&s)
	if err != nil {
		return Event{}, fmt.Errorf("not a JSON-RPC frame: %w", err)
	}
	if env.JSONRPC != "2.0" {
		return Event{}, errors.New(`jsonrpc must be "2.0"`)
	}
	if err := wireframe.CheckWorkloadBytes(&s, maxWorkload, peerwire.WorkloadSlack); err != nil {
		return Event{}, err
	}
	switch {
	case wireframe.IsLifecycleMethod(env.Method):
		ev, err := s.Lifecycle(env.Method)
		return Event{life: ev}, err
	case env.Method == wireframe.MethodRemove:
		r, err := s.Removal()
		return Event{isRemoval: true, removal: r}, err
	default:
		return Event{}, fmt.Errorf("unknown method %q", env.Method)
	}
}

// ServeHTTP handles POST /v1/workloads/events from another member. The
// client certificate is checked against the pins on every request, so a pin
// removed while a connection stays open takes effect on its next request.
// A request is a single frame, or a batch of them when its Content-Type says
// so (batch.go); the checks that need no body apply to both alike.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every answer advertises the batches this node takes, refusals
	// included: a sender learns what a peer accepts from whatever answer it
	// last had from it, and a sender that never sees the header keeps
	// sending single frames, which is all a stock daemon understands.
	w.Header()[peerwire.BatchHeader] = peerwire.BatchAdvertValue
	log := httpguard.NewRequestLog(s.log, "peer", r.RemoteAddr)
	reject := func(status int, reason string) {
		reason = httpguard.ClipReason(reason)
		s.peerRejects.Log(log.Logger(), slog.LevelWarn, r.RemoteAddr, status, "peer request rejected", "status", status, "reason", reason)
		httpguard.Answer(w, status, reason)
	}
	// A client that is not a pinned peer gets its 403 and loses the
	// connection: keeping it open would let it hold a slot of the peer
	// port's cap for the idle timeout without ever authenticating.
	refuse := func(reason string) {
		w.Header().Set("Connection", "close")
		reject(http.StatusForbidden, reason)
	}
	if r.TLS == nil {
		refuse("TLS required")
		return
	}
	if err := s.cfg.Trust.Authorize(r.TLS.PeerCertificates); err != nil {
		refuse(err.Error())
		return
	}
	principal := clustertrust.PrincipalOf(r.TLS.PeerCertificates[0])
	log.With("peer", principal)
	if r.URL.Path != wireframe.EventsPath {
		reject(http.StatusNotFound, "no such endpoint")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reject(http.StatusMethodNotAllowed, "method must be POST")
		return
	}
	if peerwire.IsBatch(r) {
		s.servePeerBatch(w, r, &log, principal, reject)
		return
	}
	// The body is reserved and read only now that the client has shown
	// its pin: a client without one holds nothing of the peer's budget.
	body, hold, err := s.cfg.Bodies.ReadBody(w, r, wireframe.MaxBytes)
	if err != nil {
		reject(httpguard.BodyRefusal(w, err))
		return
	}
	defer hold.Release()
	// The slot is taken once the body is in, so a client slow to send one
	// never holds it, and given back before the answer is written.
	if !s.cfg.Waiters.Acquire(r.Context()) {
		s.cfg.Waiters.Refuse(w, log.Logger())
		return
	}
	status, reason := s.HandleFrame(&log, principal, body)
	s.cfg.Waiters.Release()
	switch {
	case status == http.StatusOK:
		// Written or already seen: the sender needs no more than that.
		httpguard.Answer(w, http.StatusOK, "ok")
	case status == http.StatusInternalServerError, peerwire.IsOriginRefusal(status, reason):
		// Already logged by HandleFrame: a failed write with its error,
		// a refusal for origin at most once per interval.
		httpguard.Answer(w, status, httpguard.ClipReason(reason))
	default:
		reject(status, reason)
	}
}

// HandleFrame takes one frame from a peer, the body of a single request
// or one element of a batch, so that both are handled by the same code: the
// same validation, the same frames-received count, the same dedup with its
// per-key lock and its re-assertion bypass, the same broker write. It
// answers 200 when the frame was written (reason "") or already seen
// (peerwire.ReasonAlreadySeen); 400 when it is not a valid frame; 403 when principal
// may not send an event of that origin (origin.go), final for a sender
// that reads the reason; 413 when its params are over the workload bound
// (--workload-max-bytes) or its line to the broker would be over the line
// limit, each final for the sender; 500 when the broker write
// failed, which the sender may retry. The reason is not clipped: the
// caller clips what it logs and answers. A failed write is logged here, at
// error, because only here is its cause known, and so is a refusal for
// origin, rate-limited; other rejections are left to the caller, which may
// summarise them.
func (s *Server) HandleFrame(log *httpguard.RequestLog, principal string, body []byte) (status int, reason string) {
	ev, err := ParseFrame(body, s.cfg.WorkloadMaxBytes)
	s.refusedOverBound(err)
	if s.refusedOverWorkloadBound(err) {
		// Final for the sender, like a line over the broker's limit.
		return http.StatusRequestEntityTooLarge, err.Error()
	}
	if err != nil {
		return http.StatusBadRequest, err.Error()
	}
	if status, reason := s.checkPeerOrigin(log, principal, &ev); status != 0 {
		return status, reason
	}
	s.cfg.FramesReceived.Inc("peer", wireframe.MetricMethod(ev.Method()))
	duplicate, err := s.relayPeerEvent(&ev)
	if errors.Is(err, wireframe.ErrLineOverLimit) {
		// Final for the sender: the same frame would be refused again.
		return http.StatusRequestEntityTooLarge, err.Error()
	}
	if err != nil {
		log.Logger().Error("broker write failed", "status", http.StatusInternalServerError, "reason", err)
		return http.StatusInternalServerError, "broker unavailable"
	}
	if log.Enabled(slog.LevelDebug) {
		log.Logger().Debug("peer frame accepted", "duplicate", duplicate)
	}
	if duplicate {
		return http.StatusOK, peerwire.ReasonAlreadySeen
	}
	return http.StatusOK, ""
}

// relayPeerEvent hands a peer's event to the broker once. A write that
// failed, or that the broker writer refused as over the line limit
// (wireframe.ErrLineOverLimit), records nothing in the dedup. A re-assertion bypasses
// the lifecycle dedup: it is how a peer heals a missed delivery, so it must
// reach the broker even when the event itself was seen before. Every
// lifecycle frame written, a re-assertion too, makes its workload's next
// removal new (deliverLifecycle).
//
// The broker is an interface, so what it is handed a pointer to escapes:
// a removal is handed a copy of its own, which leaves the event, and with
// it every lifecycle frame, on the caller's stack.
func (s *Server) relayPeerEvent(ev *Event) (duplicate bool, err error) {
	if ev.isRemoval {
		r := ev.removal
		return s.dedup.deliverRemoval(&r, func() error { return s.cfg.Broker.SendRemove(&r) })
	}
	raw := ev.life.Raw
	return s.dedup.deliverLifecycle(&ev.life, func() error { return s.cfg.Broker.SendUpsert(raw) })
}
