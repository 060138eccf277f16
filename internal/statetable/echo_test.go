package statetable

import (
	"fmt"
	"testing"
	"time"

	"nvpair-workload-manager/internal/wireframe"
)

// The broker's replay of a frame this node's ingress wrote up (an echo,
// its ingress mark checked by the caller) after a crash that took the
// frame's journal record (spec 3.5.3).

func echo(t testing.TB, tb *Table, ev *wireframe.Lifecycle, lease int) (Outcome, bool) {
	t.Helper()
	f := &Frame{Source: FromBroker, Life: ev, Echo: true, LeaseSeconds: lease}
	o, _ := tb.Commit(f)
	return o, f.Claimed
}

func ref(id string) wireframe.WorkloadRef { return wireframe.WorkloadRef{Origin: self, ID: id} }

func keyOf(id string) wireframe.WorkloadKey {
	return wireframe.WorkloadKey{Origin: self, Engine: "e", RunID: "r-" + id, ID: id}
}

func TestAnEchoOfAWorkloadTheTableHoldsNoRunOfIsItsProducersWithItsLeaseFromNow(t *testing.T) {
	tb, c, j := newTable(t)
	o, claimed := echo(t, tb, event(t, "lost", "queued"), 30)
	if o != Applied || !claimed {
		t.Fatalf("the echo: %s, claimed %v", o, claimed)
	}
	if err := tb.CheckProducer(ref("lost")); err != nil {
		t.Fatalf("the producer's retry after the echo: %v, want it taken", err)
	}
	if at := tb.LeaseOf(keyOf("lost")); !at.Equal(c.now().Add(30 * time.Second)) {
		t.Fatalf("the lease after the echo runs out at %v, want 30 s from the echo (%v)", at, c.now().Add(30*time.Second))
	}
	// Journaled as the producer's: the next restart keeps it without a
	// replay.
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	again.Restore(j.records(), 5*time.Second)
	if err := again.CheckProducer(ref("lost")); err != nil || again.LeaseOf(keyOf("lost")).IsZero() {
		t.Fatalf("after the next restart: %v, lease %v: the claim was not journaled", err, again.LeaseOf(keyOf("lost")))
	}
}

func TestAnEchoWithoutALeaseArmsNone(t *testing.T) {
	tb, _, _ := newTable(t)
	if _, claimed := echo(t, tb, event(t, "unleased", "running"), 0); !claimed {
		t.Fatal("not claimed")
	}
	if at := tb.LeaseOf(keyOf("unleased")); !at.IsZero() {
		t.Fatalf("a lease until %v, want none", at)
	}
}

func TestAnEchoOfAWorkloadTheBrokerOwnsLeavesItTheBrokers(t *testing.T) {
	tb, _, _ := newTable(t)
	commit(t, tb, FromBroker, event(t, "proxy-1", "running"))
	o, claimed := echo(t, tb, event(t, "proxy-1", "completed"), 0)
	if o != Applied || claimed {
		t.Fatalf("the echo of the broker's job: %s, claimed %v; want applied as the broker's", o, claimed)
	}
	if err := tb.CheckProducer(ref("proxy-1")); !IsBrokerOwned(err) {
		t.Fatalf("a producer's frame after it: %v, want the broker's 409", err)
	}
	// So too for a new run of an id whose other run the broker owns.
	if _, claimed := echo(t, tb, event(t, "proxy-1", "running", `"runId":"r-2"`), 30); claimed {
		t.Fatal("an echo claimed a new run of a workload the broker owns")
	}
}

func TestAnEchoOfAProducersWorkloadKeepsTheLeaseTheJournalRestored(t *testing.T) {
	tb, c, _ := newTable(t)
	if o, _ := tb.Commit(&Frame{Source: FromProducer, Life: event(t, "kept", "queued"), LeaseSeconds: 10}); o != Applied {
		t.Fatal(o)
	}
	deadline := tb.LeaseOf(keyOf("kept"))
	c.advance(5 * time.Second)
	o, claimed := echo(t, tb, event(t, "kept", "running"), 600)
	if o != Applied || claimed {
		t.Fatalf("the echo of the producer's own job: %s, claimed %v; want applied, not claimed again", o, claimed)
	}
	if at := tb.LeaseOf(keyOf("kept")); !at.Equal(deadline) {
		t.Fatalf("the lease runs out at %v after the echo, want the journal's %v", at, deadline)
	}
}

func TestAnEchoOfARunItsProducerRemovedIsDropped(t *testing.T) {
	tb, _, _ := newTable(t)
	commit(t, tb, FromProducer, event(t, "gone", "running"))
	remove(t, tb, FromProducer, "gone")
	if o, claimed := echo(t, tb, event(t, "gone", "running"), 30); o != ReplayDropped || claimed {
		t.Fatalf("the echo of a removed run: %s, claimed %v; want dropped", o, claimed)
	}
}

func TestABrokerFrameThatIsNoEchoMakesNoWorkloadAProducers(t *testing.T) {
	tb, _, _ := newTable(t)
	f := &Frame{Source: FromBroker, Life: event(t, "plain", "queued"), LeaseSeconds: 30}
	if o, _ := tb.Commit(f); o != Applied || f.Claimed {
		t.Fatalf("%s, claimed %v", o, f.Claimed)
	}
	if err := tb.CheckProducer(ref("plain")); !IsBrokerOwned(err) {
		t.Fatalf("the broker's frame left the workload %v, want the broker's", err)
	}
	if at := tb.LeaseOf(keyOf("plain")); !at.IsZero() {
		t.Fatal("a broker frame armed a lease")
	}
}

func TestAnEchoArmsNoLeaseOutsideTheHeadersBounds(t *testing.T) {
	tb, _, _ := newTable(t)
	for _, l := range []int{1, MinLeaseSeconds - 1, MaxLeaseSeconds + 1} {
		id := fmt.Sprint("odd-", l)
		if _, claimed := echo(t, tb, event(t, id, "running"), l); !claimed {
			t.Fatal("not claimed")
		}
		if at := tb.LeaseOf(keyOf(id)); !at.IsZero() {
			t.Fatalf("a lease of %d s was armed", l)
		}
	}
}
