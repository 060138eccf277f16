package statetable

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// A member's acknowledgment writes no record of its own: the marks that
// moved are written together at the prune tick, one record for 20 members
// (spec 5.4), and a restart restores every one of them.
func TestAcknowledgmentsWriteNoRecordPerMemberTheirMarksGoTogetherAtThePruneTick(t *testing.T) {
	tb, c, j := newTable(t)
	var ms []*Member
	for i := range 20 {
		ms = append(ms, tb.Join(fmt.Sprintf("peer-%d", i)))
	}
	before := len(j.records())
	const changes = 10
	for i := range changes {
		commit(t, tb, FromBroker, event(t, fmt.Sprintf("job-%d", i), "completed"))
		for _, m := range ms {
			sent(t, tb, m)
		}
	}
	ends := len(j.records()) - before // each end is journaled: one put per change
	if ends != changes {
		t.Fatalf("%d changes taken by 20 members wrote %d records, want %d (the ends' own, none per member)", changes, ends, changes)
	}
	tb.Prune()
	if n := len(j.records()) - before - ends; n != 1 {
		t.Fatalf("the prune tick wrote %d records for 20 marks that moved, want 1", n)
	}
	tb.Prune()
	if n := len(j.records()) - before - ends; n != 1 {
		t.Fatalf("a prune tick with no mark moved wrote %d records", n-1)
	}
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	if st := again.Restore(j.records(), time.Second); st.Refused != 0 {
		t.Fatalf("restore refused %d records", st.Refused)
	}
	for _, m := range ms {
		if got, _ := again.MemberMark(m.id); got != tb.Version() {
			t.Fatalf("%s restored at mark %d, want %d", m.id, got, tb.Version())
		}
	}
}

// A mark not written yet lags: after a restart the member is sent again
// what it took since the last tick, never less.
func TestAMarkNotYetWrittenLagsAndTheMemberIsSentAgainWhatItTook(t *testing.T) {
	tb, c, j := newTable(t)
	m := tb.Join("peer")
	commit(t, tb, FromBroker, event(t, "a", "completed"))
	sent(t, tb, m)
	tb.Prune()
	commit(t, tb, FromBroker, event(t, "b", "completed"))
	sent(t, tb, m) // taken, not yet written
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	again.Restore(j.records(), time.Second)
	if got := sent(t, again, again.Join("peer")); len(got) != 1 || got[0] != "b:completed" {
		t.Fatalf("after the restart the member is sent %v, want b:completed again", got)
	}
}

// A commit pokes the members that wait for a change, not those behind:
// 2,000 members away cost a commit nothing.
func TestACommitWakesOnlyTheMembersThatWait(t *testing.T) {
	tb, _, _ := newTable(t)
	waiting, behind := tb.Join("waiting"), tb.Join("behind")
	commit(t, tb, FromBroker, event(t, "a", "running"))
	sent(t, tb, waiting) // takes a, finds nothing more: waits
	drain(waiting, behind)
	commit(t, tb, FromBroker, event(t, "b", "running"))
	if !poked(waiting) {
		t.Fatal("a member waiting for a change was not woken by it")
	}
	if poked(behind) {
		t.Fatal("a member that is behind was woken: a commit would cost every member")
	}
	commit(t, tb, FromBroker, event(t, "c", "running"))
	if poked(waiting) {
		t.Fatal("a member that has not looked since its last wake was woken again")
	}
}

func drain(ms ...*Member) {
	for _, m := range ms {
		poked(m)
	}
}

func poked(m *Member) bool {
	select {
	case <-m.wake:
		return true
	default:
		return false
	}
}

// Whatever moves out of version order (a change, a forget, an eviction),
// every member's cursor stays after the last entry at or below its mark:
// it is sent exactly the entries above it. A model check against the
// marks, over random changes, acknowledgments and leaves.
func TestEveryCursorStaysAfterTheLastEntryAtOrBelowItsMark(t *testing.T) {
	tb, c, _ := newTable(t)
	r := rand.New(rand.NewPCG(7, 37))
	ms := make([]*Member, 12)
	for i := range ms {
		ms[i] = tb.Join(fmt.Sprintf("peer-%d", i))
	}
	states := []string{"running", "completed", "failed"}
	for step := range 5000 {
		switch op := r.IntN(10); {
		case op < 5:
			commit(t, tb, FromBroker, event(t, fmt.Sprintf("j%d", r.IntN(40)), states[r.IntN(len(states))]))
		case op < 6:
			remove(t, tb, FromBroker, fmt.Sprintf("j%d", r.IntN(40)))
		case op < 9:
			m := ms[r.IntN(len(ms))]
			if taken := tb.TakeAbove(m, 1+r.IntN(5), 1<<20); len(taken.Versions) > 0 {
				tb.Ack(m, taken.Versions[len(taken.Versions)-1])
			}
		default:
			c.advance(time.Duration(r.IntN(40)) * time.Second)
			tb.Prune()
		}
		for _, m := range ms {
			checkCursor(t, tb, m, step)
		}
		checkLowMark(t, tb, step)
	}
}

