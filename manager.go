package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/pairinstall"
	"nvpair-workload-manager/internal/peersend"
	"nvpair-workload-manager/internal/peerserver"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/ratelog"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// Defaults for the settings a Config may leave zero.
const (
	defaultResyncInterval = 30 * time.Second
	// defaultMaxLiveWorkloads bounds the re-sync set. An entry costs about
	// its re-assertion line plus 200 bytes, so 100,000 typical workloads
	// hold some 60 MB, and a heartbeat pass over them takes a batching
	// peer a few seconds of a 30 s interval.
	defaultMaxLiveWorkloads = 100_000
	// defaultMaxEndedBytes bounds the ends kept for members that have not
	// taken them: 64 MiB is some 150,000 ends of typical frames, past what
	// a member away for an hour of a busy node misses.
	defaultMaxEndedBytes = 64 << 20
	// defaultMemberClaim is how long a member that left discovery keeps
	// its claim on the ends it lacks: PAIR's broker keeps finished jobs
	// for 7 days, so a member back within them is told how each ended.
	defaultMemberClaim = 7 * 24 * time.Hour
	// maxMaxLiveWorkloads is the largest --max-live-workloads accepted: a
	// set that size holds gigabytes, past any node this daemon serves.
	maxMaxLiveWorkloads = 10_000_000
	// The shutdown budget (spec 4, "Shutdown"): once the broker closes
	// stdin, PAIR waits 3 s before it terminates the daemon, so the
	// daemon's own deadlines add up to 2 s, whatever its peers and its
	// broker do, and leave the rest for the process's exit on a busy
	// machine. The listeners' grace lets requests in flight finish their
	// broker write (milliseconds with a broker that reads; nothing helps
	// one that does not); the drain gets the rest, for the peers to catch up.
	defaultDrainTimeout = 1500 * time.Millisecond
	serverShutdownGrace = 500 * time.Millisecond
)

// Config is everything a Manager needs. Zero durations and a zero
// BrokerLineMax take their defaults.
type Config struct {
	NodeID         string
	NodeIDFile     string // where NodeID was read from, for the startup log
	Version        string
	PeerAddr       string // the inter-node listener, e.g. ":14320"
	ClusterDir     string
	ResyncInterval time.Duration
	DrainTimeout   time.Duration // how long the peers may catch up at shutdown
	BrokerLineMax  int           // longest line to the broker, newline included; 0: 256 KiB
	// MaxLiveWorkloads bounds the re-sync set (live workloads and terminal
	// ones within their retention); 0: defaultMaxLiveWorkloads.
	MaxLiveWorkloads int
	// MaxLiveWorkloadBytes bounds the bytes of the re-sync set's
	// re-assertion lines; 0: defaultMaxLiveWorkloadBytes.
	MaxLiveWorkloadBytes int64
	// WorkloadMaxBytes bounds one frame's params (its workloadInfo and
	// every member beside it) on every path; 0: defaultWorkloadMaxBytes.
	// A request body need never be longer than this plus its envelope.
	WorkloadMaxBytes int
	// MaxEndedBytes bounds the ends kept until every member has them
	// (--max-ended-bytes); 0: defaultMaxEndedBytes.
	MaxEndedBytes int64
	// MemberClaim is how long a member that left keeps its claim on the
	// ends it lacks; 0: defaultMemberClaim.
	MemberClaim time.Duration
	// JournalPath is the state table's journal (spec 5.3), in the app
	// dir; "" keeps no journal.
	JournalPath string
	Conns       httpguard.ConnLimits // the listeners' connection caps
	In          io.Reader            // frames from the broker
	Out         io.Writer            // frames to the broker
	Logger      *slog.Logger
	LogLevel    *slog.LevelVar // changed by log/set-level; may be nil

	// NodeIDAliases are this node's other ids (node-id.json's, where
	// identity.json names another): the ingress takes a producer's frame
	// naming one as this node's and relays it under NodeID (spec 3.4.1).
	NodeIDAliases []string
}

