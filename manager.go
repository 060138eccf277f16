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
	"math"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/gcpace"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/ingressmark"
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
// brokerio.Writer.mu, ingressFlight.mu, pairinstall.ClusterTrust.mu, the
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
	trust := pairinstall.NewClusterTrust(cfg.ClusterDir, cfg.Logger)
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
		conns:              httpguard.NewListenerLimits(cfg.Conns),
		brokerLines:        brokerio.NewLineLog(),
		bodies:             httpguard.NewRequestBodies(),

		workloadBoundRefusals: promtext.NewCounterVec(),
	}
	m.leases.failures = promtext.NewCounterVec()
	m.table = statetable.New(tableConfig(&cfg, func() time.Time { return m.now() }))
	m.journal = tableJournal{path: cfg.JournalPath, fsync: cfg.JournalFsync, log: cfg.Logger, table: m.table}
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

// enterIngressOrder gives an ingress frame its place in the broker order,
// with line its broker line and peerLine its line to the peers, both built
// before ingestMu was taken; bytes is what it may add to the re-sync set
// (0 for a removal). Called with ingestMu held; the caller waits on the
// turn after releasing it. A line over the broker's line limit is
// returned as it is; a broker already gone as ingress.ErrBrokerWrite. Either
// leaves nothing in flight.
func (m *Manager) enterIngressOrder(f localFrame, line *bytes.Buffer, tableLine []byte, startsRun bool, bytes int64) (ingressTurn, error) {
	c := &ingressCommit{m: m, f: f, line: tableLine, key: f.life.Key(), startsRun: startsRun, bytes: bytes}
	m.ingressFlight.accept(c.key, startsRun, bytes)
	turn, err := m.out.Enter(line, c.run)
	if err != nil {
		c.settle()
		if errors.Is(err, wireframe.ErrLineOverLimit) {
			return ingressTurn{}, err
		}
		return ingressTurn{}, fmt.Errorf("%w: %v", ingress.ErrBrokerWrite, err)
	}
	return ingressTurn{turn: turn, c: c}, nil
}

// enterLocalFrame is enterIngressOrder for a frame whose lines are built
// here, under ingestMu: the lease's expiry, rare enough not to matter. It
// is checked against neither of the re-sync set's bounds (it replaces a
// run the set holds, with a few bytes of error text more), so it counts
// no bytes in flight.
func (m *Manager) enterLocalFrame(f localFrame) (ingressTurn, error) {
	return m.enterIngressOrder(f, ingressLine(&f, m.marker, m.cfg.BrokerLineMax), tableLine(&f), false, 0)
}

// The ingress (internal/ingress serves it): its way into the relay
// (ingress.Relay) and the checks the relay makes of a producer's frame.

// EnableLocalIngress turns the loopback ingress on at addr. It must be
// called before Run, which binds it. A non-loopback address is refused.
func (m *Manager) EnableLocalIngress(addr string) error {
	srv, err := ingress.New(ingress.Config{
		Addr:                  addr,
		WorkloadMaxBytes:      m.cfg.WorkloadMaxBytes,
		Relay:                 m,
		Table:                 m.table,
		Conns:                 m.conns.Ingress,
		Bodies:                m.bodies.Ingress,
		Waiters:               m.ingressWaiters,
		Stats:                 &m.ingressStats,
		Responses:             m.ingressResponses,
		WorkloadBoundRefusals: m.workloadBoundRefusals,
		Log:                   m.log,
	})
	if err != nil {
		return err
	}
	m.ingress = srv
	return nil
}

// Ingest is the ingress's way into the relay (ingress.Relay): a
// producer's frame and its Workload-Lease header's values.
func (m *Manager) Ingest(body []byte, lease []string) (ingress.Frame, error) {
	f, err := m.ingestLocalLeased(body, lease)
	return ingress.Frame{Method: f.method, WorkloadID: f.workloadID()}, err
}

