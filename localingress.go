package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// ingressIdleTimeout is how long the ingress keeps an idle keep-alive
// connection from a producer.
const ingressIdleTimeout = 60 * time.Second

// ingressConfigFile, under the app directory, turns the ingress on when the
// broker starts the daemon without --local-ingress.
const ingressConfigFile = "workload-ingress.json"

// Errors ingestLocal returns, mapped to the producer's answer. A frame
// whose line to the broker would be over its line limit is
// errLineOverLimit: 413, final.
var (
	errBadFrame    = errors.New("bad frame")          // 400: the producer's mistake
	errBrokerWrite = errors.New("broker unavailable") // 500: the producer may retry
	// errNotDurable is a frame applied whose journal record could not be
	// made durable: 500, and a retry of it is harmless.
	errNotDurable = errors.New("not durable: the journal write failed")
)

// localIngress is the opt-in, plaintext, loopback-only HTTP door through
// which third-party producers on this machine report their workloads.
//
// Loopback does not keep a browser out: a web page can POST to 127.0.0.1,
// and a DNS-rebinding page reaches it under its own host name. So before
// the body is read, a request is refused when it carries an Origin header
// (only browsers send one), when its Host is not a loopback name with the
// bound port (a rebinding page's Host is its own name) or when its content
// type is not JSON (the only types a page can send without a preflight are
// form and text types).
type localIngress struct {
	*httpguard.LoopbackBinding
	m       *Manager
	rejects *httpguard.SourceLog // its refusals and failures, rate-limited per source
}

// ingressEnvelopeAllowance is what an ingress body may hold beyond its
// params' byte bound: the envelope (jsonrpc, method, an id) and the
// whitespace a pretty-printing producer puts around them, a few hundred
// bytes in practice.
const ingressEnvelopeAllowance = 16 << 10

// ingressBodyMax is the ingress's body cap: the workload byte bound plus
// the envelope allowance, 32 KiB at the defaults, never more than the
// 1 MiB frame cap. A body over it could only carry params over the bound,
// so it is refused (413) before any of it is reserved or read; and the
// ingress's connections together, 512 at the default cap, can then reserve
// 16 MiB at most, half the ingress's body budget, so bodies declared and
// never sent cannot take the room that producers' posts need.
func ingressBodyMax(workloadMax int) int64 {
	return min(int64(workloadMax)+ingressEnvelopeAllowance, wireframe.MaxBytes)
}

// EnableLocalIngress turns the loopback ingress on at addr. It must be
// called before Run, which binds it. A non-loopback address is refused.
func (m *Manager) EnableLocalIngress(addr string) error {
	li, err := newLocalIngress(m, addr)
	if err != nil {
		return err
	}
	m.ingress = li
	return nil
}

func newLocalIngress(m *Manager, addr string) (*localIngress, error) {
	b, err := httpguard.NewLoopbackBinding("local ingress", addr, m.conns.Ingress)
	if err != nil {
		return nil, err
	}
	return &localIngress{LoopbackBinding: b, m: m, rejects: httpguard.NewSourceLog()}, nil
}

