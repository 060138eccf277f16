package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// The durable ceiling (issue 39). Since every ingress 200 waits for its
// frame's journal record to be fsynced (spec 5.3), a bare net/http server
// is not the ingress's fair ceiling: the best this machine does for the
// same promise is a bare server that makes each frame durable before its
// 200, with group commit (every frame that arrived during the last fsync
// rides the next one). Its own process, like the bare ceiling and the
// daemon; its file is on the disk that holds the daemons' app dirs.

// fsyncAlways is the fsync mode that answers after the fsync: the daemon's
// --journal-fsync default, and the durable ceiling's.
const fsyncAlways = "always"

// durableSpec is what the durable ceiling's process is given, as the first
// line of its stdin: the directory its log goes in and its fsync mode.
type durableSpec struct {
	Dir string
	// SyncEvery is 0 to fsync each group before its waiters are answered,
	// else how long after the first group written since the last fsync
	// the next one runs, the waiters answered once their group is written
	// (the daemon's --journal-fsync D).
	SyncEvery time.Duration
}

// groupLog is the durable ceiling's log: checksummed records (a 4-byte
// length, a CRC32-C of the length and the payload, the payload, as the
// daemon's journal frames them), appended under a short lock by each
// request and written by one goroutine, every pending group in one write
// followed by one fsync. Nothing else: no compaction, no read path, no
// recovery, which is what makes it the ceiling.
type groupLog struct {
	f     *os.File
	every time.Duration

	mu      sync.Mutex
	cur     *logGroup // the group collecting records; nil if none
	pending []byte    // its framed records
	spare   []byte    // the last written group's buffer, for reuse

	kick chan struct{} // wakes the writer; capacity 1
}

// logGroup is one write and one fsync's worth of records; done is closed
// once err is final.
type logGroup struct {
	done chan struct{}
	err  error
}

var durableCRC = crc32.MakeTable(crc32.Castagnoli)

// openGroupLog creates the log file in dir and starts its writer.
func openGroupLog(dir string, every time.Duration) (*groupLog, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(dir, "durable-*.log")
	if err != nil {
		return nil, err
	}
	l := &groupLog{f: f, every: every, kick: make(chan struct{}, 1)}
	go l.writer()
	return l, nil
}

// commit appends payload as a record and returns once its group is
// written and, unless the log fsyncs behind, fsynced.
func (l *groupLog) commit(payload []byte) error {
	var h [8]byte
	binary.LittleEndian.PutUint32(h[:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[4:], crc32.Update(crc32.Checksum(h[:4], durableCRC), durableCRC, payload))
	l.mu.Lock()
	if l.cur == nil {
		l.cur = &logGroup{done: make(chan struct{})}
	}
	g := l.cur
	l.pending = append(append(l.pending, h[:]...), payload...)
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
	<-g.done
	return g.err
}

// writer writes each pending group with one write and one fsync (or, when
// the log fsyncs behind, one write, and an fsync at most every after the
// first group written since the last one).
func (l *groupLog) writer() {
	var due <-chan time.Time // the behind fsync's timer; nil when nothing is behind
	for {
		select {
		case <-l.kick:
		case <-due:
			due = nil
			_ = l.f.Sync()
			continue
		}
		for {
			l.mu.Lock()
			g, buf := l.cur, l.pending
			l.cur, l.pending, l.spare = nil, l.spare[:0], nil
			l.mu.Unlock()
			if g == nil {
				break
			}
			_, err := l.f.Write(buf)
			switch {
			case err != nil:
			case l.every == 0:
				err = l.f.Sync()
			case due == nil:
				due = time.After(l.every)
			}
			g.err = err
			close(g.done)
			l.mu.Lock()
			l.spare = buf
			l.mu.Unlock()
		}
	}
}

// durableHandler is the bare ceiling's handler (read the body, decode it
// into a map) with the frame made durable before its 200.
func durableHandler(l *groupLog) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, ok := ceilingRead(w, r)
		if !ok {
			return
		}
		if err := l.commit(b); err != nil {
			http.Error(w, "not durable: "+err.Error(), http.StatusInternalServerError)
			return
		}
		ceilingOK(w)
	}
}

// serveDurableMain is the durable ceiling's process (wlmbench
// ceiling-durable): its spec line, then as serveCeilingMain.
func serveDurableMain() error {
	in := bufio.NewReader(os.Stdin)
	var spec durableSpec
	if err := readSpecLine(in, &spec); err != nil {
		return err
	}
	l, err := openGroupLog(spec.Dir, spec.SyncEvery)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: durableHandler(l)}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println(ln.Addr().String())
	return shutdownAtEOF(in, srv)
}