// frameSource says where a local-origin frame entered the daemon.
type frameSource int

const (
	fromBroker  frameSource = iota // the broker, on the local channel
	fromIngress                    // a producer, on the loopback ingress
)

// Manager is the daemon: it relays between the broker, the peers and the
// optional loopback ingress.
//
// Lock order: ingestMu -> the state table's lock (the design card's
// activeMu: the ingress's checks), and discoveryMu -> broadcaster.mu ->
// the table's lock (a target change joins or leaves a member). ingestMu
// and discoveryMu are never held together. Leaf locks, taken under any of
// these and never around them: brokerio.Writer.mu, ingressFlight.mu,
// pairinstall.ClusterTrust.mu, dedup.mu, the journal's append lock (under
// the table's). No lock is held across a network write to a peer or a
// journal write: each peer's sender takes a slice of the table under its
// lock and sends with none, and the journal writes its groups on its own.
//
// The broker write holds no lock either (brokergroup.go): ingestMu is held
// only while an ingress frame takes its place in the broker order. The
// caller that writes a group (the leader) then runs the group's ingress
// commits, which take the table's lock. No holder of it ever waits for a
// broker write, so the lead closes no cycle (spec 6).
type Manager struct {
	cfg   Config
	log   *slog.Logger
	out   *brokerio.Writer
	trust *pairinstall.ClusterTrust
	bcast *peersend.Broadcaster // the outbound side of the peer port
	peers *peerserver.Server    // its inbound side
	now   func() time.Time

	// ingestMu keeps concurrent ingress posts (and lease expiries) in one
	// order at the broker and in the table: it is held while a frame takes
	// its place in the broker order, and the frame's commit runs after its
	// write in that order (ingressorder.go). Only the ingress and the
	// expiry take it.
	ingestMu sync.Mutex
	// ingressFlight counts the ingress frames in flight: placed in the
	// broker order, not yet committed or failed (ingressorder.go).
	ingressFlight ingressInFlight

	// table is everything this node asserts (internal/statetable): every
	// path to the peers and to disk reads it.
	table *statetable.Table
	// journal keeps what the table must not lose across a restart
	// (tablejournal.go); its file is nil without a JournalPath or when it
	// could not be opened.
	journal tableJournal
	// lastEvicted is the table's eviction count at the last prune, for
	// the one line per burst (pruneTable).
	lastEvicted uint64
	evictLog    ratelog.Burst

	// leases counts the leases' events (lease.go); the leases themselves
	// live on their runs in the table. leaseUnit is the length of one
	// second of Workload-Lease: a second, shorter only in tests.
	leases       leaseStats
	leaseUnit    time.Duration
	ingressStats ingress.Stats // the read-back's and Fetch Metadata's counters (internal/ingress), kept while the ingress is off too

	// discoveryMu guards lastNodes and serializes target refreshes.
	discoveryMu sync.Mutex
	lastNodes   []discoveredNode

	// peerWaiters and ingressWaiters bound the requests of each channel
	// that wait on the broker write at once (brokerwaiters.go).
	peerWaiters, ingressWaiters *brokerio.Waiters

	ingress *ingress.Server  // set by EnableLocalIngress before Run
	metrics *metricsEndpoint // set by EnableMetrics before Run

	// Metrics the Manager itself owns; the components keep their own.
	framesReceived          *promtext.CounterVec     // source, method
	ingressResponses        *promtext.CounterVec     // code
	conns                   httpguard.ListenerLimits // the listeners' connection caps
	bodies                  httpguard.RequestBodies  // request-body bytes held at once, per channel
	serverHandshakeFailures atomic.Uint64
	untrackedLog            ratelog.Burst
	fieldBoundRefusals      *promtext.CounterVec // source: frames refused for a field over its bound
	fieldBoundLog           ratelog.Burst        // the local channel's such refusals
	workloadBoundRefusals   *promtext.CounterVec // source: frames refused for params over --workload-max-bytes
	workloadBoundLog        ratelog.Burst        // the local channel's such refusals
	untrackedBytesLog       ratelog.Burst        // broker frames not kept: the re-sync set was at its byte bound

	// brokerLines counts the broker's bad lines and rate-limits the
	// warnings they cause (brokerlinelog.go).
	brokerLines *brokerio.LineLog

	shutdownOnce sync.Once
	shutdownReq  chan struct{} // closed by a shutdown request from the broker

	addrMu   sync.Mutex // guards peerAddr
	peerAddr net.Addr
}