// resolveIngressAddr returns the ingress address: the flag's when given,
// else the listen address in <appDir>/workload-ingress.json. An absent or
// empty file means off.
//
// **Decision** (spec 3.5): any bad value in the file also means off, with
// one ERROR line naming the file, saying what is wrong and showing a valid
// file, and the daemon goes on relaying. The file is read at every start,
// and PAIR's supervisor restarts a worker that exits: were a bad file fatal,
// the node would loop with its relay down until someone fixed it. A bad
// value is JSON that is not one object, a member other than "listen" spelt
// exactly so (the frames refuse case variants; so does the file), or an
// address that is not loopback with a numeric port. A bad flag still fails
// the start: the operator is there to read it.
func resolveIngressAddr(flagAddr, appDir string, log *slog.Logger) (string, error) {
	if flagAddr != "" {
		return flagAddr, nil
	}
	path := filepath.Join(appDir, ingressConfigFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err == nil && len(strings.TrimSpace(string(b))) == 0 {
		return "", nil
	}
	if err == nil {
		var addr string
		if addr, err = parseIngressConfig(b); err == nil {
			return addr, nil
		}
	}
	log.Error("local ingress off: "+ingressConfigFile+" is not usable; the daemon relays without it",
		"file", path, "reason", httpguard.ClipReason(err.Error()), "valid", validIngressConfig)
	return "", nil
}

// validIngressConfig is the example the error line shows.
const validIngressConfig = `{"listen": "127.0.0.1:14324"}`

// parseIngressConfig reads the file's one member, "listen", and checks its
// address is loopback with a numeric port.
func parseIngressConfig(b []byte) (string, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(b, &members); err != nil || members == nil {
		return "", errors.New("not a JSON object")
	}
	for name := range members {
		if name != "listen" {
			return "", fmt.Errorf("unknown member %q: the file has one member, \"listen\"", name)
		}
	}
	raw, ok := members["listen"]
	if !ok {
		return "", errors.New(`no "listen" member`)
	}
	var addr string
	if err := json.Unmarshal(raw, &addr); err != nil || addr == "" {
		return "", errors.New(`"listen" is not a HOST:PORT string`)
	}
	if err := httpguard.CheckLoopbackBind(addr); err != nil {
		return "", fmt.Errorf("listen %q: %w", addr, err)
	}
	return addr, nil
}

// IngressAddr returns the ingress's bound address once Run has bound it,
// or "" when the ingress is off.
func (m *Manager) IngressAddr() string {
	if m.ingress == nil {
		return ""
	}
	return m.ingress.BoundAddr()
}

func (li *localIngress) serve(wg *sync.WaitGroup, ln net.Listener) *http.Server {
	return li.Serve(wg, ln, li, ingressIdleTimeout, li.m.log)
}

// ServeHTTP answers a producer, logs the answer and counts it.
func (li *localIngress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == readBackPath {
		li.serveReadBack(w, r) // readback.go: the same Origin and Host checks first
		return
	}
	if r.URL.Path == nodeInfoPath {
		li.serveNodeInfo(w, r) // nodeinfo.go: the same browser checks first
		return
	}
	status, reason, f := li.decide(w, r)
	reason = httpguard.ClipReason(reason)
	li.m.ingressResponses.Inc(httpguard.StatusCode(status))
	// The method and path come from the request: clipped, like every
	// value a client chooses.
	log := httpguard.NewRequestLog(li.m.log, "ingress", r.RemoteAddr)
	log.With("httpMethod", httpguard.ClipReason(r.Method))
	log.With("path", httpguard.ClipReason(r.URL.Path))
	switch {
	case status == http.StatusOK:
		if log.Enabled(slog.LevelDebug) {
			log.Logger().Debug("ingress frame accepted", "method", f.method, "id", httpguard.ClipLogged(f.workloadID()))
		}
	case brokerio.IsBusy(status, reason):
		li.m.ingressWaiters.NoteRefusal(li.m.log)
	case status >= http.StatusInternalServerError:
		li.rejects.Log(log.Logger(), slog.LevelError, r.RemoteAddr, status, "ingress frame not accepted", "status", status, "reason", reason)
	default:
		li.rejects.Log(log.Logger(), slog.LevelWarn, r.RemoteAddr, status, "ingress request rejected", "status", status, "reason", reason)
	}
	httpguard.Answer(w, status, reason)
}

// decide runs the checks in a fixed order, so every request gets one
// deterministic answer, and ingests the frame when they pass. The first
// checks are decided from the headers alone.
func (li *localIngress) decide(w http.ResponseWriter, r *http.Request) (int, string, localFrame) {
	if status, reason := li.checkRequest(r); status != 0 {
		// The body is not read, so the connection cannot be reused: closing
		// it also means the answer goes out at once, even when the declared
		// body never arrives.
		w.Header().Set("Connection", "close")
		if status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", http.MethodPost) // RFC 9110: a 405 names what is allowed
		}
		return status, reason, localFrame{}
	}
	// Reserved and read only once the checks above passed, so a page or a
	// misdirected request holds nothing of the ingress's budget; given
	// back once the frame is written.
	body, release, err := li.m.bodies.Ingress.ReadBody(w, r, ingressBodyMax(li.m.cfg.WorkloadMaxBytes))
	if err != nil {
		status, reason := httpguard.BodyRefusal(w, err)
		if status == http.StatusRequestEntityTooLarge {
			// The cap follows the workload bound: the producer is told the
			// bound it met, and it is counted, as a frame over it is.
			li.m.workloadBoundRefusals.Inc("ingress")
			reason = fmt.Sprintf("%s: its params would be over their %d-byte bound (--workload-max-bytes)", reason, li.m.cfg.WorkloadMaxBytes)
		}
		return status, reason, localFrame{}
	}
	defer release()
	f, err := li.m.ingestLocalLeased(body, r.Header.Values(leaseHeader))
	if err == nil {
		return http.StatusOK, "ok", f
	}
	status, reason := refusalOf(w, err)
	return status, reason, f
}

// refusalOf maps ingestLocal's error to the producer's answer, setting the
// headers it needs.
func refusalOf(w http.ResponseWriter, err error) (int, string) {
	var atLimit *errAtLimit
	var busy *brokerio.BusyError
	var tooLarge *wireframe.WorkloadTooLargeError
	switch {
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge, err.Error()
	case errors.As(err, &busy):
		brokerio.SetBusyHeaders(w)
		return http.StatusServiceUnavailable, err.Error()
	case isNotOwned(err):
		return http.StatusConflict, err.Error()
	case errors.As(err, &atLimit):
		w.Header().Set("Retry-After", strconv.Itoa(atLimit.retryAfterSeconds()))
		return http.StatusServiceUnavailable, err.Error()
	case errors.Is(err, wireframe.ErrLineOverLimit):
		return http.StatusRequestEntityTooLarge, err.Error()
	case errors.Is(err, errBrokerWrite), errors.Is(err, errNotDurable):
		return http.StatusInternalServerError, err.Error()
	}
	return http.StatusBadRequest, err.Error()
}