// startDurableCeiling starts a durable ceiling whose log goes under root
// (beside the daemons' app dirs, so on the same disk) in fsync mode mode:
// fsyncAlways or a duration.
func startDurableCeiling(root, mode string) (*ceilingServer, error) {
	every, err := parseFsyncMode(mode)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, "ceiling-durable-"+mode)
	p, err := startSelfWithSpec("ceiling-durable", durableSpec{Dir: dir, SyncEvery: every})
	if err != nil {
		return nil, err
	}
	line, err := p.out.ReadString('\n')
	if err != nil {
		p.close()
		return nil, fmt.Errorf("durable ceiling (%s): %w", mode, err)
	}
	return &ceilingServer{childProc: p, addr: strings.TrimSpace(line)}, nil
}

// parseFsyncMode reads a --journal-fsync value as the durable ceiling
// takes it: fsyncAlways is 0; a duration is the most time between an
// answer and its fsync, within the daemon's bounds.
func parseFsyncMode(mode string) (time.Duration, error) {
	if mode == fsyncAlways {
		return 0, nil
	}
	d, err := time.ParseDuration(mode)
	if err != nil || d < 10*time.Millisecond || d > 10*time.Second {
		return 0, errors.New("an fsync mode is always or a duration from 10ms to 10s")
	}
	return d, nil
}

// defaultFsyncModes are the ingress's fsync modes without -journal-fsync
// or a --journal-fsync in -daemon-args: the default and the interval an
// operator trading a power loss's last 100 ms for throughput would pick.
var defaultFsyncModes = []string{fsyncAlways, "100ms"}

// setFsyncModes reads -daemon-args and -journal-fsync: the daemon's own
// --journal-fsync is taken out of the extra flags, since the ingress
// passes each mode itself, and is the one mode unless -journal-fsync names
// them.
func (c *config) setFsyncModes(daemonArgs, modes string) error {
	args := strings.Fields(daemonArgs)
	for i := 0; i < len(args); i++ {
		name, value, hasValue := strings.Cut(args[i], "=")
		if name != "--journal-fsync" && name != "-journal-fsync" {
			c.daemonArgs = append(c.daemonArgs, args[i])
			continue
		}
		if !hasValue {
			if i+1 == len(args) {
				return errors.New("-daemon-args: --journal-fsync without a value")
			}
			i++
			value = args[i]
		}
		if _, err := parseFsyncMode(value); err != nil {
			return fmt.Errorf("-daemon-args: --journal-fsync %q: %w", value, err)
		}
		c.daemonFsync = value
	}
	switch {
	case modes != "" && c.daemonFsync != "":
		return errors.New("-journal-fsync and a --journal-fsync in -daemon-args: give the modes once")
	case modes == "" && c.daemonFsync != "":
		c.fsyncModes = []string{c.daemonFsync}
		return nil
	case modes == "":
		c.fsyncModes = slices.Clone(defaultFsyncModes)
		return nil
	}
	for _, m := range strings.Split(modes, ",") {
		if _, err := parseFsyncMode(m); err != nil {
			return fmt.Errorf("-journal-fsync %q: %w", m, err)
		}
		if slices.Contains(c.fsyncModes, m) {
			return fmt.Errorf("-journal-fsync: %q twice", m)
		}
		c.fsyncModes = append(c.fsyncModes, m)
	}
	return nil
}

// Issue 39's targets, each side by side in the same run.
const (
	// durableRatio is the least ingress frames/s, as a share of the
	// durable ceiling's, with the daemon fsyncing before each 200.
	durableRatio = 0.90
	// durableCPURatio is the most CPU per frame the daemon may spend, as a
	// multiple of the durable ceiling's.
	durableCPURatio = 1.20
	// behindBareRatio is the least ingress frames/s with --journal-fsync D,
	// as a share of the bare net/http ceiling's: with the fsync off the
	// answer's path, the bare server is the ceiling again.
	behindBareRatio = 0.90
	// The stock daemon: at least these times its throughput, fsyncing
	// before each 200 and behind, at most stockCPU39 times its CPU per
	// frame.
	stockRateAlways = 1.50
	stockRateBehind = 2.20
	stockCPU39      = 0.50
)

