// Command nvpair-workload-manager is the per-node daemon that keeps every
// member of a GPU cluster in agreement about which inference workloads are
// queued, running or finished, and where.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"nvpair-workload-manager/internal/brokerio"
	"nvpair-workload-manager/internal/cliflags"
	"nvpair-workload-manager/internal/gcpace"
	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/pairinstall"
	"nvpair-workload-manager/internal/wireframe"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// options are the parsed command-line flags.
type options struct {
	port           int
	ipc            string
	clusterDir     string
	appDir         string
	localIngress   string
	metrics        string
	resyncInterval time.Duration
	drainTimeout   time.Duration
	brokerLineMax  int
	maxLive        int
	maxLiveBytes   int64
	maxEndedBytes  int64
	journalFsync   time.Duration // 0: before each answer (--journal-fsync always)
	workloadMax    int
	conns          httpguard.ConnLimits
	logLevel       string // the --log-level value, when given
	logLevelGiven  bool
	showVersion    bool
	usage          func(io.Writer) // writes --help
}

// parseFlags parses args and fills in the derived defaults. Its errors are
// one line, fit to print as they are.
func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("nvpair-workload-manager", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&o.port, "port", 14320, "inter-node HTTPS port (mutual TLS, every interface); 0 picks a free one")
	fs.StringVar(&o.ipc, "ipc", "", "talk to the broker on this Unix socket (Windows: named pipe) instead of stdin and stdout")
	fs.StringVar(&o.clusterDir, "cluster-dir", "", "the cluster directory the cluster manager writes (default <app-dir>/cluster)")
	fs.StringVar(&o.appDir, "app-dir", "", "PAIR's app data directory, with node-id.json and workload-ingress.json (default: the parent of --cluster-dir, else the platform's PAIR data dir)")
	fs.StringVar(&o.localIngress, "local-ingress", "", "serve producers on this loopback address (default: the listen address in <app-dir>/workload-ingress.json, else off)")
	fs.StringVar(&o.metrics, "metrics", "", "serve GET /metrics (Prometheus) on this loopback address (default off)")
	fs.DurationVar(&o.resyncInterval, "resync-interval", defaultResyncInterval, "how often each peer is sent a pass over this node's live workloads (the heartbeat)")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", defaultDrainTimeout, "how long the peers may catch up at shutdown, after the listeners' 0.5 s grace")
	lineMax := fs.String("broker-line-max", strconv.Itoa(wireframe.DefaultBrokerLineMax), "longest line written to the broker, newline included, in bytes")
	fs.IntVar(&o.maxLive, "max-live-workloads", defaultMaxLiveWorkloads, "most workloads the re-sync set holds (live, and terminal within their retention)")
	fs.Int64Var(&o.maxLiveBytes, "max-live-workload-bytes", defaultMaxLiveWorkloadBytes, "most bytes of workload frames the re-sync set holds")
	fs.Int64Var(&o.maxEndedBytes, "max-ended-bytes", defaultMaxEndedBytes, "most bytes of ends (finished and removed workloads) kept until every member has them; past it the oldest goes first")
	fsync := fs.String("journal-fsync", "always", "when the journal is fsynced: always (before each 200: an answer survives a power loss) or a duration D from 10ms to 10s (answer once written, fsync within D: an answer survives kill -9, a power loss may take the last D of them)")
	fs.IntVar(&o.workloadMax, "workload-max-bytes", wireframe.DefaultWorkloadMaxBytes, "most bytes of one frame's params (the workload and the members beside it), on every path")
	fs.IntVar(&o.conns.Peer, "peer-max-conns", httpguard.DefaultPeerMaxConns, "most connections the peer port holds")
	fs.IntVar(&o.conns.PeerPerSource, "peer-max-conns-per-source", httpguard.DefaultPeerMaxConnsPerSource, "most connections the peer port holds from one address, per member discovered at it")
	fs.IntVar(&o.conns.Ingress, "ingress-max-conns", httpguard.DefaultIngressMaxConns, "most connections the local ingress holds")
	fs.IntVar(&o.conns.Metrics, "metrics-max-conns", httpguard.DefaultMetricsMaxConns, "most connections the metrics endpoint holds")
	fs.StringVar(&o.logLevel, "log-level", "", "error, warn, info or debug (default: $NVPAIR_LOG_LEVEL, else info)")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	o.usage = func(w io.Writer) { writeUsage(w, fs) }
	explain := cliflags.Explain(fs, flagArgs)
	if err := fs.Parse(args); err != nil {
		return o, explain(err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.port < 0 || o.port > 65535 {
		return o, fmt.Errorf("--port %d: must be between 0 and 65535", o.port)
	}
	if o.resyncInterval < 100*time.Millisecond {
		return o, fmt.Errorf("--resync-interval %s: must be at least 100ms", o.resyncInterval)
	}
	if o.drainTimeout <= 0 {
		return o, fmt.Errorf("--drain-timeout %s: must be positive", o.drainTimeout)
	}
	var err error
	if o.brokerLineMax, err = strconv.Atoi(*lineMax); err != nil {
		return o, fmt.Errorf("--broker-line-max %q: must be a number of bytes between %d and %d", *lineMax, wireframe.MinBrokerLineMax, wireframe.MaxBrokerLineMax)
	}
	if err := wireframe.CheckBrokerLineMax(o.brokerLineMax); err != nil {
		return o, fmt.Errorf("--broker-line-max %d: %w", o.brokerLineMax, err)
	}
	if err := checkMaxLiveWorkloads(o.maxLive); err != nil {
		return o, fmt.Errorf("--max-live-workloads %d: %w", o.maxLive, err)
	}
	if err := checkMaxLiveWorkloadBytes(o.maxLiveBytes); err != nil {
		return o, fmt.Errorf("--max-live-workload-bytes %d: %w", o.maxLiveBytes, err)
	}
	if err := checkMaxEndedBytes(o.maxEndedBytes); err != nil {
		return o, fmt.Errorf("--max-ended-bytes %d: %w", o.maxEndedBytes, err)
	}
	if o.journalFsync, err = parseJournalFsync(*fsync); err != nil {
		return o, fmt.Errorf("--journal-fsync %q: %w", *fsync, err)
	}
	if err := wireframe.CheckWorkloadMaxBytes(o.workloadMax); err != nil {
		return o, fmt.Errorf("--workload-max-bytes %d: %w", o.workloadMax, err)
	}
	if err := httpguard.CheckConnLimits(o.conns); err != nil {
		return o, err
	}
	fs.Visit(func(f *flag.Flag) { o.logLevelGiven = o.logLevelGiven || f.Name == "log-level" })
	if o.logLevelGiven {
		if _, err := parseLogLevel(o.logLevel); err != nil {
			return o, fmt.Errorf("--log-level: %w", err)
		}
	}
	// An address of the wrong form is a usage error like any other bad
	// value (exit 2); one that is right but cannot be bound (a port taken)
	// is found when it is bound, and is a failed start (exit 1).
	for _, a := range []struct{ flag, addr string }{{"--local-ingress", o.localIngress}, {"--metrics", o.metrics}} {
		if a.addr == "" {
			continue
		}
		if err := httpguard.CheckLoopbackBind(a.addr); err != nil {
			return o, fmt.Errorf("%s %s: %w", a.flag, httpguard.ClipReason(a.addr), err)
		}
	}
	for _, d := range []struct{ flag, dir string }{{"--app-dir", o.appDir}, {"--cluster-dir", o.clusterDir}} {
		if fi, err := os.Stat(d.dir); d.dir != "" && err == nil && !fi.IsDir() {
			return o, fmt.Errorf("%s %s: not a directory", d.flag, httpguard.ClipReason(d.dir))
		}
	}
	appDirFromCluster := o.appDir == "" && o.clusterDir != ""
	if o.appDir, err = pairinstall.ResolveAppDir(o.appDir, o.clusterDir); err != nil {
		return o, fmt.Errorf("no --app-dir or --cluster-dir, and no PAIR data directory: %w", err)
	}
	if appDirFromCluster {
		if err := requireAppDir(o.appDir); err != nil {
			return o, fmt.Errorf("--cluster-dir %s: %w", httpguard.ClipReason(o.clusterDir), err)
		}
	}
	if o.clusterDir == "" {
		o.clusterDir = filepath.Join(o.appDir, "cluster")
	}
	return o, nil
}

// run is the whole program; it returns the exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "nvpair-workload-manager: %v\n", err)
		return 1
	}
	o, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		o.usage(stdout) // asked for, like --version: on stdout, so it pages
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "nvpair-workload-manager: %v\n", err)
		return 2
	}
	version := buildVersion()
	if o.showVersion {
		fmt.Fprintln(stdout, versionLine(version))
		return 0
	}
	level, levelWarning, err := resolveLogLevel(o.logLevel, o.logLevelGiven, os.Getenv(logLevelEnv))
	if err != nil {
		return fail(err) // unreachable: parseFlags checked the flag
	}
	levelVar := new(slog.LevelVar)
	levelVar.Set(level)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: levelVar}))
	if levelWarning != "" {
		log.Warn("log level from the environment ignored", "reason", httpguard.ClipReason(levelWarning))
	}

	memLimit := applyMemoryLimit(o.maxLive)
	log.Debug("memory limit", "bytes", memLimit)
	// One daemon per app dir: a second one would relay the same node id
	// beside the first, so every frame twice and two heartbeats. The lock
	// is taken before the node id is resolved, so two starts on a fresh
	// app dir never mint two ids (spec 3.4.1).
	lock, err := pairinstall.LockAppDir(o.appDir, appDirLockWait)
	if held := (*pairinstall.HeldError)(nil); errors.As(err, &held) {
		fmt.Fprintf(stderr, "nvpair-workload-manager: %v\n", err)
		return exitAnotherInstance
	}
	if err != nil {
		return fail(err)
	}
	defer lock.Release()
	node, err := pairinstall.ResolveNodeID(o.appDir, o.clusterDir)
	if err != nil {
		return fail(err)
	}
	if node.Notice != "" {
		log.Warn("node id", "file", node.Source, "reason", node.Notice)
	}
	aliases := nodeAliases(node, log)
	markKey := ingressMarkKey(o.appDir, log)
	// From here a start that fails (a port taken, an unusable listener)
	// forgets the id it minted, so it leaves no identity of a node that
	// never ran (spec 3.4.1). Run fails only before the node announces
	// itself; an id that was read is never touched.
	failBeforeMint := fail
	fail = func(err error) int {
		_ = node.ForgetMinted() // one that cannot be removed is read by the next start, as before
		return failBeforeMint(err)
	}
	// A write to a closed stdout pipe must fail with EPIPE, which the
	// manager treats as the broker going away, instead of killing the
	// process with SIGPIPE.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	in, out := stdin, stdout
	if o.ipc != "" {
		conn, err := brokerio.Open(o.ipc)
		if err != nil {
			// Nothing listens at the path the flag names: a bad value,
			// exit 2 like the others, naming the flag.
			_ = node.ForgetMinted()
			fmt.Fprintf(stderr, "nvpair-workload-manager: --ipc %s: %v\n", httpguard.ClipReason(o.ipc), err)
			return 2
		}
		defer conn.Close()
		in, out = conn, conn
	}
	ingressAddr, err := resolveIngressAddr(o.localIngress, o.appDir, log)
	if err != nil {
		return fail(err)
	}
	m, err := NewManager(Config{
		NodeID:           node.ID,
		NodeIDFile:       node.Source,
		NodeIDAliases:    aliases,
		Version:          version,
		PeerAddr:         ":" + strconv.Itoa(o.port),
		ClusterDir:       o.clusterDir,
		ResyncInterval:   o.resyncInterval,
		DrainTimeout:     o.drainTimeout,
		BrokerLineMax:    o.brokerLineMax,
		MaxLiveWorkloads: o.maxLive,
		Conns:            o.conns,
		In:               in,
		Out:              out,
		Logger:           log,
		LogLevel:         levelVar,

		MaxLiveWorkloadBytes: o.maxLiveBytes,
		WorkloadMaxBytes:     o.workloadMax,
		MaxEndedBytes:        o.maxEndedBytes,
		JournalPath:          filepath.Join(o.appDir, journalFileName),
		JournalFsync:         o.journalFsync,
		Pacer:                gcpace.New(),
		IngressMarkKey:       markKey,
	})
	if err != nil {
		return fail(err)
	}
	if ingressAddr != "" {
		if err := m.EnableLocalIngress(ingressAddr); err != nil {
			return fail(explainAddrError(err, o))
		}
	}
	if o.metrics != "" {
		if err := m.EnableMetrics(o.metrics); err != nil {
			return fail(explainAddrError(err, o))
		}
	}
	if err := m.Run(ctx); err != nil {
		return fail(explainAddrError(err, o)) // a listener could not bind
	}
	return 0
}

