package main

import (
	"nvpair-workload-manager/internal/wireframe"
)

// Field bounds. Every string that identifies a workload or one of its
// events is at most maxKeyFieldBytes (workloadtypes.go, checked by the
// parse step the local channel, the ingress and the peer port share), and
// the ingress bounds a producer's error text too (ingressframe.go). A frame
// over a bound is refused: 400 naming the field and the bound on the
// ingress and the peer port, a rate-limited warning on the local channel,
// never broadcast or written. Each refusal is counted by source.

// refusedOverBound reports whether err refuses a frame for a field over its
// bound, and counts it for source (stdio, peer, ingress) when it does.
func (m *Manager) refusedOverBound(err error, source string) bool {
	if !wireframe.IsFieldTooLong(err) {
		return false
	}
	m.fieldBoundRefusals.Inc(source)
	return true
}