// ingestLocalLeased takes a producer's frame and its Workload-Lease
// header's values (lease.go; a bad one is the producer's mistake, refused
// before anything is written): validate; then, under ingestMu,
// take its place in the broker order; then, with ingestMu released, wait
// until it is written up to the broker and committed to the state table
// after the write, in the broker order (ingressorder.go). A failed broker
// write leaves nothing committed, so peers never
// show a workload the origin broker does not hold and the producer can
// retry; so does a frame the broker writer refuses as over the line limit,
// which is returned as it is. ingestMu keeps concurrent posts for one
// workload in one order at the broker and in the state table. A post
// waiting for ingestMu or for its write waits on the broker as surely as
// the one writing, so the slot that bounds the ingress's waiters is taken
// before ingestMu, and a post that finds none is refused with
// *brokerio.BusyError before it waits for anything.
func (m *Manager) ingestLocalLeased(body []byte, lease []string) (localFrame, error) {
	fr, err := wireframe.ParseIngressAs(body, m.cfg.NodeID, m.cfg.NodeIDAliases, m.cfg.WorkloadMaxBytes)
	f := localFrame{method: fr.Method, params: fr.Params, life: fr.Life, removal: fr.Removal}
	m.refusedOverBound(err, "ingress")
	if m.refusedOverWorkloadBound(err, "ingress") {
		return f, err // 413 (refusalOf)
	}
	if err != nil {
		return f, fmt.Errorf("%w: %v", ingress.ErrBadFrame, err)
	}
	if f.leaseSeconds, err = parseLeaseHeader(lease, &f); err != nil {
		m.leases.refused.Add(1)
		return f, fmt.Errorf("%w: %v", ingress.ErrBadFrame, err)
	}
	if err := m.journal.refuseWhileDown(); err != nil {
		return f, err // 503 (refusalOf)
	}
	if !m.ingressWaiters.Acquire(nil) {
		return f, m.ingressWaiters.Busy()
	}
	m.framesReceived.Inc("ingress", f.method)
	// Both lines are built before ingestMu: only the frame's place in the
	// order is decided under it.
	line, peerLine := ingressLine(&f, m.marker, m.cfg.BrokerLineMax), tableLine(&f)
	turn, err := m.enterIngress(f, line, peerLine)
	if err == nil {
		err = turn.written()
	}
	// The slot bounds the requests waiting on the broker (0049): once the
	// frame is written, its wait for the journal's fsync is not one, and
	// holding the slot through it would cap the frames of one group at the
	// bound. The requests waiting on the journal are bounded by the
	// ingress's connections.
	m.ingressWaiters.Release()
	if err != nil {
		return f, err
	}
	return f, turn.durable()
}

// enterIngress checks the live-workload limit and gives a producer's frame
// its place in the broker order, under ingestMu. The limit is checked
// before the broker write, so a refused frame leaves nothing anywhere.
func (m *Manager) enterIngress(f localFrame, line *bytes.Buffer, peerLine []byte) (ingressTurn, error) {
	// What the frame may add to the re-sync set: its re-assertion line,
	// the line to the peers with the marker, at most.
	var bytes int64
	if !f.isRemoval() {
		bytes = int64(len(peerLine))
	}
	m.ingestMu.Lock()
	defer m.ingestMu.Unlock()
	if err := m.checkOwner(&f); err != nil {
		brokerio.PutLine(line)
		return ingressTurn{}, err
	}
	startsRun, err := m.checkLiveLimit(&f, bytes)
	if err != nil {
		brokerio.PutLine(line)
		return ingressTurn{}, err
	}
	return m.enterIngressOrder(f, line, peerLine, startsRun, bytes)
}

// checkLiveLimit refuses a lifecycle frame that would start a new run
// while the re-sync set, with the runs that ingress frames in flight would
// start, is full, or whose line of up to lineBytes would take the set's
// bytes, with those the frames in flight may add, past its byte bound; it
// reports whether the frame would start a run. Called with ingestMu held,
// so no other ingress frame is checked meanwhile.
//
// The runs in flight are read before the set: a frame's commit tracks its
// run before it leaves the count, so a run is counted once or, for the
// instant between the two, twice (a refusal one frame early), never not at
// all. The set still exceeds its limit when broker frames take the slots
// of runs in flight (a broker frame is tracked while the set holds fewer
// than the limit, and an ingress frame already written is tracked
// anyway), by at most the runs in flight: at most brokerio.WaitersMax. The
// bytes likewise, by at most the lines of the frames in flight.
func (m *Manager) checkLiveLimit(f *localFrame, lineBytes int64) (startsRun bool, err error) {
	if f.isRemoval() {
		return false, nil
	}
	pending, counted, pendingBytes := m.ingressFlight.pendingRuns(f.life.Key())
	if counted {
		// Its run's slot is taken already; the bytes of the frame in
		// flight that took it count toward the byte bound.
		return true, m.checkLiveBytes(pendingBytes, lineBytes)
	}
	hit, held, after := m.table.AtLimit(&f.life, pending, pendingBytes, int(lineBytes))
	switch hit {
	case statetable.LimitEntries:
		return false, &ingress.AtLimitError{Bound: hit, Limit: int64(m.cfg.MaxLiveWorkloads), After: after}
	case statetable.LimitBytes:
		return false, &ingress.AtLimitError{Bound: hit, Limit: m.cfg.MaxLiveWorkloadBytes, Held: m.table.Sizes().RunBytes, After: after}
	}
	return !held, nil
}