// checkLowMark holds the kept low mark to a walk of the members.
func checkLowMark(t *testing.T, tb *Table, step int) {
	t.Helper()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	want := uint64(math.MaxUint64)
	for _, m := range tb.members {
		want = min(want, m.mark)
	}
	if got := tb.lowMarkLocked(); got != want {
		t.Fatalf("step %d: the low mark kept is %d, the members' lowest %d", step, got, want)
	}
}

func checkCursor(t *testing.T, tb *Table, m *Member, step int) {
	t.Helper()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var want *entry
	for e := tb.versions.head; e != nil && e.version <= m.mark; e = e.v.next {
		want = e
	}
	if got := m.cur.after(); got != want {
		t.Fatalf("step %d: %s (mark %d) has its cursor after %v, want after %v", step, m.id, m.mark, versionOf(got), versionOf(want))
	}
}

func versionOf(e *entry) any {
	if e == nil {
		return "none"
	}
	return e.version
}

// The members that left are bounded in count and in bytes, the oldest
// departure dropped first and counted: a hostUuid that changes at every
// discovery flap leaves one behind each time.
func TestTheMembersThatLeftAreBoundedInCountAndBytes(t *testing.T) {
	tb, _, _ := newTable(t, func(c *Config) { c.MaxGoneMembers, c.MaxGoneBytes = 8, 1<<20 })
	for flap := range 30 {
		tb.Leave(tb.Join(fmt.Sprintf("host-%d|node-1", flap)))
	}
	if n := tb.Sizes().Members; n != 8 {
		t.Fatalf("%d members after 30 flaps, want the bound of 8", n)
	}
	if n := tb.Stats().GoneDropped.Load(); n != 22 {
		t.Fatalf("%d members dropped at the bound, want 22", n)
	}
	if _, kept := tb.MemberMark("host-29|node-1"); !kept {
		t.Fatal("the latest departure was dropped, not the oldest")
	}

	tb, _, _ = newTable(t, func(c *Config) { c.MaxGoneMembers, c.MaxGoneBytes = 1000, 4*(goneOverhead+64) })
	for flap := range 30 {
		tb.Leave(tb.Join(fmt.Sprintf("%064d", flap)))
	}
	if n := tb.Sizes().Members; n != 4 {
		t.Fatalf("%d members of 64-byte ids after 30 flaps, want the 4 the byte bound holds", n)
	}
	if b := tb.Sizes().GoneBytes; b > 4*(goneOverhead+64) {
		t.Fatalf("the members that left take %d bytes, over their bound", b)
	}
}

// A commit costs the same with 2,001 members, 2,000 of them away and
// behind, as with 1 (go test -bench Commit -run ^$).
func BenchmarkCommitWithMembers(b *testing.B) {
	for _, away := range []int{0, 2000} {
		b.Run(fmt.Sprintf("members=%d", away+1), func(b *testing.B) {
			tb, c, _ := newTable(b, func(c *Config) { c.Journal = nil; c.MaxEndedBytes = 1 << 30 })
			for i := range away {
				tb.Join(fmt.Sprintf("away-%d", i))
			}
			// Ends past their retention that the away members still lack:
			// each reap asks for the low mark.
			for i := range 100 {
				commit(b, tb, FromBroker, event(b, fmt.Sprintf("old%d", i), "completed"))
			}
			c.advance(2 * retention)
			for i := range 100 {
				commit(b, tb, FromBroker, event(b, fmt.Sprintf("j%d", i), "running"))
			}
			m := tb.Join("near")
			evs := [...]string{"running", "completed"}
			b.ResetTimer()
			for i := range b.N {
				commit(b, tb, FromBroker, event(b, fmt.Sprintf("j%d", i%100), evs[i/100%2]))
				if taken := tb.TakeAbove(m, 8, 1<<20); len(taken.Versions) > 0 {
					tb.Ack(m, taken.Versions[len(taken.Versions)-1])
				}
			}
		})
	}
}

