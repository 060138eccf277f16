package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/peersend"
	"nvpair-workload-manager/internal/peerserver"
	"nvpair-workload-manager/internal/wireframe"
)

// discoveredNode is one entry of a discovery:nodes snapshot: PAIR's
// directory node, of which the daemon reads the members below (spec 4).
// ip is the node's canonical address and ips its ranked candidate list, ip
// first (PAIR's shared node record); addresses is the name an earlier
// contract gave the list in error, still read after ips so a broker or a
// tool written to it keeps working.
type discoveredNode struct {
	HostUUID    string   `json:"hostUuid"`
	Name        string   `json:"name"`
	IP          string   `json:"ip"`
	IPs         []string `json:"ips"`
	Addresses   []string `json:"addresses"`
	ClusterUUID string   `json:"clusterUuid"`
	Services    struct {
		WL *struct {
			Port int `json:"port"`
		} `json:"wl"`
	} `json:"services"`
}

// parseDiscovery decodes a discovery:nodes snapshot's params.
func parseDiscovery(params json.RawMessage) ([]discoveredNode, error) {
	var p struct {
		Nodes []discoveredNode `json:"nodes"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, fmt.Errorf("discovery:nodes params: %w", err)
	}
	return p.Nodes, nil
}

// selectTargets picks the nodes to broadcast to: not this node, advertising
// a wl port, reachable at some address, and pinned under its clusterUuid.
// Skipped nodes are logged at debug.
func selectTargets(nodes []discoveredNode, self string, pinned func(principal string) bool, log *slog.Logger) []peersend.Target {
	var targets []peersend.Target
	for _, n := range nodes {
		skip := func(reason string) {
			log.Debug("discovery: not a target", "node", httpguard.ClipLogged(n.Name), "host", httpguard.ClipLogged(n.HostUUID), "reason", reason)
		}
		switch {
		case n.HostUUID == self:
			continue
		case n.Services.WL == nil || n.Services.WL.Port < 1 || n.Services.WL.Port > 65535:
			skip("no wl port")
			continue
		case n.ClusterUUID == "" || !pinned(n.ClusterUUID):
			skip("no valid pin for its clusterUuid")
			continue
		case len(n.HostUUID)+1+len(n.ClusterUUID) > wireframe.MaxKeyFieldBytes:
			// The member's id (hostUuid|clusterUuid) is journaled with its
			// mark and read back at this bound: a longer one would be
			// refused at restore, and it bounds the members' bytes.
			skip("hostUuid and clusterUuid past the member id's bound")
			continue
		}
		addrs := dialAddresses(n, n.Services.WL.Port)
		if len(addrs) == 0 {
			skip("no usable address")
			continue
		}
		name := n.Name
		if name == "" {
			name = n.HostUUID
		}
		// The name is only ever logged (every line of the peer's sender
		// carries it), so it is kept clipped.
		name = httpguard.ClipLogged(name)
		targets = append(targets, peersend.Target{HostUUID: n.HostUUID, Name: name, Principal: n.ClusterUUID, Addrs: addrs})
	}
	return targets
}

// dialAddresses returns host:port for ip, then each of ips, then each of
// addresses, skipping what does not parse as an IP address and repeats.
// IPv6 addresses come out bracketed, with their zone when they have one. A
// multi-homed node's ip may be one this node cannot reach (a direct link
// to another machine): its sender dials the next candidate when one fails.
func dialAddresses(n discoveredNode, port int) []string {
	var out []string
	candidates := make([]string, 0, 1+len(n.IPs)+len(n.Addresses))
	candidates = append(append(append(candidates, n.IP), n.IPs...), n.Addresses...)
	for _, a := range candidates {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			continue
		}
		hp := net.JoinHostPort(ip.String(), strconv.Itoa(port))
		if !slices.Contains(out, hp) {
			out = append(out, hp)
		}
	}
	return out
}

func targetNames(ts []peersend.Target) []string {
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.Name + "@" + t.Addrs[0]
	}
	slices.Sort(names)
	return names
}

// Each snapshot re-derives the broadcast targets and the peer port's
// origin index.

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
	// The peer port's per-source cap counts the members behind an address.
	m.conns.Peer.SetSourceMembers(peersend.SourceMembers(targets))
	if len(added) == 0 && len(removed) == 0 {
		return
	}
	// A new target's sender starts a heartbeat pass at once: that is its
	// backfill with the whole re-sync set.
	m.log.Info("broadcast targets changed", "added", targetNames(added), "removed", targetNames(removed), "total", len(targets))
}
