package main

import (
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/wireframe"
	"path/filepath"
)

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
