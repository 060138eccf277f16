//go:build linux

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/testkit"
)

// A real single-node Slurm for a test (issue 38): Debian's slurm-wlm and
// munge, started by the test without systemd, as root, in a directory of
// its own, on ports it picked and wrote into its slurm.conf, so that two
// runs on one machine never meet. Everything it starts it stops at
// cleanup. Measured here: slurm-wlm 22.05.8 with munge 0.5.15 starts to an
// idle node in about 1.5 s.

// slurmTools are the commands a test's Slurm needs (.ci/run installs
// slurm-wlm and munge).
var slurmTools = []string{"munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo"}

// slurm is one running Slurm: its munged, controller and node daemon.
type slurm struct {
	t      *testing.T
	dir    string // everything it writes, removed at cleanup
	conf   string // its slurm.conf; SLURM_CONF names it to every command
	node   string // the node's name in Slurm
	munged *slurmProc
	ctld   *slurmProc // nil while stopped
	slurmd *slurmProc
}

// slurmProc is one of a Slurm's daemons, run in the foreground.
type slurmProc struct {
	cmd    *exec.Cmd
	log    *testkit.LogBuffer
	exited chan struct{} // closed once it ended and was waited for
}

func (p *slurmProc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// needSlurm skips the test where it cannot run a Slurm (outside CI) and
// fails it under CI=true: Slurm's daemons run as root, from the packages.
func needSlurm(t *testing.T) {
	t.Helper()
	daemonBinary(t) // skips under -short
	if os.Geteuid() != 0 {
		skipOrFailWithout(t, "a test's Slurm runs its daemons as root, and this test does not run as root")
	}
	for _, tool := range slurmTools {
		if _, err := exec.LookPath(tool); err != nil {
			skipOrFailWithout(t, fmt.Sprintf("%s is not installed (apt-get install slurm-wlm munge)", tool))
		}
	}
}

// startSlurm starts a Slurm of one node with cpus CPUs and returns once
// the node is idle. Ports are picked free and written into slurm.conf; a
// controller that loses its port to another process in between is started
// again on others.
func startSlurm(t *testing.T, cpus int) *slurm {
	t.Helper()
	needSlurm(t)
	dir, err := os.MkdirTemp("", "nvpair-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	// munged requires every directory on its socket's path to be
	// searchable by all; the state is root's alone below it.
	os.Chmod(dir, 0o755)
	s := &slurm{t: t, dir: dir, conf: filepath.Join(dir, "slurm.conf"), node: "n1"}
	t.Cleanup(s.stop)
	s.munged = s.startMunge()
	for attempt := 1; ; attempt++ {
		ctldPort, slurmdPort := freePort(t), freePort(t)
		s.writeConf(ctldPort, slurmdPort, cpus)
		s.startController()
		s.slurmd = s.daemon("slurmd", "-D", "-N", s.node)
		if s.waitIdle() {
			return s
		}
		if attempt == 3 {
			t.Fatalf("Slurm did not come up; its controller's log:\n%s", s.ctld.log.String())
		}
		// A port another process took meanwhile: again, on others.
		s.stopController()
		stopProcess(s.slurmd)
	}
}

// freePort is a TCP port no process held a moment ago.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startMunge starts a munged of the test's own, on a socket in its
// directory, with a key of its own.
func (s *slurm) startMunge() *slurmProc {
	md := filepath.Join(s.dir, "munge")
	if err := os.Mkdir(md, 0o711); err != nil {
		s.t.Fatal(err)
	}
	key := make([]byte, 1024)
	rand.Read(key)
	if err := os.WriteFile(filepath.Join(md, "munge.key"), key, 0o600); err != nil {
		s.t.Fatal(err)
	}
	p := s.daemon("munged", "-F", "--socket", s.mungeSocket(), "--key-file", filepath.Join(md, "munge.key"),
		"--pid-file", filepath.Join(md, "munged.pid"), "--log-file", filepath.Join(md, "munged.log"), "--seed-file", filepath.Join(md, "munged.seed"))
	testkit.Eventually(s.t, "munged's socket", func() bool { _, err := os.Stat(s.mungeSocket()); return err == nil })
	return p
}

func (s *slurm) mungeSocket() string { return filepath.Join(s.dir, "munge", "munge.socket") }

// writeConf writes slurm.conf: the node line as `slurmd -C` gives it, but
// for cpus; no accounting, no cgroups (proctrack/linuxproc, task/none),
// no mail; KillWait short so a cancelled job is gone in a second, and
// MessageTimeout short (loopback answers at once) so a command finds a
// stopped controller gone in seconds rather than its default 10 s.
func (s *slurm) writeConf(ctldPort, slurmdPort, cpus int) {
	host, _ := os.Hostname()
	var b bytes.Buffer
	fmt.Fprintf(&b, `ClusterName=t%d
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=%d
SlurmdPort=%d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%s
CredType=cred/munge
StateSaveLocation=%[5]s/state
SlurmdSpoolDir=%[5]s/spool
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmdPidFile=%[5]s/slurmd.pid
SlurmctldLogFile=%[5]s/slurmctld.log
SlurmdLogFile=%[5]s/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=1
MessageTimeout=3
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=%[6]s NodeHostname=%[7]s NodeAddr=127.0.0.1 Port=%[3]d CPUs=%[8]d RealMemory=500 State=UNKNOWN
PartitionName=p Nodes=%[6]s Default=YES MaxTime=INFINITE State=UP
`, os.Getpid(), ctldPort, slurmdPort, s.mungeSocket(), s.dir, s.node, host, cpus)
	for _, d := range []string{"state", "spool"} {
		os.MkdirAll(filepath.Join(s.dir, d), 0o700)
	}
	if err := os.WriteFile(s.conf, b.Bytes(), 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// env is the environment every Slurm command of this Slurm runs in.
func (s *slurm) env() []string { return append(os.Environ(), "SLURM_CONF="+s.conf) }

// daemon starts one of the Slurm's daemons in the foreground; stop (at
// cleanup) stops it.
func (s *slurm) daemon(argv ...string) *slurmProc {
	s.t.Helper()
	p := &slurmProc{cmd: exec.Command(argv[0], argv[1:]...), log: &testkit.LogBuffer{}, exited: make(chan struct{})}
	p.cmd.Env, p.cmd.Dir = s.env(), s.dir
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		s.t.Fatalf("%s: %v", argv[0], err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	return p
}

// startController starts slurmctld, from the state it saved (a restart
// keeps the jobs).
func (s *slurm) startController() {
	s.t.Helper()
	s.ctld = s.daemon("slurmctld", "-D")
}

// stopController stops slurmctld (SIGTERM: it saves its state first) and
// waits for it. Jobs keep running under slurmd meanwhile.
func (s *slurm) stopController() {
	stopProcess(s.ctld)
	s.ctld = nil
}

// waitIdle waits until the node is idle, or the controller died (its
// port taken), and reports whether it came up.
func (s *slurm) waitIdle() bool {
	deadline := time.Now().Add(testkit.WaitTimeout)
	for time.Now().Before(deadline) {
		if !s.ctld.running() {
			return false
		}
		out, _ := s.command("sinfo", "-h", "-o", "%T").Output()
		if strings.TrimSpace(string(out)) == "idle" {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// command is a Slurm command of this Slurm, run from its directory (where
// sbatch's jobs write their output).
func (s *slurm) command(name string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	s.t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env, cmd.Dir = s.env(), s.dir
	return cmd
}

// run runs a Slurm command and returns its output, failing the test on an
// error.
func (s *slurm) run(name string, args ...string) string {
	s.t.Helper()
	out, err := s.command(name, args...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s %q: %v\n%s", name, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// sbatch submits a batch job and returns its job id.
func (s *slurm) sbatch(args ...string) string {
	s.t.Helper()
	id, _, _ := strings.Cut(s.run("sbatch", append([]string{"--parsable"}, args...)...), ";")
	return id
}

// states is Slurm's own view, as its text output gives it (a reading of
// its own, apart from the bridge's JSON): each job's state by its id
// ("12", "45_2"; a pending array not split yet is "45_[0-2]").
func (s *slurm) states() (map[string]string, error) {
	out, err := s.command("squeue", "-h", "-t", "all", "-o", "%i %T").Output()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if id, st, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			m[id] = st
		}
	}
	return m, nil
}

// waitState waits until Slurm shows job id in state.
func (s *slurm) waitState(id, state string) {
	s.t.Helper()
	testkit.Eventually(s.t, fmt.Sprintf("Slurm to show job %s %s", id, state), func() bool {
		m, err := s.states()
		return err == nil && m[id] == state
	})
}

// stop cancels every job, waits until none runs, and stops the daemons:
// the controller, slurmd, munged. A job's slurmstepd outlives slurmd
// unless its job ends first.
func (s *slurm) stop() {
	if s.ctld != nil && s.ctld.running() {
		s.command("scancel", "--user", "root").Run()
		deadline := time.Now().Add(testkit.WaitTimeout)
		for time.Now().Before(deadline) {
			out, err := s.command("squeue", "-h", "-t", "running,completing,configuring", "-o", "%i").Output()
			if err != nil || strings.TrimSpace(string(out)) == "" {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if s.t.Failed() {
			s.t.Logf("slurmctld's log:\n%s", s.ctld.log.String())
		}
	}
	s.stopController()
	stopProcess(s.slurmd)
	stopProcess(s.munged)
	s.killLeftJobs()
	os.RemoveAll(s.dir)
}

// killLeftJobs kills what is left of this Slurm's jobs: their slurmstepd
// and its children outlive slurmd, and a test that ends while the
// controller is down cannot cancel them. Each carries this Slurm's
// SLURM_CONF in its environment (sbatch exports the submitter's), a path
// no other Slurm has.
func (s *slurm) killLeftJobs() {
	mark := []byte("SLURM_CONF=" + s.conf + "\x00")
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		env, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(env, mark) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && pid != os.Getpid() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// stopProcess sends p SIGTERM, waits up to 5 s, then kills it.
func stopProcess(p *slurmProc) {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}
