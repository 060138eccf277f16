package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/pairbroker"
)

// judgedPaperCluster is paperCluster without its judgement at the end: for
// the tests that make the brokers disagree with PAIR's store on purpose.
func judgedPaperCluster(t *testing.T, n int) *cluster {
	t.Helper()
	needsDaemons(t) // PAIR's store is a program TestMain builds
	if shadowBin == "" {
		t.Skip("no shadow of PAIR's store (no ../shared/upstream beside this repository)")
	}
	members := make([]devpki.Node, n)
	for i := range members {
		members[i] = devpki.Node{ID: devpki.NewUUID(), AppDir: t.TempDir()}
	}
	c := newCluster(clusterConfig{resyncInterval: time.Second, logf: func(string, ...any) {}, shadowBin: shadowBin}, members, t.TempDir())
	t.Cleanup(c.closeShadows)
	return c
}

// A broker whose Jobs list is not PAIR's store's fails the run, with a line
// naming the node and the job; frames both got alike do not.
func TestADisagreementWithPAIRsStoreFailsTheRunNamingTheNodeAndTheJob(t *testing.T) {
	c := judgedPaperCluster(t, 2)
	n1, n2 := c.nodes[0], c.nodes[1]
	for _, n := range c.nodes {
		n.broker.handle(upsertLine(info(n1.id, "agreed", "running", 1)), nil, nil)
	}
	c.judge()
	var out bytes.Buffer
	if !brokerVerdict(&out, c) || !strings.HasPrefix(out.String(), "as PAIR's broker: yes") {
		t.Fatalf("frames both stores got alike: verdict %q", out.String())
	}
	// A change that reaches the model alone, as a model that merged
	// otherwise than PAIR's store would make one.
	in, err := pairbroker.Parse(info(n1.id, "only-in-the-model", "queued", 1))
	if err != nil {
		t.Fatal(err)
	}
	n2.broker.store.Apply(in)
	c.judge()
	out.Reset()
	if brokerVerdict(&out, c) {
		t.Fatalf("a Jobs list PAIR's store does not hold passed: %q", out.String())
	}
	want := "node2: Jobs list: job " + n1.id + "/only-in-the-model"
	if !strings.HasPrefix(out.String(), "as PAIR's broker: no (1 problems)") || !strings.Contains(out.String(), want) {
		t.Fatalf("verdict %q, want it to name %q", out.String(), want)
	}
}

// PAIR's broker stops reading its workload manager for good at a line over
// 256 KiB: the dev cluster's broker does too, reads nothing after it, and
// the run fails saying so.
func TestABrokerStopsReadingForGoodAtALineOverPAIRsLimit(t *testing.T) {
	c := paperCluster(t, 1)
	b := c.nodes[0].broker
	long := upsertLine(info(other, "long", "running", 1))
	long = append(long[:len(long)-2:len(long)-2], []byte(`,"pad":"`+strings.Repeat("p", pairbroker.LineMax)+`"}}`)...)
	lines := [][]byte{upsertLine(info(other, "before", "running", 1)), long, upsertLine(info(other, "after", "running", 1))}
	err := b.serve(bytes.NewReader(append(bytes.Join(lines, []byte("\n")), '\n')), nil, nil)
	if !errors.Is(err, pairbroker.ErrLineTooLong) {
		t.Fatalf("serve returned %v, want ErrLineTooLong", err)
	}
	if _, ok := b.get(other, "before"); !ok {
		t.Error("the line before the long one was not read")
	}
	if _, ok := b.get(other, "after"); ok {
		t.Error("a line after the long one was read: PAIR's reader has stopped by then")
	}
	problems := c.brokerProblems()
	if len(problems) != 1 || !strings.Contains(problems[0], "node1's daemon wrote a line over 262144 bytes") {
		t.Fatalf("problems %q, want the stopped reader", problems)
	}
	b.dmu.Lock()
	b.stopped = "" // paperCluster's judgement at the end is on the Jobs lists
	b.dmu.Unlock()
}
