package wireframe

import (
	"errors"
	"strings"
	"testing"
)

func TestParseIngressAsTakesTheNodesAliasAndRelaysItUnderTheNodesID(t *testing.T) {
	const node, alias, other = "11111111-2222-4333-8444-555555555555", "66666666-7777-4888-9999-aaaaaaaaaaaa", "00000000-0000-4000-8000-000000000000"
	life := func(origin, scheduled string) []byte {
		return []byte(`{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","runId":"j","model":"m","engine":"e","state":"running","seq":1,` +
			`"createdAt":1767225600000,"startedAt":1767225600000,"completedAt":null,"error":null,"originatedFrom":"` + origin + `","scheduledOn":"` + scheduled + `"}}}`)
	}
	f, err := ParseIngressAs(life(alias, alias), node, []string{alias}, DefaultWorkloadMaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	if f.Life.Info.OriginatedFrom != node || f.Life.Info.ScheduledOn != node || strings.Contains(string(f.Params), alias) {
		t.Errorf("relayed %s (origin %q, scheduledOn %q); want the alias replaced by the node's id", f.Params, f.Life.Info.OriginatedFrom, f.Life.Info.ScheduledOn)
	}
	f, err = ParseIngressAs(life(node, alias), node, []string{alias}, DefaultWorkloadMaxBytes)
	if err != nil || f.Life.Info.ScheduledOn != node {
		t.Errorf("scheduledOn naming the alias: %+v, %v", f.Life.Info, err)
	}
	f, err = ParseIngressAs(life(node, other), node, []string{alias}, DefaultWorkloadMaxBytes)
	if err != nil || f.Life.Info.ScheduledOn != other {
		t.Errorf("scheduledOn naming another node is relayed as it is: %+v, %v", f.Life.Info, err)
	}
	var foreign *ForeignOriginError
	if _, err = ParseIngressAs(life(other, other), node, []string{alias}, DefaultWorkloadMaxBytes); !errors.As(err, &foreign) || foreign.Origin != other {
		t.Errorf("another node's origin: %v, want it refused", err)
	}
	if _, err = ParseIngressAs(life(alias, alias), node, nil, DefaultWorkloadMaxBytes); !errors.As(err, &foreign) {
		t.Errorf("the alias of a node that has none: %v, want it refused", err)
	}
	removal := []byte(`{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"j","originatedFrom":"` + alias + `"}}`)
	f, err = ParseIngressAs(removal, node, []string{alias}, DefaultWorkloadMaxBytes)
	if err != nil || strings.Contains(string(f.Params), alias) || !strings.Contains(string(f.Params), node) {
		t.Errorf("a removal naming the alias: %s, %v", f.Params, err)
	}
}
