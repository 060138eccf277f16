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
	"nvpair-workload-manager/internal/clustertrust"
	"nvpair-workload-manager/internal/gcpace"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/ingressmark"
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
// BrokerLineMax take their defaults, and so do the state table's zero
// bounds (bounds.go).
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
	// every member beside it) on every path; 0: wireframe.DefaultWorkloadMaxBytes.
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
	// JournalFsync is --journal-fsync: 0 fsyncs each group before its
	// answers, else answers once written and fsyncs within it (spec 5.3).
	JournalFsync time.Duration
	Conns        httpguard.ConnLimits // the listeners' connection caps
	In           io.Reader            // frames from the broker
	Out          io.Writer            // frames to the broker
	Logger       *slog.Logger
	LogLevel     *slog.LevelVar // changed by log/set-level; may be nil

	// Pacer sets the collector's headroom from the live heap at each
	// prune (internal/gcpace); nil leaves the collector alone
	// (gcpace.Off), as a test's Manager must.
	Pacer *gcpace.Pacer

	// NodeIDAliases are this node's other ids (node-id.json's, where
	// identity.json names another): the ingress takes a producer's frame
	// naming one as this node's and relays it under NodeID (spec 3.4.1).
	NodeIDAliases []string

	// IngressMarkKey is the key of the ingress mark (spec 3.5.3,
	// internal/ingressmark); nil writes no mark and checks none.
	IngressMarkKey []byte
}

// frameSource says where a local-origin frame entered the daemon.
type frameSource int

const (
	fromBroker  frameSource = iota // the broker, on the local channel
	fromIngress                    // a producer, on the loopback ingress
)