// NewManager validates cfg and returns a Manager that has not started.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("node id is empty")
	}
	if cfg.In == nil || cfg.Out == nil {
		return nil, errors.New("the local channel needs both directions")
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = defaultResyncInterval
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = defaultDrainTimeout
	}
	if cfg.MaxLiveWorkloads <= 0 {
		cfg.MaxLiveWorkloads = defaultMaxLiveWorkloads
	}
	if cfg.MaxLiveWorkloadBytes == 0 {
		cfg.MaxLiveWorkloadBytes = defaultMaxLiveWorkloadBytes
	}
	if err := checkMaxLiveWorkloadBytes(cfg.MaxLiveWorkloadBytes); err != nil {
		return nil, fmt.Errorf("re-sync set byte bound %d: %w", cfg.MaxLiveWorkloadBytes, err)
	}
	if cfg.WorkloadMaxBytes == 0 {
		cfg.WorkloadMaxBytes = wireframe.DefaultWorkloadMaxBytes
	}
	if err := wireframe.CheckWorkloadMaxBytes(cfg.WorkloadMaxBytes); err != nil {
		return nil, fmt.Errorf("workload byte bound %d: %w", cfg.WorkloadMaxBytes, err)
	}
	if cfg.BrokerLineMax == 0 {
		cfg.BrokerLineMax = wireframe.DefaultBrokerLineMax
	}
	if err := wireframe.CheckBrokerLineMax(cfg.BrokerLineMax); err != nil {
		return nil, fmt.Errorf("broker line limit %d: %w", cfg.BrokerLineMax, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxEndedBytes <= 0 {
		cfg.MaxEndedBytes = defaultMaxEndedBytes
	}
	if cfg.MemberClaim <= 0 {
		cfg.MemberClaim = defaultMemberClaim
	}
	trust := pairinstall.NewClusterTrust(cfg.ClusterDir, cfg.Logger)
	m := &Manager{
		cfg:         cfg,
		log:         cfg.Logger,
		out:         brokerio.NewWriter(cfg.Out, cfg.BrokerLineMax),
		trust:       trust,
		now:         time.Now,
		leaseUnit:   time.Second,
		shutdownReq: make(chan struct{}),

		peerWaiters:    brokerio.NewWaiters("peer", brokerio.WaitersMax),
		ingressWaiters: brokerio.NewWaiters("ingress", brokerio.WaitersMax),

		framesReceived:     promtext.NewCounterVec(),
		ingressResponses:   promtext.NewCounterVec(),
		fieldBoundRefusals: promtext.NewCounterVec(),
		conns:              httpguard.NewListenerLimits(cfg.Conns),
		brokerLines:        brokerio.NewLineLog(),
		bodies:             httpguard.NewRequestBodies(),

		workloadBoundRefusals: promtext.NewCounterVec(),
	}
	m.leases.failures = promtext.NewCounterVec()
	m.table = statetable.New(statetable.Config{
		Self:          cfg.NodeID,
		Retention:     2 * cfg.ResyncInterval,
		MaxLive:       cfg.MaxLiveWorkloads,
		MaxLiveBytes:  cfg.MaxLiveWorkloadBytes,
		MaxEndedBytes: cfg.MaxEndedBytes,
		MemberClaim:   cfg.MemberClaim,
		Now:           func() time.Time { return m.now() },
		LeaseUnit:     time.Second,
	})
	m.journal = tableJournal{path: cfg.JournalPath, log: cfg.Logger, table: m.table}
	m.peers = peerserver.New(peerserver.Config{
		Self:                  cfg.NodeID,
		WorkloadMaxBytes:      cfg.WorkloadMaxBytes,
		Trust:                 trust,
		Broker:                m.out,
		Bodies:                m.bodies.Peer,
		Waiters:               m.peerWaiters,
		FramesReceived:        m.framesReceived,
		FieldBoundRefusals:    m.fieldBoundRefusals,
		WorkloadBoundRefusals: m.workloadBoundRefusals,
		Log:                   cfg.Logger,
	})
	m.bcast = peersend.New(cfg.Logger, trust, m.table, cfg.ResyncInterval)
	return m, nil
}

// setLeaseUnit shortens a lease's second, in tests, before Run.
func (m *Manager) setLeaseUnit(d time.Duration) {
	m.leaseUnit = d
	m.table.SetLeaseUnit(d)
}

// PeerAddr returns the inter-node listener's address once Run has bound it.
func (m *Manager) PeerAddr() net.Addr {
	m.addrMu.Lock()
	defer m.addrMu.Unlock()
	return m.peerAddr
}

// Run binds the listeners, announces the daemon to the broker and relays
// until ctx ends, the broker closes the local channel or asks for shutdown.
// It returns an error only when the daemon could not start; every shutdown
// after that is clean.
func (m *Manager) Run(ctx context.Context) error {
	peerLn, err := net.Listen("tcp", m.cfg.PeerAddr)
	if err != nil {
		return &httpguard.AddrError{Listener: peerListenerName, Addr: m.cfg.PeerAddr, Err: err}
	}
	peerLn = m.conns.Peer.Listen(peerLn)
	m.addrMu.Lock()
	m.peerAddr = peerLn.Addr()
	m.addrMu.Unlock()
	// The optional loopback listeners are bound before anything starts, so
	// a taken port fails startup.
	var extras []loopbackServer
	if m.ingress != nil {
		extras = append(extras, m.ingress)
	}
	if m.metrics != nil {
		extras = append(extras, m.metrics)
	}
	listeners := []net.Listener{peerLn}
	for _, x := range extras {
		ln, err := x.Listen()
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return err
		}
		listeners = append(listeners, ln)
	}
	// The first reload is abandoned, like every later one, if a signal
	// comes while the file system holds it (ClusterTrust.ReloadUnlessDone).
	m.trust.ReloadUnlessDone(ctx)
	m.log.Info("started", "nodeId", m.cfg.NodeID, "nodeIdFile", m.cfg.NodeIDFile, "version", m.cfg.Version, "peerAddr", peerLn.Addr().String())

	// The journal is read before any listener serves and before the
	// broker's replay is read: a producer's frame must find the owner it
	// restores (or it would be refused 409 against the replay), and the
	// replay must find the removals it restores (or it would bring the
	// workloads back).
	m.journal.open(restartLeaseGrace * m.leaseUnit)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	servers := []*http.Server{m.servePeers(&wg, peerLn)}
	for i, x := range extras {
		servers = append(servers, x.Start(&wg, listeners[i+1]))
	}
	// The expiry loop is not waited for like the others: an expiry blocked
	// on a broker that does not read would hold shutdown, as a request
	// blocked there does not. It is waited for only until the shutdown's
	// deadline.
	leasesDone := make(chan struct{})
	if m.announce() == nil {
		go func() { m.runLeases(ctx); close(leasesDone) }()
		// Every reload that changed the identity, the pins or the membership
		// re-derives the broadcast targets; a reload under way when ctx ends
		// is abandoned (ReloadUnlessDone).
		wg.Go(func() {
			runEvery(ctx, pairinstall.ReloadInterval, func() {
				if changed, finished := m.trust.ReloadUnlessDone(ctx); finished && changed {
					m.refreshTargets()
				}
			})
		})
		wg.Go(func() { runEvery(ctx, pruneInterval(m.cfg.ResyncInterval), m.pruneTable) })
		readDone := make(chan struct{})
		go func() { m.readLoop(); close(readDone) }()
		select {
		case <-ctx.Done():
			m.log.Info("shutting down", "reason", "signal")
		case <-readDone:
			m.log.Info("shutting down", "reason", "broker closed the local channel")
		case <-m.out.Gone():
			m.log.Info("shutting down", "reason", "broker write failed")
		case <-m.shutdownReq:
			m.log.Info("shutting down", "reason", "shutdown requested")
		}
	} else {
		close(leasesDone)
	}
	// Everything below ends by this deadline, so the daemon exits within
	// PAIR's stop grace (spec 4, "Shutdown").
	deadline := time.Now().Add(serverShutdownGrace + m.cfg.DrainTimeout)
	// The periodic loops and the lease expiry have no work to do in a
	// shutdown: they are stopped first, so that an expiry blocked on a
	// broker that does not read has the whole budget to return instead of
	// a wait of its own after it.
	cancel()
	m.stopServers(servers)
	// Every frame is committed now; the peers get until the drain's end to
	// catch up, and what they still lack stays in the journal.
	m.bcast.Close(m.cfg.DrainTimeout)
	m.journal.close(deadline)
	m.brokerLines.Stop(m.log)
	wg.Wait()
	select {
	case <-leasesDone:
	case <-time.After(time.Until(deadline)):
	}
	return nil
}