// nodeAliases returns the node's other ids, logging each with the file it
// came from: an operator who sees producers stamp node-id.json's id reads
// here that the ingress takes it as this node's (spec 3.4.1).
func nodeAliases(node pairinstall.ResolvedNodeID, log *slog.Logger) []string {
	var ids []string
	for _, a := range node.Aliases {
		log.Info("node id alias: frames naming it are this node's, relayed under the node id", "alias", a.ID, "aliasFile", a.Source, "nodeId", node.ID, "nodeIdFile", node.Source)
		ids = append(ids, a.ID)
	}
	return ids
}

// ingressMarkKey returns the app dir's ingress mark key, made at the
// first start, or nil with one warning when none can be read or made: the
// node then writes its ingress frames to the broker unmarked, and a crash
// between one's broker write and its journal record leaves its job to the
// broker's replay as the broker's (spec 3.5.3).
func ingressMarkKey(appDir string, log *slog.Logger) []byte {
	k, err := pairinstall.LoadIngressKey(appDir)
	if err != nil {
		log.Warn("ingress mark key unusable: ingress frames are written to the broker unmarked", "reason", httpguard.ClipReason(err.Error()))
		return nil
	}
	if k.Notice != "" {
		log.Warn("ingress mark key set aside", "file", k.Path, "reason", httpguard.ClipReason(k.Notice))
	} else if k.Created {
		log.Debug("ingress mark key made", "file", k.Path)
	}
	return k.Key
}

