package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// ingressConfigFile, under the app directory, turns the ingress on when the
// broker starts the daemon without --local-ingress.
const ingressConfigFile = "workload-ingress.json"

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
		return f, fmt.Errorf("%w: %v", ingress.ErrBadFrame, err)
	}
	if f.leaseSeconds, err = parseLeaseHeader(lease, &f); err != nil {
		m.leases.refused.Add(1)
		return f, fmt.Errorf("%w: %v", ingress.ErrBadFrame, err)
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