// loopbackServer is an optional plaintext listener on loopback: the ingress
// or the metrics endpoint.
type loopbackServer interface {
	Listen() (net.Listener, error)
	Start(wg *sync.WaitGroup, ln net.Listener) *http.Server
}

// announce sends ready and the discovery subscription, in that order.
func (m *Manager) announce() error {
	ready, _ := json.Marshal(map[string]string{"version": m.cfg.Version, "nodeId": m.cfg.NodeID})
	if err := m.out.Notify("ready", ready); err != nil {
		m.log.Warn("broker unavailable at start", "reason", err)
		return err
	}
	return m.out.Notify("discovery:subscribe", json.RawMessage(`{"services":["wl"]}`))
}

// stopServers closes the listeners, so no new frame is taken, and lets
// in-flight requests finish their broker write within serverShutdownGrace.
// The peers' drain time comes after it (Run).
func (m *Manager) stopServers(servers []*http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), serverShutdownGrace)
	defer cancel()
	for _, s := range servers {
		if err := s.Shutdown(ctx); err != nil {
			s.Close()
		}
	}
}

func (m *Manager) servePeers(wg *sync.WaitGroup, ln net.Listener) *http.Server {
	srv := httpguard.NewHTTPServer(m.peers, peerwire.ServerIdleTimeout, m.log)
	srv.ErrorLog = log.New(&handshakeFailureCounter{n: &m.serverHandshakeFailures, next: srv.ErrorLog.Writer()}, "", 0)
	srv.TLSConfig = m.trust.ServerTLSConfig(httpguard.PeerALPN)
	srv.ConnState = m.conns.Peer.ConnState
	wg.Go(func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("peer server stopped", "reason", err)
		}
	})
	return srv
}