// checkLiveBytes is checkLiveLimit's byte bound alone, for a frame whose
// new run is in flight already: the table does not hold the run yet, so
// the frame's whole line is counted, beside the frame in flight's (which
// it will replace: a refusal comes early rather than late).
func (m *Manager) checkLiveBytes(pendingBytes, lineBytes int64) error {
	size := m.table.Sizes().RunBytes
	if size+pendingBytes+lineBytes > m.cfg.MaxLiveWorkloadBytes {
		return &ingress.AtLimitError{Bound: statetable.LimitBytes, Limit: m.cfg.MaxLiveWorkloadBytes, Held: size, After: m.cfg.ResyncInterval}
	}
	return nil
}

// NodeInfo builds the answer to GET /v1/node (internal/ingress). The
// snapshot is read under discoveryMu and
// the targets under broadcaster.mu, each only long enough to take a
// reference or copy the target set; the live counts from the state table, O(1).
// The members are listed in the snapshot's order, this node's own entry
// included.
func (m *Manager) NodeInfo() ingress.NodeInfo {
	m.discoveryMu.Lock()
	nodes := m.lastNodes // replaced whole by applyDiscovery, never changed in place
	m.discoveryMu.Unlock()
	targets := m.bcast.TargetHosts()

	members := make([]ingress.NodeMember, 0, len(nodes))
	for _, n := range nodes {
		_, delivering := targets[n.HostUUID]
		members = append(members, ingress.NodeMember{Name: n.Name, NodeID: n.HostUUID, Self: n.HostUUID == m.cfg.NodeID, Delivering: delivering})
	}

	sz := m.table.Sizes()
	live, liveBytes := sz.Runs, sz.RunBytes
	liveMax, liveBytesMax := m.cfg.MaxLiveWorkloads, m.cfg.MaxLiveWorkloadBytes

	source := ""
	if m.cfg.NodeIDFile != "" {
		source = filepath.Base(m.cfg.NodeIDFile)
	}
	return ingress.NodeInfo{
		NodeID:       m.cfg.NodeID,
		NodeIDSource: source,
		NodeIDFile:   m.cfg.NodeIDFile,
		Version:      m.cfg.Version,
		Members:      members,
		Limits: ingress.NodeLimits{
			BodyMaxBytes:         ingress.BodyMax(m.cfg.WorkloadMaxBytes),
			BrokerLineMaxBytes:   m.cfg.BrokerLineMax,
			WorkloadMaxBytes:     m.cfg.WorkloadMaxBytes,
			FieldMaxBytes:        wireframe.MaxKeyFieldBytes,
			ErrorMaxBytes:        wireframe.MaxIngressErrorBytes,
			LeaseMinSeconds:      minLeaseSeconds,
			LeaseMaxSeconds:      maxLeaseSeconds,
			LiveWorkloads:        live,
			LiveWorkloadsMax:     liveMax,
			LiveWorkloadBytes:    liveBytes,
			LiveWorkloadBytesMax: liveBytesMax,
		},
	}
}

// Leases (lease.go): a leased run that is not renewed in time is retired as
// its producer would have retired it, through the ingress's own path.

// runLeases retires leased jobs as their leases run out, until ctx ends.
// It is the one goroutine that drives expiry: it sleeps until the earliest
// deadline (or until a lease is armed earlier than that) and never scans.
func (m *Manager) runLeases(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		at, held := m.table.NextLease()
		wait := time.Duration(math.MaxInt64)
		if held {
			wait = at.Sub(m.now())
		}
		if wait <= 0 {
			m.expireDue()
			continue
		}
		// Since Go 1.23 a Reset discards a value the timer sent before
		// it, so a wake-up never leaves a stale tick behind.
		timer.Reset(min(wait, time.Hour))
		select {
		case <-ctx.Done():
		case <-m.table.LeaseWake():
		case <-timer.C:
		}
	}
}