// thisInMode is the role of this build's daemon in fsync mode m, beside
// the first mode's (roleThis).
func thisInMode(m string) string { return "this --journal-fsync " + m }

// durableRole is the role of the durable ceiling in fsync mode m.
func durableRole(m string) string { return "durable ceiling, fsync " + m }

// modeSuffix names an fsync mode in a row or a goal: nothing for the
// default.
func modeSuffix(m string) string {
	if m == fsyncAlways {
		return ""
	}
	return ", --journal-fsync " + m
}

// issue39Goals lists issue 39's targets that the ingress measures, in the
// issue's order; the stock daemon's are added as they are measured.
func issue39Goals(cfg config) *goalList {
	g := &goalList{title: "issue 39 targets (durable and fsync-behind ingress, side by side in this run)"}
	if !cfg.runs("ingress") {
		return g
	}
	for _, mode := range []string{modeCycling, modeNew} {
		for _, c := range issue14Producers {
			point := ingressPoint(mode, c)
			if slices.Contains(cfg.fsyncModes, fsyncAlways) {
				g.expect(durableGoalName(point), ">= "+fmtX(durableRatio))
				g.expect(durableCPUGoalName(point), "<= "+fmtX(durableCPURatio))
			}
			for _, m := range cfg.fsyncModes {
				if m != fsyncAlways {
					g.expect(behindGoalName(point, m), ">= "+fmtX(behindBareRatio))
				}
			}
		}
	}
	return g
}

func durableGoalName(point string) string {
	return "ingress frames/s vs the durable ceiling, " + point
}

func durableCPUGoalName(point string) string {
	return "  ingress CPU per frame over the durable ceiling's, " + point
}

func behindGoalName(point, m string) string {
	return "ingress frames/s vs bare net/http, " + point + modeSuffix(m)
}

// seriesOf returns the series of role, or nil.
func seriesOf(all []*series, role string) *series {
	for _, s := range all {
		if s.role == role {
			return s
		}
	}
	return nil
}

// fsyncRows adds a point's rows of issue 39: in each fsync mode, this
// build against the durable ceiling fsyncing alike (throughput and CPU per
// frame), and in a mode other than the first, against the bare ceiling and
// the stock daemon as well. all are runFigure's series: this build in the
// first mode, then the bare ceiling, then the others by role.
func (b *bench) fsyncRows(point string, c int, all []*series) {
	targeted := slices.Contains(issue14Producers, c)
	bare, stock := all[1], seriesOf(all, roleStock)
	for i, m := range b.cfg.fsyncModes {
		this := all[0]
		if i > 0 {
			this = seriesOf(all, thisInMode(m))
		}
		durable := seriesOf(all, durableRole(m))
		if this == nil || durable == nil {
			continue
		}
		if i > 0 {
			r := rateRow(fmt.Sprintf("accepted frames/s, %s%s closed loop", point, modeSuffix(m)), this, bare)
			if targeted && m != fsyncAlways {
				b.targetRow(&r, behindGoalName(point, m), true, behindBareRatio)
			}
			b.tbl.add(r.row)
		}
		r := rateRow(fmt.Sprintf("  against the durable ceiling, fsync %s, at %s", m, point), this, durable)
		cr := cpuOverRow(fmt.Sprintf("  CPU per frame over the durable ceiling's, fsync %s, at %s (ratio: daemon/ceiling)", m, point), this, durable)
		if targeted && m == fsyncAlways {
			b.targetRow(&r, durableGoalName(point), true, durableRatio)
			b.targetRow(&cr, durableCPUGoalName(point), false, durableCPURatio)
		}
		b.tbl.add(r.row)
		b.tbl.add(cr.row)
		if stock == nil {
			continue
		}
		least := stockRateAlways
		if m != fsyncAlways {
			least = stockRateBehind
		}
		sr := rateRow(fmt.Sprintf("  %s%s: frames/s over the stock daemon's", point, modeSuffix(m)), this, stock)
		sc := cpuOverRow(fmt.Sprintf("  %s%s: CPU per frame over the stock daemon's", point, modeSuffix(m)), this, stock)
		sr.section, sc.section = "stock", "stock"
		b.targetRow(&sr, "ingress frames/s over the stock daemon's, "+point+modeSuffix(m), true, least)
		b.targetRow(&sc, "  ingress CPU per frame over the stock daemon's, "+point+modeSuffix(m), false, stockCPU39)
		if i > 0 {
			// The first mode's are issue 30's rows, above.
			b.tbl.add(sr.row)
			b.tbl.add(sc.row)
		}
		b.ceilingOverStockRows(point+modeSuffix(m), durable, stock)
	}
}