// readLoop reads the broker's frames until the channel ends or the broker
// asks for shutdown.
func (m *Manager) readLoop() {
	lr := wireframe.NewLineReader(m.cfg.In, wireframe.MaxBytes)
	for {
		line, err := lr.Next()
		if errors.Is(err, wireframe.ErrLineTooLong) {
			m.brokerLines.Warn(m.log, brokerio.LineTooLong, "reason", err)
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				m.log.Warn("local channel read failed", "reason", err)
			}
			return
		}
		if m.handleLine(line) {
			return
		}
	}
}

// handleLine handles one frame from the broker and reports whether it asked
// for shutdown. A workload frame, nearly every line, is read in one pass
// (framescan.go); the daemon's control frames are decoded whole.
func (m *Manager) handleLine(line []byte) (shutdown bool) {
	if len(bytes.TrimSpace(line)) == 0 {
		return false
	}
	if err := wireframe.CheckUTF8(line); err != nil {
		m.brokerLines.Warn(m.log, brokerio.LineNotUTF8, "reason", err)
		return false
	}
	var s wireframe.Scan
	if err := s.ScanFrame(line); err != nil {
		m.brokerLines.Warn(m.log, brokerio.LineNotJSON, "reason", httpguard.ClipLogged(fmt.Sprintf("not JSON: %v", err)))
		return false
	}
	env, err := wireframe.EnvelopeOf(&s)
	if err != nil || !isWorkloadMethod(env.Method) {
		return m.handleControlLine(line)
	}
	if env.JSONRPC != "2.0" {
		m.brokerLines.Warn(m.log, brokerio.LineBadVersion, "method", httpguard.ClipLogged(env.Method), "reason", `jsonrpc must be "2.0"`)
		return false
	}
	m.framesReceived.Inc("stdio", env.Method)
	m.handleLocal(env.Method, &s)
	if env.ID != nil {
		if err := m.out.Respond(env.ID, nil, nil); err != nil {
			m.brokerLines.Warn(m.log, brokerio.LineUnanswered, "method", env.Method, "id", httpguard.ClipLoggedBytes(env.ID), "reason", httpguard.ClipLogged(err.Error()))
		}
	}
	return false
}

