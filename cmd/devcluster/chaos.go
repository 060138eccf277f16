package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// --chaos injects faults while the simulated traffic runs, one after the
// other, and logs each as it injects it:
//
//  1. a daemon restart: killed, then started again; the other brokers see
//     its node leave discovery and fail its live jobs by inference, and its
//     broker replays its jobs before the new daemon's ready, which undoes
//     the guess;
//  2. a leased producer killed mid-job: node 1's ingress producer stops
//     reporting a live job, and its lease fails it on every node;
//  3. a node cut off from its peers for longer than the staleness budget,
//     then back: every broker fails the other side's live jobs as not
//     re-asserted, and the heartbeats after the cut undo that;
//  4. one node's answers slowed (each chunk it sends its peers held
//     chaosSlowBy): deliveries to it take longer, nothing is lost.
//
// The run still ends converged, every job in the state its producer or
// broker last meant (a lease-expired job failed): the faults that can lose
// an event for good (a removal is never repaired; a terminal frame is
// re-asserted only for two heartbeats) hold the simulator's removals and
// job ends while they last and for two heartbeats after (simulator.holdRemovals).
const (
	chaosStartAfter = 3 * time.Second
	chaosSlowFor    = 8 * time.Second
	chaosSlowBy     = 300 * time.Millisecond
	chaosLeaseWait  = 3 * time.Second // after the producer's crash, before the next fault
)

// chaosPlan is who suffers which fault.
type chaosPlan struct {
	restart, cut, slow *node
}

// planChaos picks the nodes: the restart and the cut fall on this daemon's
// nodes other than node 1 where there are any (a stock daemon's 30 s
// heartbeat would stretch the healing past a short run), the slow answers
// on a stock node when there is one.
func planChaos(c *cluster) chaosPlan {
	var ours []*node
	for _, n := range c.nodes[1:] {
		if !n.stock {
			ours = append(ours, n)
		}
	}
	p := chaosPlan{restart: c.nodes[0], cut: c.nodes[0], slow: c.nodes[len(c.nodes)-1]}
	if len(ours) > 0 {
		p.restart = ours[0]
	}
	if len(ours) > 1 {
		p.cut = ours[len(ours)-1]
	}
	return p
}

// chaosCutFor is how long the cut lasts: the staleness budget and two
// heartbeats more, so every silent job has been swept.
func chaosCutFor(cfg config) time.Duration { return cfg.staleAfter + 2*cfg.resyncInterval }

// chaosNeeds is how long a run must be for every fault to be injected and
// healed before the traffic stops, a restart counted at readyTimeout/4.
func chaosNeeds(cfg config) time.Duration {
	heal := 2 * cfg.resyncInterval
	return chaosStartAfter + readyTimeout/4 + heal + chaosLeaseWait + chaosCutFor(cfg) + heal + chaosSlowFor
}

// runChaos injects the faults of the plan until done, or ctx ends; every
// fault is undone before it returns.
func runChaos(ctx context.Context, c *cluster, sim *simulator, cfg config, logf func(string, ...any)) {
	p := planChaos(c)
	heal := 2 * cfg.resyncInterval
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	hold := func() {
		sim.endsHeld.Store(true)
		sim.holdRemovals()
	}
	release := func() {
		sim.endsHeld.Store(false)
		sim.resumeRemovals()
	}
	defer func() {
		c.links.setCut(p.cut, false)
		c.links.setSlow(p.slow, 0)
		release()
	}()

	if !wait(chaosStartAfter) {
		return
	}
	hold()
	logf("chaos: restarting %s's daemon (killed, then started): the others fail its live jobs by inference until its broker's replay brings them back", p.restart.name)
	if err := c.kill(p.restart); err != nil {
		logf("chaos: %v", err)
	}
	if err := c.start(p.restart); err != nil {
		logf("chaos: restart %s: %v", p.restart.name, err)
	}
	if !wait(heal) {
		return
	}
	release()

	logf("chaos: killing node1's producer mid-job: its %d s lease fails the job on every node", simLeaseSeconds)
	sim.crashNext.Store(true)
	if !wait(chaosLeaseWait) {
		return
	}

	hold()
	cutFor := chaosCutFor(cfg)
	logf("chaos: cutting %s off from its peers for %s (staleness budget %s): each side fails the other's live jobs as not re-asserted", p.cut.name, cutFor.Round(time.Second), cfg.staleAfter)
	c.links.setCut(p.cut, true)
	if !wait(cutFor) {
		return
	}
	c.links.setCut(p.cut, false)
	logf("chaos: %s is back: the heartbeats re-assert the live jobs and undo the guesses", p.cut.name)
	if !wait(heal) {
		return
	}
	release()

	logf("chaos: slowing %s's answers (each held %s) for %s: its deliveries lag, nothing is lost", p.slow.name, chaosSlowBy, chaosSlowFor)
	c.links.setSlow(p.slow, chaosSlowBy)
	if !wait(chaosSlowFor) {
		return
	}
	c.links.setSlow(p.slow, 0)
	logf("chaos: %s answers at full speed again; all faults injected", p.slow.name)
}

// checkIntents compares the converged Jobs list with what the simulator's
// paths last meant, and returns each job that differs.
func checkIntents(sim *simulator, v nodeView) []string {
	names := map[string]string{}
	for _, n := range sim.c.nodes {
		names[n.id] = n.short
	}
	shown := map[jobKey]string{}
	for _, j := range v.jobs {
		shown[jobKey{j.Origin, j.ID}] = j.State
	}
	var bad []string
	for k, in := range sim.intended() {
		got, ok := shown[k]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s/%s is missing (its path last meant %s)", names[k.origin], k.id, in.state))
		case !in.accepts(got):
			bad = append(bad, fmt.Sprintf("%s/%s is %s, its path last meant %s", names[k.origin], k.id, got, in.state))
		}
	}
	for _, k := range sim.removedJobs() {
		if _, ok := shown[k]; ok {
			bad = append(bad, fmt.Sprintf("%s/%s is shown though it was removed", names[k.origin], k.id))
		}
	}
	slices.Sort(bad)
	return bad
}

// intentVerdict is checkIntents as one line for the summary, "" when every
// job is as meant.
func intentVerdict(bad []string) string {
	if len(bad) == 0 {
		return ""
	}
	if len(bad) > 6 {
		bad = append(bad[:6], fmt.Sprintf("and %d more", len(bad)-6))
	}
	return strings.Join(bad, "; ")
}
