package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"text/tabwriter"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

// listMain is `nvpair-wlm list`: what this node's producers hold, from
// the node's read-back (GET /v1/workloads), one line per workload.
func listMain(args []string, stdout, stderr io.Writer) int {
	c := newCommand("list", "[flags]\n\nLists the workloads producers reported to this node's ingress (live, and ended within their retention).", stdout, stderr)
	requester := c.fs.String("requester", "", "list only the workloads of this requesterId")
	asJSON := c.fs.Bool("json", false, "one JSON object per line: the workload as the node holds it, and its lease deadline")
	if code, done := c.parse(args); done {
		return code
	}
	if c.fs.NArg() > 0 {
		return c.fail(fmt.Errorf("unexpected argument %q", c.fs.Arg(0)))
	}
	client, err := wlmclient.New(wlmclient.Config{Addr: *c.addr, Producer: "list", Logger: c.logger()})
	if err != nil {
		fmt.Fprintf(stderr, "nvpair-wlm list: %v\n", err)
		return 1
	}
	defer client.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws, err := client.ReadBack(ctx, *requester)
	if err != nil {
		fmt.Fprintf(stderr, "nvpair-wlm list: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, w := range ws {
			var lease any
			if !w.LeaseDeadline.IsZero() {
				lease = w.LeaseDeadline.UnixMilli()
			}
			enc.Encode(map[string]any{"workloadInfo": w.Info, "leaseDeadline": lease})
		}
		return 0
	}
	sort.SliceStable(ws, func(i, j int) bool { return int64Of(ws[i].Info["createdAt"]) < int64Of(ws[j].Info["createdAt"]) })
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tMODEL\tENGINE\tREQUESTER\tCREATED\tLEASE")
	now := time.Now()
	for _, w := range ws {
		lease := "-"
		if !w.LeaseDeadline.IsZero() {
			lease = fmt.Sprintf("%ds", int(w.LeaseDeadline.Sub(now).Round(time.Second)/time.Second))
		}
		created := "-"
		if ms := int64Of(w.Info["createdAt"]); ms > 0 {
			created = time.UnixMilli(ms).Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", w.ID(), w.State(), field(w, "model"), field(w, "engine"), field(w, "requesterId"), created, lease)
	}
	tw.Flush()
	return 0
}

// field is a workload's string field, "-" when it has none.
func field(w wlmclient.Workload, name string) string {
	if s, ok := w.Info[name].(string); ok && s != "" {
		return s
	}
	return "-"
}

// int64Of reads a JSON number the read-back kept as json.Number.
func int64Of(v any) int64 {
	n, ok := v.(json.Number)
	if !ok {
		return 0
	}
	i, _ := n.Int64()
	return i
}

// flushMain is `nvpair-wlm flush`: it sends the ends earlier runs kept in
// their outboxes because the ingress did not take them in time.
func flushMain(args []string, stdout, stderr io.Writer) int {
	c := newCommand("flush", "[flags]\n\nSends the ends of earlier `nvpair-wlm run`s that the ingress had not taken when they exited.", stdout, stderr)
	wait := c.fs.Duration("wait", 30*time.Second, "how long to try")
	outboxDir := c.fs.String("outbox-dir", filepath.Join(stateDir(), "run-outbox"), "the outbox directory of nvpair-wlm run")
	if code, done := c.parse(args); done {
		return code
	}
	if c.fs.NArg() > 0 {
		return c.fail(fmt.Errorf("unexpected argument %q", c.fs.Arg(0)))
	}
	set := claimOrphans(*outboxDir, wlmclient.Config{Addr: *c.addr, Producer: "run", Logger: c.logger()}, c.logger())
	n := len(set.clients)
	ctx, cancel := context.WithTimeout(context.Background(), *wait)
	defer cancel()
	if err := set.close(ctx); err != nil {
		fmt.Fprintf(stderr, "nvpair-wlm flush: %v; what is left stays in %s\n", err, *outboxDir)
		return 1
	}
	fmt.Fprintf(stdout, "nvpair-wlm flush: %d outbox(es) sent\n", n)
	return 0
}