// expireDue retires the job of the lease due first, if one still is, the
// way an ingress post would: under ingestMu it takes its place in the
// broker order, so it is ordered with every producer frame; it is written
// up to the broker first, then committed to the state table
// (ingressorder.go). Its commit is a terminal frame, which ends the lease.
// A failed broker write keeps the lease and tries again after a bounded
// backoff.
func (m *Manager) expireDue() {
	turn, l, log, err := m.enterExpiry()
	if l == nil {
		return // no lease due
	}
	if err == nil {
		err = turn.wait()
	}
	switch {
	case err == nil:
		m.leases.expired.Add(1)
		log.Info("lease expired: job retired as failed", "runId", httpguard.ClipLogged(l.Key.RunID))
	case errors.As(err, new(noLiveRunError)):
		m.dropLease(log, *l, "no_entry", err)
	case errors.Is(err, wireframe.ErrLineOverLimit):
		m.dropLease(log, *l, "line_limit", err)
	default:
		m.leases.failures.Inc("broker_write")
		retry := m.table.PostponeLease(l.Key, m.now(), leaseRetryFirst, leaseRetryMax)
		log.Warn("lease expiry not written to the broker; trying again", "reason", err, "retryIn", retry)
	}
}

// enterExpiry takes the lease due first, if any, and gives the frame that
// retires its job a place in the broker order, under ingestMu. It returns
// a nil lease when none is due.
func (m *Manager) enterExpiry() (ingressTurn, *statetable.Lease, *slog.Logger, error) {
	m.ingestMu.Lock()
	defer m.ingestMu.Unlock()
	// Every ingress frame placed before this one is committed first (or
	// has failed), so a producer frame that renewed or ended the lease
	// while this waited for ingestMu has taken effect when the lease is
	// read.
	m.ingressFlight.waitSettled()
	now := m.now()
	l, ok := m.table.DueLease(now)
	if !ok {
		return ingressTurn{}, nil, nil, nil
	}
	log := m.log.With("channel", "lease", "id", httpguard.ClipLogged(l.Key.ID), "leaseSeconds", l.Seconds)
	f, err := m.expiryFrame(l, now, false)
	if err != nil {
		return ingressTurn{}, &l, log, noLiveRunError{err}
	}
	if len(f.params) > m.cfg.WorkloadMaxBytes {
		// A job at the workload bound (3.2) is over it with the expiry's
		// fields, and every peer would refuse it, for good: it is
		// retired with its known fields only, as for the line limit.
		log.Warn("lease expiry frame over the workload bound: retiring the job with its known fields only", "bytes", len(f.params), "limit", m.cfg.WorkloadMaxBytes)
		if f, err = m.expiryFrame(l, now, true); err != nil {
			return ingressTurn{}, &l, log, noLiveRunError{err}
		}
	}
	turn, err := m.enterLocalFrame(f)
	if errors.Is(err, wireframe.ErrLineOverLimit) {
		// The job's own fields and what the producer added are kept when
		// they fit; a job whose frame does not fit with the expiry's
		// fields is retired with its known fields only.
		log.Warn("lease expiry frame over the broker line limit: retiring the job with its known fields only", "reason", err)
		if f, err = m.expiryFrame(l, now, true); err == nil {
			turn, err = m.enterLocalFrame(f)
		}
	}
	return turn, &l, log, err
}

// dropLease gives up a lease whose expiry can never be written, loudly.
func (m *Manager) dropLease(log *slog.Logger, l statetable.Lease, reason string, err error) {
	m.table.EndLease(l.Ref())
	m.leases.failures.Inc(reason)
	log.Error("lease expired but the job could not be retired; the lease is dropped", "reason", err)
}

// expiryFrame builds the failed terminal frame that retires l's run, from
// the run's latest event in the re-sync set: the same members (id, runId,
// model, engine, origin, scheduledOn, createdAt, startedAt, requesterId and
// every field of the producer's own, in their order), with state failed,
// completedAt now, the lease's error, and seq one more than the last when
// the run had one. knownOnly keeps only the workload fields the daemon
// knows, for a run whose whole frame would not fit the broker's line. The
// frame goes through parseLocalFrame like any other.
func (m *Manager) expiryFrame(l statetable.Lease, now time.Time, knownOnly bool) (localFrame, error) {
	params, seq, hasSeq, ok := m.table.LiveRun(l.Key)
	if !ok {
		return localFrame{}, fmt.Errorf("the state table holds no live run %q of the workload", l.Key.RunID)
	}
	info, err := buildExpiryInfo(params, leaseExpiryError(l.Seconds), now, seq, hasSeq, knownOnly)
	if err != nil {
		return localFrame{}, err
	}
	p := make([]byte, 0, len(info)+20)
	p = append(append(append(p, `{"workloadInfo":`...), info...), '}')
	return parseLocalFrame(wireframe.MethodErrored, p)
}

