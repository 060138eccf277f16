package main

// peerQueueDepths returns, by peer principal, the fresh frames waiting in
// that peer's queue for its fresh lane (at most peerQueueSize each). A
// peer that left the target set has no queue and is not in the map.
// It takes broadcaster.mu for a length per peer, no more.
func (b *broadcaster) peerQueueDepths() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int, len(b.peers))
	for _, s := range b.peers {
		out[s.target.principal] += len(s.queue)
	}
	return out
}

// peerQueueBytes returns, by peer principal, the bytes of the fresh frames
// waiting in that peer's queue (at most peerQueueMaxBytes each, beside
// peerQueueSize frames). Like peerQueueDepths, it takes broadcaster.mu
// for one load per peer.
func (b *broadcaster) peerQueueBytes() map[string]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int64, len(b.peers))
	for _, s := range b.peers {
		out[s.target.principal] += s.queueBytes.Load()
	}
	return out
}

// peerOverflowWorkloads returns, by peer principal, the workloads marked
// for that peer and not yet taken by its heartbeat lane (overflow.go). It
// takes broadcaster.mu for an atomic load per peer, no more.
func (b *broadcaster) peerOverflowWorkloads() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int, len(b.peers))
	for _, s := range b.peers {
		out[s.target.principal] += s.lanes.marks.len()
	}
	return out
}