// ceilingOverStockRows adds, for reference, the durable ceiling's own
// figures over the stock daemon's at a point: what the stock targets ask
// of this build asks at least this much of a server that keeps the same
// promise on net/http, since this build is held to 0.9 of it.
func (b *bench) ceilingOverStockRows(point string, durable, stock *series) {
	r := rateRow(fmt.Sprintf("  %s: the durable ceiling's frames/s over the stock daemon's (reference)", point), durable, stock)
	c := cpuOverRow(fmt.Sprintf("  %s: the durable ceiling's CPU per frame over the stock daemon's (reference)", point), durable, stock)
	r.section, c.section = "stock", "stock"
	b.tbl.add(r.row)
	b.tbl.add(c.row)
}

// ratioRow is a row whose ratio is a median of per-trial ratios, kept
// as a number for its target.
type ratioRow struct {
	row
	ratio float64
	ok    bool
}

// rateRow is a row of this's throughput against other's: the medians and
// the median of the per-trial ratios.
func rateRow(figure string, this, other *series) ratioRow {
	r, ok := ratioOf(trialRatios(this.rate, other.rate))
	return ratioRow{row{section: "ingress", figure: figure, measured: fmtRate(median(this.rate)), baseline: fmtRate(median(other.rate)), ratio: optX(r, ok)}, r, ok}
}

// cpuOverRow is a row of this's CPU per frame against other's, as this
// over other (below 1 is cheaper).
func cpuOverRow(figure string, this, other *series) ratioRow {
	d, o := medianDuration(this.cpu), medianDuration(other.cpu)
	if d == 0 || o == 0 {
		return ratioRow{row: row{section: "ingress", figure: figure, measured: "n/a", result: unavailable}}
	}
	r, ok := ratioOf(trialRatios(durations(this.cpu), durations(other.cpu)))
	return ratioRow{row{section: "ingress", figure: figure, measured: fmtMicros(d), baseline: fmtMicros(o), ratio: optX(r, ok)}, r, ok}
}

// targetRow holds a row to a target of issue 39, at least or at most
// bound, and sets its goal.
func (b *bench) targetRow(r *ratioRow, goal string, atLeastBound bool, bound float64) {
	if atLeastBound {
		r.target, r.result = ">= "+fmtX(bound), atLeast(r.ratio, r.ok, bound)
	} else {
		r.target, r.result = "<= "+fmtX(bound), atMost(r.ratio, r.ok, bound)
	}
	cell := "n/a"
	if r.ok {
		cell = fmt.Sprintf("%s (%s vs %s)", r.row.ratio, r.measured, r.baseline)
	}
	b.goals39.set(goal, r.target, cell, r.result)
}

// collectorCPU is the CPU time d's collector has spent since it started,
// from its metrics page (go_cpu_classes_gc_total_cpu_seconds_total); false
// when it serves none (no --metrics, or a build before the metric).
func (b *bench) collectorCPU(d *daemon) (time.Duration, bool) {
	if d == nil || !b.hasMetrics {
		return 0, false
	}
	text, err := d.scrape(b.cfg.metricsPath)
	if err != nil {
		return 0, false
	}
	v, n := promSum(text, "go_cpu_classes_gc_total_cpu_seconds_total")
	if n == 0 {
		return 0, false
	}
	return time.Duration(v * float64(time.Second)), true
}

// collectorRow adds the row of what this build's collector spent a frame
// over a point's trials (gc, over the frames this series accepted) and its
// share of the build's CPU per frame: the runtime's estimate, which counts
// its idle-time marking too. A new job per frame grows the heap it marks
// (spec 4.1); cycling ids do not.
func (b *bench) collectorRow(point string, gc time.Duration, this *series) {
	if this.ok == 0 || gc <= 0 {
		return
	}
	per := gc / time.Duration(this.ok)
	cpu := medianDuration(this.cpu)
	r := row{section: "ingress", figure: fmt.Sprintf("  this build's collector, CPU per frame at %s (ratio: its share of the build's CPU per frame)", point),
		measured: fmtMicros(per), baseline: fmtMicros(cpu)}
	if cpu > 0 {
		r.ratio = fmt.Sprintf("%.0f%%", 100*float64(per)/float64(cpu))
	}
	b.tbl.add(r)
}
