package main

import (
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/statetable"
)

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
// broker's replay of them is the producer's again.

// restartLeaseGrace is the least time a lease restored from the journal is
// given, in lease units (a second each): a producer that outlived the
// daemon's restart renews at a third of its lease, and its renewals failed
// while the daemon was down. A lease whose deadline passed while the
// daemon was down runs out this long after the start; one still ahead
// keeps its deadline.
const restartLeaseGrace = minLeaseSeconds

// checkOwner refuses an ingress frame that names a workload the broker
// owns. Called with ingestMu held, before the frame takes its place in the
// broker order, so a refused frame is neither written nor relayed. A
// broker frame for the id that arrives while the frame waits for its write
// is caught at the commit (statetable.BrokerTook).
func (m *Manager) checkOwner(f *localFrame) error {
	return m.table.CheckProducer(f.ref())
}

// isNotOwned reports whether err is a 409.
func isNotOwned(err error) bool { return statetable.IsBrokerOwned(err) }

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
	t.Single("nvpair_wlm_ends_evicted_total", "counter", "Ends dropped at the byte bound before every member had them; such a member is sent the whole table.", float64(st.Evicted.Load()))
	t.Single("nvpair_wlm_ends_unheld_bytes", "gauge", "Bytes of the removals of workloads this node held no run of, kept within an eighth of --max-ended-bytes of their own.", float64(sz.UnheldBytes))
	t.Single("nvpair_wlm_ends_unheld_evicted_total", "counter", "Removals of workloads this node held no run of, dropped at their own bound before every member had them.", float64(st.EvictedUnheld.Load()))
	t.Single("nvpair_wlm_ends_forgotten_total", "counter", "Ends forgotten once every member had them and their retention had passed.", float64(st.Forgotten.Load()))
	t.Single("nvpair_wlm_removals_held", "gauge", "Removal tombstones held.", float64(sz.Removals))
	t.Single("nvpair_wlm_members", "gauge", "Members this node keeps a mark for: targets, and nodes that left within their claim.", float64(sz.Members))
	t.Single("nvpair_wlm_member_claims_expired_total", "counter", "Members forgotten because they stayed away past their claim.", float64(st.ClaimsExpired.Load()))
	t.Single("nvpair_wlm_ingress_ownership_refusals_total", "counter", "Ingress frames refused 409 because they named a workload the broker owns.", float64(st.Refused409.Load()))
	m.journal.writeMetrics(t)
}
