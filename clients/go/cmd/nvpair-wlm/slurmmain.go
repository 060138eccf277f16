package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

// Defaults of the bridge's bounds.
const (
	// defaultBridgeLease is the lease on each job: a bridge dead this long
	// leaves its jobs failed on every member. Each live job's lease is
	// renewed at a third of it, one request each: at 1,000 jobs, 25
	// requests a second, where 30 s (the client's default) would be 100
	// and twice the bridge's CPU (measured: 0.9 % of a core against 2 %).
	defaultBridgeLease = 2 * time.Minute
	// defaultMaxJobs bounds the jobs the bridge tracks at once: far above
	// one node's live and recently ended jobs (Slurm's own MaxJobCount is
	// 10,000 by default, for the whole cluster).
	defaultMaxJobs = 10_000
	// defaultSqueueMaxBytes bounds the squeue output read in one poll: a
	// job's record is some 3.5 KiB in 22.05 and 9 KiB in 23.11, so 10,000
	// jobs fit with room.
	defaultSqueueMaxBytes = 256 << 20
)

// slurmMain is `nvpair-wlm slurm`.
func slurmMain(args []string, stdout, stderr io.Writer) int {
	c := newCommand("slurm", "[flags]\n\nReports this node's Slurm jobs (squeue --json) as workloads until it is stopped.", stdout, stderr)
	host, _ := os.Hostname()
	host, _, _ = strings.Cut(host, ".")
	var cfg bridgeConfig
	c.fs.DurationVar(&cfg.interval, "interval", 5*time.Second, "how often Slurm's view is read")
	lease := c.fs.Duration("lease", defaultBridgeLease, "the lease on each live job, renewed at a third of it while the bridge runs: a bridge dead this long leaves its jobs failed; whole seconds from 5s to 24h, at least twice --interval")
	c.fs.StringVar(&cfg.node, "node", host, "this node's Slurm node name: the jobs whose batch host it is are reported from here")
	c.fs.BoolVar(&cfg.pending, "pending", false, "also report the jobs no node runs yet (pending, and cancelled while pending); give it to one node of the cluster")
	c.fs.StringVar(&cfg.squeue, "squeue", "squeue", "the squeue command (Slurm 22.05 or later)")
	c.fs.StringVar(&cfg.cluster, "cluster", "", "the cluster's name in workload ids (default: Slurm's, from each job)")
	c.fs.StringVar(&cfg.statePath, "state", stateDir()+string(os.PathSeparator)+"slurm-state.json", "the bridge's state file (its outbox is beside it, .outbox)")
	c.fs.IntVar(&cfg.maxJobs, "max-jobs", defaultMaxJobs, "the most jobs tracked at once; more are not reported, and logged")
	c.fs.Int64Var(&cfg.maxBytes, "squeue-max-bytes", defaultSqueueMaxBytes, "the most squeue output read in one poll; a poll over it is skipped, and logged")
	if code, done := c.parse(args); done {
		return code
	}
	l, err := leaseFlag(*lease)
	switch {
	case err != nil:
		return c.fail(err)
	case c.fs.NArg() > 0:
		return c.fail(fmt.Errorf("unexpected argument %q", c.fs.Arg(0)))
	case cfg.interval < 100*time.Millisecond:
		return c.fail(fmt.Errorf("--interval %s: at least 100ms", cfg.interval))
	case l > 0 && l < 2*cfg.interval:
		return c.fail(fmt.Errorf("--lease %s: at least twice --interval (%s), or a poll that is late expires the jobs", l, cfg.interval))
	case cfg.node == "":
		return c.fail(fmt.Errorf("--node: this node's Slurm node name is needed"))
	case cfg.maxJobs < 1 || cfg.maxBytes < 1<<10:
		return c.fail(fmt.Errorf("--max-jobs and --squeue-max-bytes must be at least 1 and 1024"))
	}
	log := c.logger()
	client, err := wlmclient.New(wlmclient.Config{
		Addr: *c.addr, Producer: "slurm", Lease: l, Logger: log,
		OutboxPath: cfg.statePath + ".outbox",
		// Each job may ask for a few frames in one poll (queued, running
		// and its end, or a rerun's removal too).
		QueueSize:  max(wlmclient.DefaultQueueSize, 4*cfg.maxJobs),
		BackoffMax: max(cfg.interval, time.Second),
	})
	if err != nil {
		fmt.Fprintf(stderr, "nvpair-wlm slurm: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b := newBridge(cfg, client, log)
	b.recover(ctx)
	log.Info("slurm bridge: polling", "interval", cfg.interval, "node", cfg.node, "pending", cfg.pending, "addr", *c.addr)
	tick := time.NewTicker(cfg.interval)
	defer tick.Stop()
	for {
		b.poll(ctx)
		select {
		case <-tick.C:
			continue
		case <-ctx.Done():
		}
		break
	}
	b.flush()
	// The jobs keep their leases: a bridge that is not started again
	// leaves them to expire as failed, on every member.
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.Close(cctx); err != nil {
		log.Warn("slurm bridge: frames not sent at the stop; the ends among them are sent by the next start", "err", err)
	}
	log.Info("slurm bridge: stopped")
	return 0
}