// Manager is the daemon: it relays between the broker, the peers and the
// optional loopback ingress. It wires the parts that live under internal/
// (the peer port's server and senders, the ingress's handlers, the
// broker's writer, the state table and its journal) and holds what only
// the relay decides: the order of this node's own frames, their commit,
// their leases and the discovery snapshot.
//
// Lock order: ingestMu -> the state table's lock (the design card's
// activeMu: the ingress's checks), and discoveryMu -> the senders' lock
// (peersend.Broadcaster.mu) -> the table's lock (a target change joins or
// leaves a member). ingestMu and discoveryMu are never held together.
// Leaf locks, taken under any of these and never around them:
// brokerio.Writer.mu, ingressFlight.mu, clustertrust.ClusterTrust.mu, the
// peer server's dedup lock, the journal's append lock (under the table's).
// No lock is held across a network write to a peer or a journal write:
// each peer's sender takes a slice of the table under its lock and sends
// with none, and the journal writes its groups on its own.
//
// The broker write holds no lock either (internal/brokerio/writer.go):
// ingestMu is held only while an ingress frame takes its place in the
// broker order. The caller that writes a group (the leader) then runs the
// group's ingress commits, which take the table's lock. No holder of it
// ever waits for a broker write, so the lead closes no cycle (spec 6).
type Manager struct {
	cfg   Config
	log   *slog.Logger
	out   *brokerio.Writer
	trust *clustertrust.ClusterTrust
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
	// order is what an ingress frame's commit needs after its write
	// (ingressorder.go).
	order ingressOrder

	// table is everything this node asserts (internal/statetable): every
	// path to the peers and to disk reads it.
	table *statetable.Table
	// journal keeps what the table must not lose across a restart
	// (tablejournal.go); its file is nil only without a JournalPath.
	journal tableJournal
	// lastEvicted is the table's eviction count at the last prune, for
	// the one line per burst (pruneTable).
	lastEvicted uint64
	evictLog    ratelog.Burst

	// leases counts the leases' events (lease.go); the leases themselves
	// live on their runs in the table. leaseUnit is the length of one
	// second of Workload-Lease: a second, shorter only in tests.
	leases    leaseStats
	leaseUnit time.Duration
	// ingressStats are the read-back's and the Fetch Metadata check's
	// counters (internal/ingress), kept while the ingress is off too, so
	// their series are always there.
	ingressStats ingress.Stats

	// marker makes the ingress mark of each ingress frame's broker line
	// and checks the marks of the broker's replay (spec 3.5.3); nil
	// without a key. replayClaims counts the replays it made a producer's
	// again, marksUnchecked the marks that did not check; each has its
	// rate-limited warning.
	marker                       *ingressmark.Marker
	replayClaims, marksUnchecked atomic.Uint64
	replayClaimLog, markLog      ratelog.Burst

	// discoveryMu guards lastNodes and serializes target refreshes.
	discoveryMu sync.Mutex
	lastNodes   []discoveredNode

	// peerWaiters and ingressWaiters bound the requests of each channel
	// that wait on the broker write at once (internal/brokerio/waiters.go).
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
	// warnings they cause (internal/brokerio/linelog.go).
	brokerLines *brokerio.LineLog

	shutdownOnce sync.Once
	shutdownReq  chan struct{} // closed by a shutdown request from the broker

	// peerAddr is the peer listener's bound address (a net.Addr), stored
	// once Run has bound it: the in-process tests dial it (helpers_test.go);
	// the process tests read it from the "started" log line.
	peerAddr atomic.Value
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
	if cfg.Pacer == nil {
		cfg.Pacer = gcpace.Off()
	}
	if err := applyTableBounds(&cfg); err != nil {
		return nil, err
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
	trust := clustertrust.NewClusterTrust(cfg.ClusterDir, cfg.Logger)
	var marker *ingressmark.Marker
	if cfg.IngressMarkKey != nil {
		var err error
		if marker, err = ingressmark.New(cfg.IngressMarkKey); err != nil {
			return nil, err
		}
	}
	m := &Manager{
		marker:      marker,
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
		conns:              httpguard.NewListenerLimits(cfg.Conns, cfg.Logger),
		brokerLines:        brokerio.NewLineLog(),
		bodies:             httpguard.NewRequestBodies(),

		workloadBoundRefusals: promtext.NewCounterVec(),
	}
	m.leases.failures = promtext.NewCounterVec()
	m.table = statetable.New(tableConfig(&cfg, func() time.Time { return m.now() }))
	m.journal = tableJournal{path: cfg.JournalPath, fsync: cfg.JournalFsync, log: cfg.Logger, table: m.table}
	m.order = ingressOrder{flight: &m.ingressFlight, commit: m.commitLocalLine, journal: &m.journal}
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
	m.peerAddr.Store(peerLn.Addr())
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
			runEvery(ctx, clustertrust.ReloadInterval, func() {
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
	m.table.FlushMarks()
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
// (wireframe.Scan); the daemon's control frames are decoded whole.
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
// already applied it, so nothing goes back up: it is committed to the
// state table, which the peers' senders read. A malformed frame is logged and dropped, never broadcast.
func (m *Manager) handleLocal(method string, s *wireframe.Scan) {
	// An ingress mark is cut out before anything reads the frame: no peer
	// is ever sent it, and the workload bound is the frame's own.
	mark, marks := s.InfoMember(wireframe.IngressMarkName)
	if marks > 0 {
		s = withoutIngressMark(method, s)
	}
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
		// warning is rate-limited (bounds.go).
		m.fieldBoundLog.Note(m.log, "local frame dropped: a field over its bound", "method", method, "reason", httpguard.ClipReason(err.Error()))
		return
	}
	if err != nil {
		m.brokerLines.Warn(m.log, brokerio.LineMalformed, "method", method, "reason", httpguard.ClipLogged(err.Error()))
		return
	}
	if marks > 0 {
		m.checkIngressMark(&f, mark, marks)
	}
	m.commitLocal(f, fromBroker)
}

// checkIngressMark reads the ingress mark of a broker frame: one that
// this node's key made for the frame's own run makes the frame an echo of
// the ingress (statetable.Frame.Echo), under the lease it was made with.
// Any other is not this node's, and the frame is the broker's like any
// other: a mark of another key, another run or another form, two marks,
// a mark on a frame that is no lifecycle frame, or any mark on a node
// without a key.
func (m *Manager) checkIngressMark(f *localFrame, value []byte, marks int) {
	if m.marker != nil && marks == 1 && wireframe.IsLifecycleMethod(f.method) {
		if lease, ok := m.marker.Check(value, f.life.Key()); ok {
			f.echo, f.leaseSeconds = true, lease
			return
		}
	}
	m.marksUnchecked.Add(1)
	m.markLog.NoteCounted(m.log, "unchecked", "a broker frame carries an ingress mark this node did not make: the mark is cut out and the workload is the broker's",
		"method", f.method, "id", httpguard.ClipLogged(f.workloadID()), "marks", marks, "keyed", m.marker != nil)
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
		m.evictLog.NoteCounted(m.log, "evicted", "ends evicted at their byte bound (--max-ended-bytes): one a member lacks is kept in its small form until it has it",
			"limitBytes", m.cfg.MaxEndedBytes, "total", n)
		m.lastEvicted = n
	}
	m.journal.maybeCompact()
	m.cfg.Pacer.Step()
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

// The local path: every frame of this node's own, from the broker, the
// ingress and a lease's expiry, is committed to the state table here, and
// an ingress frame takes its place in the broker order first
// (ingressorder.go).

// commitLocal is the only place a local-origin frame changes what this
// node asserts, from the broker, the ingress and a lease's expiry alike: it
// commits the frame to the state table, which every peer's sender reads
// from its mark (spec 5). It reports whether the table took the frame and
// the journal sequence of its record (0 for none).
func (m *Manager) commitLocal(f localFrame, src frameSource) (bool, uint64) {
	return m.commitLocalLine(&f, src, tableLine(&f))
}

// commitLocalLine is commitLocal with the frame's line in the table
// already built: an ingress frame's is built before it enters the broker
// order, so the commit the group's leader runs for it does no O(size) work.
func (m *Manager) commitLocalLine(f *localFrame, src frameSource, line []byte) (bool, uint64) {
	tf := statetable.Frame{Source: statetable.FromBroker, LeaseSeconds: f.leaseSeconds, Line: line, Echo: f.echo}
	if src == fromIngress {
		tf.Source = statetable.FromProducer
	}
	if f.isRemoval() {
		tf.Removal = &f.removal
	} else {
		tf.Life = &f.life
	}
	o, seq := m.table.Commit(&tf)
	m.noteOutcome(o, f)
	if tf.Claimed {
		m.replayClaims.Add(1)
		m.replayClaimLog.NoteCounted(m.log, "claimed", "the broker's replay of an ingress job the journal did not hold: the job is its producer's again (a crash between its broker write and its journal record)",
			"id", httpguard.ClipLogged(f.workloadID()), "runId", httpguard.ClipLogged(f.life.Info.RunID), "leaseSeconds", f.leaseSeconds)
	}
	return o == statetable.Applied, seq
}

// noteOutcome logs what the table did not take, rate-limited where a
// client can repeat it.
func (m *Manager) noteOutcome(o statetable.Outcome, f *localFrame) {
	switch o {
	case statetable.Applied:
	case statetable.Full:
		m.untrackedLog.Note(m.log, "state table full (--max-live-workloads): a new broker workload is not relayed",
			"limit", m.cfg.MaxLiveWorkloads, "method", f.method, "id", httpguard.ClipLogged(f.workloadID()))
	case statetable.FullBytes:
		m.untrackedBytesLog.Note(m.log, "state table full (--max-live-workload-bytes): a broker workload is no longer relayed",
			"limitBytes", m.cfg.MaxLiveWorkloadBytes, "method", f.method, "id", httpguard.ClipLogged(f.workloadID()))
	default:
		if m.log.Enabled(context.Background(), slog.LevelDebug) {
			m.log.Debug("local frame changes nothing this node asserts", "outcome", o.String(), "method", f.method, "id", httpguard.ClipLogged(f.workloadID()))
		}
	}
}

// Ownership (spec 3.5.3). The daemon knows which workloads entered through
// its ingress (a producer owns them) and which through the broker (the
// broker owns them): each run in the state table says. A producer may
// report, remove and lease only the workloads it owns, or ids the daemon
// does not hold: a frame naming a workload the broker owns is refused 409
// before anything is written, so a producer whose id collides with a
// proxy's can neither retire the proxy's job at every member nor, through
// its removal's tombstone, silence the broker's later frames for it.
//
// Ownership survives a restart through the journal (tablejournal.go): a
// producer's runs are written with their lease before the 200, and the
// broker's replay of them is the producer's again. A run whose record a
// crash took before the 200 comes back by the ingress mark its broker line
// carried (checkIngressMark, statetable.Frame.Echo).

// checkOwner refuses an ingress frame that names a workload the broker
// owns. Called with ingestMu held, before the frame takes its place in the
// broker order, so a refused frame is neither written nor relayed. A
// broker frame for the id that arrives while the frame waits for its write
// is caught at the commit (statetable.BrokerTook).
func (m *Manager) checkOwner(f *localFrame) error {
	return m.table.CheckProducer(f.ref())
}
