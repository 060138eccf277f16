package peersend

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"testing"
	"time"

	"nvpair-workload-manager/internal/clustertrust"
	"nvpair-workload-manager/internal/statetable"
)

// A node whose hostUuid changes at every discovery flap, under one
// principal, leaves no member behind per flap: the member of its old id is
// forgotten when the new one joins (spec 5.2).
func TestAFlappingHostUUIDLeavesNoMemberBehindPerFlap(t *testing.T) {
	table := statetable.New(statetable.Config{Self: "self", Retention: time.Minute, MaxLive: 100, MaxLiveBytes: 1 << 20,
		MaxEndedBytes: 1 << 20, MemberClaim: time.Hour})
	b := New(slog.New(slog.NewTextHandler(io.Discard, nil)), &clustertrust.ClusterTrust{}, table, time.Hour)
	defer b.Close(0)
	other := Target{HostUUID: "other", Principal: "cluster-2", Addrs: []string{"127.0.0.1:1"}}
	b.SetTargets([]Target{other})
	b.SetTargets(nil) // the other node left: it keeps its claim
	for flap := range 30 {
		b.SetTargets([]Target{{HostUUID: fmt.Sprintf("host-%d", flap), Principal: "cluster-1", Addrs: []string{"127.0.0.1:1"}}})
	}
	if n := table.Sizes().Members; n != 2 {
		t.Fatalf("%d members after 30 flaps of one node's hostUuid, want 2: the node's latest id and the other node that left", n)
	}
	if n := table.Stats().GoneReplaced.Load(); n != 29 {
		t.Fatalf("%d members forgotten as replaced, want 29", n)
	}
}

// The members behind an address are counted as a connection from it names
// its source: one per target and address, a name not at all.
func TestSourceMembersCountsTargetsByTheAddressTheyConnectFrom(t *testing.T) {
	got := SourceMembers([]Target{
		{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}, // one target, twice one address
		{Addrs: []string{"127.0.0.1:3", "[::ffff:10.0.0.1]:4"}},
		{Addrs: []string{"[fe80::1%eth0]:5"}},
		{Addrs: []string{"node-4.example:6", "bad"}},
	})
	want := map[string]int{"127.0.0.1": 2, "10.0.0.1": 1, "fe80::1": 1}
	if !maps.Equal(got, want) {
		t.Fatalf("members by source %v, want %v", got, want)
	}
}