// appDirLockWait is how long a start waits for the app dir's lock before
// it gives up: a supervisor that restarts the worker while the old one
// still shuts down (within the drain timeout and the servers' grace) gets
// its new worker started, not refused, and a supervisor restarting a
// refused worker does so at most once per wait rather than in a hot loop.
const appDirLockWait = 5 * time.Second

// exitAnotherInstance is the exit status of a start refused because
// another daemon holds the app dir (spec 3.4.1): not 1 (a failed start)
// nor 2 (a usage error), so a supervisor or an operator's script can tell
// "already running" apart.
const exitAnotherInstance = 3

// memoryBudget is the memory the daemon aims to stay within for a re-sync
// set of maxLive workloads: 64 MiB for the runtime, the connections and the
// queues, and 1 KiB per workload (an entry holds its re-assertion line,
// typically under 500 bytes, and under 400 bytes of keys and indexes).
func memoryBudget(maxLive int) int64 { return 64<<20 + 1024*int64(maxLive) }

// applyMemoryLimit sets the Go runtime's soft memory limit to the budget,
// unless the operator set GOMEMLIMIT. Without it the collector lets the heap
// grow to twice the live data before it runs, so a node holding a large set
// would use twice the memory it needs; with it, the collector runs as often
// as it takes to stay under the budget while the live data fits, and never
// refuses an allocation (the limit is soft). It returns the limit in force.
func applyMemoryLimit(maxLive int) int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1) // -1 reads the limit without changing it
	}
	limit := memoryBudget(maxLive)
	debug.SetMemoryLimit(limit)
	return limit
}