// checkRequest applies the checks that need no body, in order, and returns
// the status and reason of the first that fails, or 0.
func (li *localIngress) checkRequest(r *http.Request) (int, string) {
	if status, reason := li.refusePages(r); status != 0 { // fetchmetadata.go
		return status, reason
	}
	if r.URL.Path != peerwire.EventsPath {
		return http.StatusNotFound, "no such endpoint; POST to " + peerwire.EventsPath
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

// ingestLocal takes a producer's frame: validate; then, under ingestMu,
// take its place in the broker order; then, with ingestMu released, wait
// until it is written up to the broker and committed (tracked, remembered,
// queued) after the write, in the broker order (ingressorder.go). A failed
// broker write leaves nothing tracked, queued or remembered, so peers never
// show a workload the origin broker does not hold and the producer can
// retry; so does a frame the broker writer refuses as over the line limit,
// which is returned as it is. ingestMu keeps concurrent posts for one
// workload in one order at the broker and in the state table. A post
// waiting for ingestMu or for its write waits on the broker as surely as
// the one writing, so the slot that bounds the ingress's waiters is taken
// before ingestMu, and a post that finds none is refused with
// *brokerio.BusyError before it waits for anything.
func (m *Manager) ingestLocal(body []byte) (localFrame, error) {
	return m.ingestLocalLeased(body, nil)
}

// ingestLocalLeased is ingestLocal for a request whose Workload-Lease
// header had the given values (lease.go): a bad one is the producer's
// mistake, refused before anything is written.
func (m *Manager) ingestLocalLeased(body []byte, lease []string) (localFrame, error) {
	fr, err := wireframe.ParseIngressAs(body, m.cfg.NodeID, m.cfg.NodeIDAliases, m.cfg.WorkloadMaxBytes)
	f := localFrame{method: fr.Method, params: fr.Params, life: fr.Life, removal: fr.Removal}
	m.refusedOverBound(err, "ingress")
	if m.refusedOverWorkloadBound(err, "ingress") {
		return f, err // 413 (refusalOf)
	}
	if err != nil {
		return f, fmt.Errorf("%w: %v", errBadFrame, err)
	}
	if f.leaseSeconds, err = parseLeaseHeader(lease, &f); err != nil {
		m.leases.refused.Add(1)
		return f, fmt.Errorf("%w: %v", errBadFrame, err)
	}
	if !m.ingressWaiters.Acquire(nil) {
		return f, m.ingressWaiters.Busy()
	}
	defer m.ingressWaiters.Release()
	m.framesReceived.Inc("ingress", f.method)
	// Both lines are built before ingestMu: only the frame's place in the
	// order is decided under it.
	line, peerLine := frameLine(&f), tableLine(&f)
	turn, err := m.enterIngress(f, line, peerLine)
	if err != nil {
		return f, err
	}
	return f, turn.wait()
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

// errAtLimit is an ingress frame refused because the re-sync set is at a
// bound: it would start a new workload while the set holds
// --max-live-workloads, or take the set's bytes past
// --max-live-workload-bytes. 503, with the time until room may free as
// Retry-After.
type errAtLimit struct {
	bound statetable.Limit
	limit int64
	held  int64 // the set's bytes, for the byte bound
	after time.Duration
}

func (e *errAtLimit) Error() string {
	if e.bound == statetable.LimitBytes {
		return fmt.Sprintf("this node holds %d bytes of workloads, and this frame would take it past its limit of %d (--max-live-workload-bytes); retry after %d s", e.held, e.limit, e.retryAfterSeconds())
	}
	return fmt.Sprintf("this node holds %d workloads, its limit (--max-live-workloads); retry after %d s", e.limit, e.retryAfterSeconds())
}

func (e *errAtLimit) retryAfterSeconds() int {
	return max(1, int((e.after+time.Second-1)/time.Second))
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
		return false, &errAtLimit{bound: hit, limit: int64(m.cfg.MaxLiveWorkloads), after: after}
	case statetable.LimitBytes:
		return false, &errAtLimit{bound: hit, limit: m.cfg.MaxLiveWorkloadBytes, held: m.table.Sizes().RunBytes, after: after}
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
		return &errAtLimit{bound: statetable.LimitBytes, limit: m.cfg.MaxLiveWorkloadBytes, held: size, after: m.cfg.ResyncInterval}
	}
	return nil
}

// refusePages applies the ingress's browser checks, in order: Origin (403)
// and Host (421) as on every loopback listener, then Fetch Metadata (403),
// counted. It returns 0 when none applies. Every ingress path runs it
// first, before it reads a body or looks at the re-sync set.
func (li *localIngress) refusePages(r *http.Request) (int, string) {
	if status, reason := li.RefuseBrowsers(r); status != 0 {
		return status, reason
	}
	status, reason := httpguard.RefuseFetchMetadata(r.Header)
	if status != 0 {
		li.m.readBacks.fetchMetadataRefused.Add(1)
	}
	return status, reason
}