// writeLeaseMetrics renders the leases.
func (m *Manager) writeLeaseMetrics(t *promtext.Text) {
	t.Single("nvpair_wlm_leases_active", "gauge", "Ingress workloads held under a producer lease (Workload-Lease) now.", float64(m.table.Sizes().Leases))
	t.Single("nvpair_wlm_leases_limit", "gauge", "The most leases this node holds: one per live workload, so --max-live-workloads.", float64(m.cfg.MaxLiveWorkloads))
	t.Single("nvpair_wlm_leases_renewed_total", "counter", "Leases renewed by a producer's frame while they were held.", float64(m.table.Stats().LeaseRenewed.Load()))
	t.Single("nvpair_wlm_leases_expired_total", "counter", "Jobs retired as failed because their producer's lease ran out.", float64(m.leases.expired.Load()))
	t.Single("nvpair_wlm_lease_header_refusals_total", "counter", "Ingress frames refused with 400 for a bad Workload-Lease header.", float64(m.leases.refused.Load()))
	t.Family("nvpair_wlm_lease_expiry_failures_total", "counter", "Expiries that could not be written: broker_write (retried with backoff), line_limit or no_entry (the lease is dropped, logged at error).")
	t.CounterSamples("nvpair_wlm_lease_expiry_failures_total", []string{"reason"}, m.leases.failures)
}

// Discovery (discovery.go): each snapshot re-derives the broadcast targets
// and the peer port's origin index.

// applyDiscovery replaces the last snapshot and re-derives the targets.
func (m *Manager) applyDiscovery(params json.RawMessage) {
	nodes, err := parseDiscovery(params)
	if err != nil {
		m.brokerLines.Warn(m.log, brokerio.LineBadDiscovery, "reason", httpguard.ClipLogged(err.Error()))
		return
	}
	// The origin index is built before any lock is taken, and swapped in
	// whole: the peer port reads it without one.
	bindings := make([]peerserver.Binding, len(nodes))
	for i, n := range nodes {
		bindings[i] = peerserver.Binding{Principal: n.ClusterUUID, Node: n.HostUUID}
	}
	m.peers.SetDiscovery(bindings)
	m.discoveryMu.Lock()
	m.lastNodes = nodes
	m.discoveryMu.Unlock()
	m.refreshTargets()
}

// refreshTargets derives the target set from the last snapshot and the
// current trust and logs what changed; a new target's sender backfills it
// with the re-sync set. It runs on a discovery snapshot and on every trust
// change, so a pin that arrives after the snapshot still makes its node a
// target. discoveryMu is held throughout, so one change completes before
// the next is derived.
func (m *Manager) refreshTargets() {
	m.discoveryMu.Lock()
	defer m.discoveryMu.Unlock()
	var targets []peersend.Target
	if m.trust.Clustered() { // a node that is not a clustered member broadcasts nothing
		targets = selectTargets(m.lastNodes, m.cfg.NodeID, func(p string) bool { _, ok := m.trust.Pin(p); return ok }, m.log)
	}
	added, removed := m.bcast.SetTargets(targets)
	if len(added) == 0 && len(removed) == 0 {
		return
	}
	// A new target's sender starts a heartbeat pass at once: that is its
	// backfill with the whole re-sync set.
	m.log.Info("broadcast targets changed", "added", targetNames(added), "removed", targetNames(removed), "total", len(targets))
}

// Bounds (bounds.go): the refusals of a frame over a bound are counted by
// source.

// refusedOverBound reports whether err refuses a frame for a field over its
// bound, and counts it for source (stdio, peer, ingress) when it does.
func (m *Manager) refusedOverBound(err error, source string) bool {
	if !wireframe.IsFieldTooLong(err) {
		return false
	}
	m.fieldBoundRefusals.Inc(source)
	return true
}