// versionLine is what --version prints: the program's name, its version,
// the Go release it was built with and the platform it was built for, as
// in "nvpair-workload-manager 1.0.0 go1.26.0 linux/amd64". Fields are
// separated by single spaces and the version is the second, so a script
// reads it with awk '{print $2}'; ready.version carries the version alone.
func versionLine(version string) string {
	return fmt.Sprintf("nvpair-workload-manager %s %s %s/%s", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Version is the build version. PAIR stamps it at build time with
// -ldflags "-X main.Version=..."; when it is not stamped, buildVersion falls
// back on what the Go toolchain recorded.
var Version string

// buildVersion is the version --version prints and ready announces: the
// stamped Version, else the module version the toolchain recorded (a tag,
// or a pseudo-version derived from the VCS revision), else the VCS revision
// itself, else "dev".
func buildVersion() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		rev += "-dirty"
	}
	return "dev-" + rev
}

// requireAppDir refuses an app dir, derived from --cluster-dir, that is not
// an existing directory. PAIR passes <app-dir>/cluster for a dir it made,
// so a missing parent is a typo or a node that is not installed: were it
// created, the daemon would mint a new node id there and join the cluster
// as a node nobody knows (or write node-id.json at the filesystem's root
// for /nonexistent/app/cluster). Nothing is created before this check.
func requireAppDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("its app dir %s does not exist (PAIR passes <app-dir>/cluster; is the path right?); nothing was created", httpguard.ClipReason(dir))
	case err != nil:
		return fmt.Errorf("its app dir: %w", err)
	case !fi.IsDir():
		return fmt.Errorf("its app dir %s is not a directory", httpguard.ClipReason(dir))
	}
	return nil
}