// isWorkloadMethod reports whether a frame of method m carries a workload
// event: a lifecycle method or a removal.
func isWorkloadMethod(m string) bool {
	return wireframe.IsLifecycleMethod(m) || m == wireframe.MethodRemove
}

// handleControlLine handles a frame from the broker that is not a
// workload event (discovery, log level, shutdown, a response), decoded
// whole, and reports whether it asked for shutdown.
func (m *Manager) handleControlLine(line []byte) (shutdown bool) {
	var f wireframe.RPC
	if err := json.Unmarshal(line, &f); err != nil {
		m.brokerLines.Warn(m.log, brokerio.LineNotJSON, "reason", httpguard.ClipLogged(fmt.Sprintf("not JSON: %v", err)))
		return false
	}
	if f.JSONRPC != "2.0" {
		m.brokerLines.Warn(m.log, brokerio.LineBadVersion, "method", httpguard.ClipLogged(f.Method), "reason", `jsonrpc must be "2.0"`)
		return false
	}
	if f.IsResponse() {
		m.log.Debug("response from broker ignored", "id", httpguard.ClipLoggedBytes(f.ID))
		return false
	}
	m.framesReceived.Inc("stdio", wireframe.MetricMethod(f.Method))
	var result any
	var rerr *wireframe.RPCError
	switch {
	case f.Method == "discovery:nodes":
		m.applyDiscovery(f.Params)
	case f.Method == "log/set-level":
		result, rerr = m.setLogLevel(f.Params)
	case f.Method == "shutdown":
		shutdown = true
	default:
		if !f.IsRequest() {
			m.log.Debug("notification ignored", "method", httpguard.ClipLogged(f.Method))
			return false
		}
		// The method is quoted clipped, as a request's values are in an
		// answer on the other channels: the answer then fits the broker's
		// line unless the id alone does not.
		rerr = &wireframe.RPCError{Code: wireframe.CodeMethodNotFound, Message: "method not found: " + httpguard.ClipReason(f.Method)}
	}
	if rerr != nil && !f.IsRequest() {
		m.brokerLines.Warn(m.log, brokerio.LineRefused, "method", httpguard.ClipLogged(f.Method), "reason", httpguard.ClipLogged(rerr.Message))
	}
	if f.IsRequest() {
		if err := m.out.Respond(f.ID, result, rerr); err != nil {
			m.brokerLines.Warn(m.log, brokerio.LineUnanswered, "method", httpguard.ClipLogged(f.Method), "id", httpguard.ClipLoggedBytes(f.ID), "reason", httpguard.ClipLogged(err.Error()))
		}
	}
	if shutdown {
		m.shutdownOnce.Do(func() { close(m.shutdownReq) })
	}
	return shutdown
}