// A mark that moved for a member dropped before the tick is not written:
// its 'M' entry after the drop's record would bring it back at a restart.
func TestAMemberDroppedBeforeTheTickIsNotBroughtBackByItsMark(t *testing.T) {
	tb, c, j := newTable(t, func(c *Config) { c.MaxGoneMembers = 1 })
	m := tb.Join("old")
	commit(t, tb, FromBroker, event(t, "a", "completed"))
	taken := tb.TakeAbove(m, 8, 1<<20)
	tb.Leave(m)
	tb.Ack(m, taken.Versions[0]) // the sender's last answer, after the leave
	tb.Leave(tb.Join("new"))     // the bound of 1 drops old
	tb.Prune()
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	again.Restore(j.records(), time.Second)
	if _, known := again.MemberMark("old"); known {
		t.Fatal("a member dropped at the bound came back at the restart by a mark written after its drop")
	}
}

// The marks' record is described as one, and restores every mark in it.
func TestAMarksRecordIsDescribedAndRestoresEachMark(t *testing.T) {
	tb, c, j := newTable(t)
	a, b := tb.Join("a"), tb.Join("b")
	commit(t, tb, FromBroker, event(t, "x", "completed"))
	sent(t, tb, a)
	sent(t, tb, b)
	tb.Prune()
	recs := j.records()
	last := recs[len(recs)-1]
	if ri := Describe(last); ri.Kind != "marks" || ri.Refused != "" {
		t.Fatalf("the prune tick's record is described as %+v, want marks", ri)
	}
	again := New(Config{Self: self, Retention: retention, MaxLive: 1000, MaxLiveBytes: 1 << 20, MaxEndedBytes: 1 << 20, MemberClaim: time.Hour, Now: c.now})
	again.Restore(recs, time.Second)
	for _, id := range []string{"a", "b"} {
		if got, _ := again.MemberMark(id); got != tb.Version() {
			t.Fatalf("%s restored at %d, want %d", id, got, tb.Version())
		}
	}
	if _, restate := again.Restate(again.Join("a")); !restate {
		t.Fatal("a member restored from the journal is not re-asserted the table")
	}
}

// The members' lowest mark is kept without a walk of the members: with
// ends past their retention held for a member that lags, every ack asks
// for it (the reap), and with 2,048 members at as many marks each ack of
// the one lagging furthest (the worst case for a low mark found again by
// a walk once the last member at it moved on) compares O(log members)
// marks, not the members.
func TestTheLowMarkIsKeptWithoutAWalkOfTheMembers(t *testing.T) {
	tb, c, _ := newTable(t, func(c *Config) { c.MaxLive, c.MaxLiveBytes = 4096, 64<<20 })
	const n, ends = 2048, 16
	for i := range n {
		commit(t, tb, FromBroker, event(t, fmt.Sprintf("job-%d", i), "running"))
	}
	for i := range ends {
		commit(t, tb, FromBroker, event(t, fmt.Sprintf("end-%d", i), "completed"))
	}
	c.advance(2 * retention) // the ends retire; every member lacks them
	ms := make([]*Member, n)
	for i := range n {
		ms[i] = tb.Join(fmt.Sprintf("peer-%d", i))
		tb.Ack(ms[i], uint64(i+1)) // marks 1..n: one member at each, below the ends
	}
	checkLowMark(t, tb, 0)
	tb.mu.Lock()
	before := tb.low.looks
	tb.mu.Unlock()
	for i := range n / 2 {
		commit(t, tb, FromBroker, event(t, fmt.Sprintf("new-%d", i), "running")) // a new top version
		tb.Ack(ms[i], tb.Version())                                              // the lowest moves to the top
	}
	checkLowMark(t, tb, 1)
	if n := tb.Stats().Forgotten.Load(); n != 0 {
		t.Fatalf("%d ends forgotten, want none: the members below them lack them", n)
	}
	tb.mu.Lock()
	looks := tb.low.looks - before
	tb.mu.Unlock()
	perAck, bound := float64(looks)/float64(n/2), 4*math.Log2(n)
	t.Logf("%d members: %.1f marks compared an ack", n, perAck)
	if perAck > bound {
		t.Fatalf("an ack of the lowest of %d members compared %.0f marks, want at most %.0f (4 log2 members)", n, perAck, bound)
	}
}