// refusedOverWorkloadBound reports whether err refuses a frame for its
// size, and counts it for source (stdio, peer, ingress) when it does.
func (m *Manager) refusedOverWorkloadBound(err error, source string) bool {
	if !wireframe.IsWorkloadTooLarge(err) {
		return false
	}
	m.workloadBoundRefusals.Inc(source)
	return true
}

// writeWorkloadBoundMetrics renders the workload byte bound and its
// refusals by source.
func (m *Manager) writeWorkloadBoundMetrics(t *promtext.Text) {
	t.Family("nvpair_wlm_workload_bound_refusals_total", "counter", "Frames refused because their params were over the workload byte bound (--workload-max-bytes), by source (stdio, peer, ingress).")
	t.CounterSamples("nvpair_wlm_workload_bound_refusals_total", []string{"source"}, m.workloadBoundRefusals)
	t.Single("nvpair_wlm_workload_limit_bytes", "gauge", "The most bytes a frame's params may have on every path (--workload-max-bytes).", float64(m.cfg.WorkloadMaxBytes))
}

// Metrics: the loopback endpoint (metrics.go) and every series it renders.

// EnableMetrics turns the metrics endpoint on at addr. It must be called
// before Run, which binds it. A non-loopback address is refused.
func (m *Manager) EnableMetrics(addr string) error {
	b, err := httpguard.NewLoopbackBinding("metrics endpoint", addr, m.conns.Metrics)
	if err != nil {
		return err
	}
	m.metrics = &metricsEndpoint{LoopbackBinding: b, write: m.writeMetrics, log: m.log, rejects: httpguard.NewSourceLog()}
	return nil
}

// writeMetrics renders every metric of the daemon.
func (m *Manager) writeMetrics(w io.Writer) error {
	m.presetSeries()
	var t promtext.Text
	t.Family("nvpair_wlm_build_info", "gauge", "Build information; the value is always 1.")
	t.Sample("nvpair_wlm_build_info", []string{"version"}, []string{m.cfg.Version}, 1)

	t.Family("nvpair_wlm_frames_received_total", "counter", "Frames received, by source (stdio, peer, ingress) and method; peer and ingress frames count once they passed validation.")
	t.CounterSamples("nvpair_wlm_frames_received_total", []string{"source", "method"}, m.framesReceived)
	t.Family("nvpair_wlm_ingress_responses_total", "counter", "Ingress answers, by HTTP status code.")
	t.CounterSamples("nvpair_wlm_ingress_responses_total", []string{"code"}, m.ingressResponses)
	m.out.WriteMetrics(&t)
	m.brokerLines.WriteMetrics(&t)
	m.peers.WriteDedupMetrics(&t)
	t.Family("nvpair_wlm_field_bound_refusals_total", "counter", "Frames refused because a field was over its bound, by source (stdio, peer, ingress).")
	t.CounterSamples("nvpair_wlm_field_bound_refusals_total", []string{"source"}, m.fieldBoundRefusals)
	m.writeWorkloadBoundMetrics(&t)
	m.bcast.WriteMetrics(&t)

	m.peers.WriteBatchMetrics(&t)
	t.Single("nvpair_wlm_targets", "gauge", "Current broadcast targets.", float64(m.bcast.TargetCount()))
	t.Single("nvpair_wlm_pinned_peers", "gauge", "Peers with a valid pin in the cluster directory.", float64(m.trust.PinCount()))
	t.Single("nvpair_wlm_clustered", "gauge", "1 while this node is a clustered member (identity and an active admission or a pin), else 0.", boolGauge(m.trust.Clustered()))
	files := m.trust.FileStats()
	t.Single("nvpair_wlm_trust_reloads_total", "counter", "Reloads of the cluster directory completed (one per second).", float64(files.Reloads))
	t.Single("nvpair_wlm_cluster_file_reads_total", "counter", "Files of the cluster directory opened for reading (node.crt, node.key, admission.json, pins); flat while none of them changes.", float64(files.Reads))
	t.Family("nvpair_wlm_cluster_files_refused_total", "counter", "Files of the cluster directory refused unread, by reason: not_regular (a device, a named pipe, a directory) or too_large (over nvpair_wlm_cluster_file_limit_bytes); counted each time a changed file is refused.")
	t.Sample("nvpair_wlm_cluster_files_refused_total", []string{"reason"}, []string{"not_regular"}, float64(files.NotRegular))
	t.Sample("nvpair_wlm_cluster_files_refused_total", []string{"reason"}, []string{"too_large"}, float64(files.TooLarge))
	t.Single("nvpair_wlm_cluster_file_limit_bytes", "gauge", "The largest file the daemon reads from its cluster and app directories; larger ones are refused.", pairinstall.MaxFileBytes)
	t.Family("nvpair_wlm_tls_handshakes_total", "counter", "Completed TLS handshakes on the inter-node channel, by side.")
	t.Sample("nvpair_wlm_tls_handshakes_total", []string{"side"}, []string{"server"}, float64(m.trust.ServerHandshakes()))
	t.Sample("nvpair_wlm_tls_handshakes_total", []string{"side"}, []string{"client"}, float64(m.bcast.Handshakes.Load()))
	t.Family("nvpair_wlm_tls_handshake_failures_total", "counter", "Failed TLS handshakes on the inter-node channel, by side.")
	t.Sample("nvpair_wlm_tls_handshake_failures_total", []string{"side"}, []string{"server"}, float64(m.serverHandshakeFailures.Load()))
	t.Sample("nvpair_wlm_tls_handshake_failures_total", []string{"side"}, []string{"client"}, float64(m.bcast.HandshakeFailures.Load()))

	sz := m.table.Sizes()
	writeDeprecatedGauges(&t, float64(sz.Runs), float64(m.cfg.MaxLiveWorkloads), float64(sz.Removals))
	m.conns.WriteMetrics(&t)
	m.bodies.WriteMetrics(&t)
	m.peers.WriteOriginMetrics(&t)
	brokerio.WriteWaitersMetrics(&t, m.peerWaiters, m.ingressWaiters)
	m.writeLeaseMetrics(&t)
	m.writeTableMetrics(&t)
	m.ingressStats.WriteMetrics(&t)
	t.Single("go_goroutines", "gauge", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine()))
	t.Single("nvpair_wlm_gc_percent", "gauge", "The collector's GOGC in force: 100 for a small heap, lower as the live heap grows (spec 4.1), or the operator's GOGC; -1 for off.", float64(m.cfg.Pacer.Current()))
	promtext.WriteProcessMetrics(&t)
	_, err := w.Write(t.Bytes())
	return err
}

