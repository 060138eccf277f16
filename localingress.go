package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/wireframe"
)

// ingressConfigFile, under the app directory, turns the ingress on when the
// broker starts the daemon without --local-ingress.
const ingressConfigFile = "workload-ingress.json"

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

// The ingress (internal/ingress serves it): its setup and its node
// endpoint; a producer's frame comes in through Ingest (ingressorder.go).

// NodeInfo builds the answer to GET /v1/node (internal/ingress). The
// snapshot is read under discoveryMu and the targets under
// peersend.Broadcaster.mu, each only long enough to take a reference or
// copy the target set; the live counts from the state table, O(1).
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