// handleLocal takes a local-origin frame from the broker. The broker has
// already applied it, so nothing goes back up: it is tracked and queued for
// the peers. A malformed frame is logged and dropped, never broadcast.
func (m *Manager) handleLocal(method string, s *wireframe.Scan) {
	if err := wireframe.CheckWorkloadBytes(s, m.cfg.WorkloadMaxBytes, 0); m.refusedOverWorkloadBound(err, "stdio") {
		// The broker has applied it; the peers are not sent it and the
		// re-sync set does not keep it. Rate-limited like a field over
		// its bound.
		m.workloadBoundLog.Note(m.log, "local frame not relayed: its params are over the workload bound", "method", method, "reason", err.Error())
		return
	}
	f, err := localFrameFromScan(method, s)
	if m.refusedOverBound(err, "stdio") {
		// A broker that sends one such frame may send thousands: the
		// warning is rate-limited (fieldbounds.go).
		m.fieldBoundLog.Note(m.log, "local frame dropped: a field over its bound", "method", method, "reason", httpguard.ClipReason(err.Error()))
		return
	}
	if err != nil {
		m.brokerLines.Warn(m.log, brokerio.LineMalformed, "method", method, "reason", httpguard.ClipLogged(err.Error()))
		return
	}
	m.commitLocal(f, fromBroker)
}

func (m *Manager) setLogLevel(params json.RawMessage) (any, *wireframe.RPCError) {
	var p struct {
		Level string `json:"level"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, &wireframe.RPCError{Code: wireframe.CodeInvalidParams, Message: fmt.Sprintf("params: %v", err)}
	}
	// The level is quoted clipped in the refusal: no level is that long,
	// and the answer must fit the broker's line.
	lvl, err := parseLogLevel(httpguard.ClipField(p.Level))
	if err != nil {
		return nil, &wireframe.RPCError{Code: wireframe.CodeInvalidParams, Message: err.Error()}
	}
	if m.cfg.LogLevel != nil {
		m.cfg.LogLevel.Set(lvl)
	}
	m.log.Info("log level set", "level", levelName(lvl))
	return map[string]string{"level": levelName(lvl)}, nil
}

// handshakeFailureCounter counts the "TLS handshake error" lines that
// net/http's server logs, the only place it reports a failed handshake, and
// passes every line on.
type handshakeFailureCounter struct {
	n    *atomic.Uint64
	next io.Writer
}

func (h *handshakeFailureCounter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("TLS handshake error")) {
		h.n.Add(1)
	}
	return h.next.Write(p)
}

// pruneInterval is how often the table is pruned and the journal looked
// at for compaction: a second, or the re-sync interval when it is shorter.
func pruneInterval(resync time.Duration) time.Duration { return min(time.Second, resync) }

// pruneTable retires and forgets what is due even while nothing changes (a
// node without peers still frees its ends), a budget at a time with the
// table's lock released in between; logs the evictions since the last
// prune, one line per burst; and compacts the journal when it is due.
func (m *Manager) pruneTable() {
	for m.table.Prune() {
	}
	if n := m.table.Stats().Evicted.Load(); n > m.lastEvicted {
		m.evictLog.NoteCounted(m.log, "evicted", "ends evicted at their byte bound (--max-ended-bytes): a member that lacked one is sent the whole table",
			"limitBytes", m.cfg.MaxEndedBytes, "total", n)
		m.lastEvicted = n
	}
	m.journal.maybeCompact()
}

// runEvery calls fn every interval until ctx ends.
func runEvery(ctx context.Context, interval time.Duration, fn func()) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fn()
		}
	}
}