// presetSeries creates, at zero, the labelled series whose label values
// are known: frames received by source and method, the field-bound and
// workload-bound refusals by source and, with the ingress on, its answers
// by code. It is idempotent, so writeMetrics calls it on every scrape.
func (m *Manager) presetSeries() {
	sources := []string{"stdio", "peer"}
	if m.ingress != nil {
		sources = append(sources, "ingress")
		for _, code := range ingressCodes {
			m.ingressResponses.Touch(code)
		}
	}
	for _, src := range sources {
		m.fieldBoundRefusals.Touch(src)
		m.workloadBoundRefusals.Touch(src)
		methods := lifecycleAndRemoval
		if src == "stdio" {
			methods = stdioMethods
		}
		for _, method := range methods {
			m.framesReceived.Touch(src, method)
		}
	}
}

// writeTableMetrics renders the state table's gauges, counters and bounds.
func (m *Manager) writeTableMetrics(t *promtext.Text) {
	sz := m.table.Sizes()
	st := m.table.Stats()
	t.Single("nvpair_wlm_resync_set_entries", "gauge", "Workload runs this node re-asserts: live ones, and ended ones within their retention.", float64(sz.Runs))
	t.Single("nvpair_wlm_resync_set_limit_entries", "gauge", "The most workload runs re-asserted at once (--max-live-workloads).", float64(m.cfg.MaxLiveWorkloads))
	t.Single("nvpair_wlm_resync_set_bytes", "gauge", "Bytes of the re-assertion lines of those runs.", float64(sz.RunBytes))
	t.Single("nvpair_wlm_resync_set_limit_bytes", "gauge", "The most bytes of re-assertion lines held (--max-live-workload-bytes).", float64(m.cfg.MaxLiveWorkloadBytes))
	t.Single("nvpair_wlm_resync_untracked_total", "counter", "Broker frames not relayed because the state table was at a bound, in runs (a new workload) or in bytes.", float64(st.Untracked.Load()))
	t.Single("nvpair_wlm_ends_bytes", "gauge", "Bytes of the ends (ended runs and removals) this node keeps until every member has them.", float64(sz.EndedBytes))
	t.Single("nvpair_wlm_ends_limit_bytes", "gauge", "The most bytes of ends kept (--max-ended-bytes); past it the oldest goes first.", float64(m.cfg.MaxEndedBytes))
	t.Single("nvpair_wlm_ends_evicted_total", "counter", "Ends taken out at the byte bound; one a member lacked is kept in its small form until it has it.", float64(st.Evicted.Load()))
	t.Single("nvpair_wlm_ends_kept_small_total", "counter", "Ends evicted at the byte bound while a member lacked them, kept in their small form (the run's key, state, seq and times).", float64(st.Compacted.Load()))
	t.Single("nvpair_wlm_ends_small", "gauge", "Ends kept in their small form until every member has them.", float64(sz.EndKeys))
	t.Single("nvpair_wlm_ends_small_bytes", "gauge", "Bytes of the ends kept in their small form, each its line, key and 256 bytes.", float64(sz.EndKeyBytes))
	t.Single("nvpair_wlm_ends_small_limit_bytes", "gauge", "The most bytes of ends kept in their small form: the larger of --max-ended-bytes and 16 MiB.", float64(max(m.cfg.MaxEndedBytes, statetable.DefaultMinEndKeyBytes)))
	t.Single("nvpair_wlm_ends_small_evicted_total", "counter", "Small ends dropped at their bound before every member had them; such a member is sent the whole table.", float64(st.KeysEvicted.Load()))
	t.Single("nvpair_wlm_ends_unheld_bytes", "gauge", "Bytes of the removals of workloads this node held no run of, kept within an eighth of --max-ended-bytes of their own.", float64(sz.UnheldBytes))
	t.Single("nvpair_wlm_ends_unheld_evicted_total", "counter", "Removals of workloads this node held no run of, dropped at their own bound before every member had them.", float64(st.EvictedUnheld.Load()))
	t.Single("nvpair_wlm_ends_forgotten_total", "counter", "Ends forgotten once every member had them and their retention had passed.", float64(st.Forgotten.Load()))
	t.Single("nvpair_wlm_removals_held", "gauge", "Removal tombstones held.", float64(sz.Removals))
	t.Single("nvpair_wlm_members", "gauge", "Members this node keeps a mark for: targets, and nodes that left within their claim.", float64(sz.Members))
	t.Single("nvpair_wlm_member_claims_expired_total", "counter", "Members forgotten because they stayed away past their claim.", float64(st.ClaimsExpired.Load()))
	t.Single("nvpair_wlm_members_gone", "gauge", "Members that left discovery and still hold their claim.", float64(sz.GoneMembers))
	t.Single("nvpair_wlm_members_gone_bytes", "gauge", "What the members that left take: their ids and about 256 bytes each.", float64(sz.GoneBytes))
	t.Single("nvpair_wlm_members_gone_limit", "gauge", "The most members that left kept; past it, or past the byte limit, the one that left longest ago is forgotten.", float64(statetable.DefaultMaxGoneMembers))
	t.Single("nvpair_wlm_members_gone_limit_bytes", "gauge", "The most bytes of members that left kept.", float64(statetable.DefaultMaxGoneBytes))
	t.Single("nvpair_wlm_members_gone_dropped_total", "counter", "Members that left, forgotten at the bound on their count or bytes before their claim ran out.", float64(st.GoneDropped.Load()))
	t.Single("nvpair_wlm_members_gone_replaced_total", "counter", "Members that left, forgotten when their node came back under a new hostUuid with the same principal.", float64(st.GoneReplaced.Load()))
	t.Single("nvpair_wlm_member_marks_written_total", "counter", "Members' marks written to the journal, together once per prune tick.", float64(st.MarksWritten.Load()))
	t.Single("nvpair_wlm_ingress_ownership_refusals_total", "counter", "Ingress frames refused 409 because they named a workload the broker owns.", float64(st.Refused409.Load()))
	t.Single("nvpair_wlm_ingress_marks_enabled", "gauge", "1 when this node marks its ingress frames to the broker (it has its ingress mark key), else 0.", boolGauge(m.marker != nil))
	t.Single("nvpair_wlm_ingress_replay_claims_total", "counter", "Broker replays of an ingress job the journal did not hold, made its producer's again by their ingress mark.", float64(m.replayClaims.Load()))
	t.Single("nvpair_wlm_ingress_marks_unchecked_total", "counter", "Broker frames carrying an ingress mark this node did not make; the mark is cut out and the workload is the broker's.", float64(m.marksUnchecked.Load()))
	m.journal.writeMetrics(t)
}
