//go:build unix

// Package readmetest runs the shell blocks of the README and of the guides
// under docs/ as a reader would, so that every command they give is known
// to work and every exit status they state holds, wherever the text lives.
// Each fenced block of shell (or Python) in them carries a marker on the
// line before it:
//
//	<!-- doctest: KIND [word ...] [key=value ...] -->
//
// KIND says how the block is run: devcluster (a dev cluster command;
// "ctrl-c" stops it with SIGINT to its process group, as a terminal's
// Ctrl-C does, and "exit=N" is the status it must end with),
// with-devcluster (run while the ctrl-c dev cluster runs), standalone (run
// from the module root), pair-node (the installation steps, in a scratch
// home directory; "daemon" starts the daemon the way PAIR's broker does
// before the block), ci (what .ci/run runs) or not-run (with a reason).
// "output=X" wants every line the block prints to be X.
//
// The files are read in one order, the README first, then docs/*.md and
// docs/decisions/*.md by name, so the blocks of each kind run in that
// order. The tests that build or start the daemon skip under go test
// -short; the checks of links and test names run always.
package readmetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// block is one fenced block of the README or a guide.
type block struct {
	file  string            // the file, from the module root
	line  int               // the opening fence's line, 1-based
	lang  string            // sh, python, ...
	kind  string            // the marker's kind; "" without a marker
	words map[string]bool   // the marker's bare words
	attrs map[string]string // the marker's key=value pairs
	text  string            // the body, its fence's indentation removed
}

func (b block) String() string { return fmt.Sprintf("%s:%d (%s)", b.file, b.line, b.kind) }

var (
	markerLine = regexp.MustCompile(`^<!-- doctest: (.*) -->$`)
	markerAttr = regexp.MustCompile(`(\w+)=("[^"]*"|\S+)`)
)

// moduleRoot is the repository's root, where the README's commands run.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// docFiles are the files whose blocks are run, from the module root: the
// README, then docs/*.md and docs/decisions/*.md, each by name.
func docFiles(t *testing.T) []string {
	t.Helper()
	root := moduleRoot(t)
	files := []string{"README.md"}
	for _, dir := range []string{"docs", filepath.Join("docs", "decisions")} {
		names, err := filepath.Glob(filepath.Join(root, dir, "*.md"))
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(names)
		for _, n := range names {
			rel, err := filepath.Rel(root, n)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, filepath.ToSlash(rel))
		}
	}
	return files
}

// readmeBlocks parses the fenced blocks of every file of docFiles and
// their markers, in that order.
func readmeBlocks(t *testing.T) []block {
	t.Helper()
	var out []block
	for _, name := range docFiles(t) {
		out = append(out, fileBlocks(t, name)...)
	}
	return out
}

// fileBlocks parses one file's fenced blocks and their markers.
func fileBlocks(t *testing.T, name string) []block {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), name))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var out []block
	prev := ""
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(trimmed, "```") {
			if trimmed != "" {
				prev = trimmed
			}
			continue
		}
		indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " "))]
		bl := block{file: name, line: i + 1, lang: strings.TrimPrefix(trimmed, "```"), words: map[string]bool{}, attrs: map[string]string{}}
		if m := markerLine.FindStringSubmatch(prev); m != nil {
			spec := m[1]
			for _, a := range markerAttr.FindAllStringSubmatch(spec, -1) {
				bl.attrs[a[1]] = strings.Trim(a[2], `"`)
			}
			spec = markerAttr.ReplaceAllString(spec, "")
			f := strings.Fields(spec)
			if len(f) > 0 {
				bl.kind = f[0]
				for _, w := range f[1:] {
					bl.words[w] = true
				}
			}
		}
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		bl.text = strings.Join(body, "\n") + "\n"
		out = append(out, bl)
		prev = ""
	}
	return out
}

// blocksOf returns the blocks of kind, in order.
func blocksOf(t *testing.T, kind string) []block {
	var out []block
	for _, b := range readmeBlocks(t) {
		if b.kind == kind {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		t.Fatalf("neither the README nor docs/ has a block marked %q", kind)
	}
	return out
}

// skipOrFail skips a test the machine cannot run (outside CI), and fails
// it under CI=true, where the machine is set up for it.
func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

var kinds = map[string]bool{"devcluster": true, "with-devcluster": true, "standalone": true, "pair-node": true, "ci": true, "not-run": true}

func TestEveryCommandBlockOfTheREADMEIsMarked(t *testing.T) {
	for _, b := range readmeBlocks(t) {
		switch b.lang {
		case "sh", "bash", "shell", "console", "python", "":
		default:
			continue // data: json, yaml, promql
		}
		if !kinds[b.kind] {
			t.Errorf("%s: a %q block without a doctest marker of a known kind; every command the README and docs/ give is run", b, b.lang)
		}
		if b.kind == "not-run" && b.attrs["reason"] == "" {
			t.Errorf("%s: not-run without a reason", b)
		}
	}
}

// commandLines are a block's lines without comments and blank lines.
func commandLines(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

func TestREADMETestCommandIsWhatCIRuns(t *testing.T) {
	ci, err := os.ReadFile(filepath.Join(moduleRoot(t), ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocksOf(t, "ci") {
		for _, cmd := range commandLines(b.text) {
			if !strings.Contains(string(ci), "\n"+cmd+"\n") {
				t.Errorf("%s: .ci/run does not run %q", b, cmd)
			}
		}
	}
}

// result is how a block or a command ended.
type result struct {
	code   int
	stdout string
	stderr string
}

// runBlock runs a block (sh with bash, python with python3) in dir with
// env added, and fails the test when it does not end within limit.
func runBlock(t *testing.T, b block, dir string, env []string, limit time.Duration) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var cmd *exec.Cmd
	switch b.lang {
	case "python":
		py, err := exec.LookPath("python3")
		if err != nil {
			skipOrFail(t, "python3 is not installed")
		}
		cmd = exec.CommandContext(ctx, py, "-c", b.text)
	default:
		cmd = exec.CommandContext(ctx, "bash", "-eo", "pipefail", "-c", b.text)
	}
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s did not end within %s:\n%s\nstdout:\n%s\nstderr:\n%s", b, limit, b.text, stdout.String(), stderr.String())
	}
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s: %v", b, err)
		}
		code = ee.ExitCode()
	}
	return result{code, stdout.String(), stderr.String()}
}

// wantOK fails the test unless the block exited 0 and, with output=X,
// printed only lines that are X.
func wantOK(t *testing.T, b block, r result) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("%s exited %d:\n%s\nstdout:\n%s\nstderr:\n%s", b, r.code, b.text, r.stdout, r.stderr)
	}
	if want, ok := b.attrs["output"]; ok {
		lines := strings.Fields(r.stdout)
		if len(lines) == 0 {
			t.Fatalf("%s printed nothing, want %q", b, want)
		}
		for _, l := range lines {
			if l != want {
				t.Fatalf("%s printed %q, want only %q lines:\nstderr:\n%s", b, r.stdout, want, r.stderr)
			}
		}
	}
}

// portTaken reports whether output says 127.0.0.1:14324, the README's
// ingress port, was in use: the machine runs something there.
func portTaken(output string) bool {
	return strings.Contains(output, "127.0.0.1:14324") && strings.Contains(output, "address already in use")
}

// removeNew removes the files at paths that do not exist now, once the
// test is over: the builds the blocks give write into the module root.
func removeNew(t *testing.T, paths ...string) {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			continue
		}
		t.Cleanup(func() { os.Remove(p) })
	}
}

// skipIfShort skips a test that builds or starts the daemon under go test
// -short, the one-minute inner loop.
func skipIfShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: this test builds and runs the daemon (minutes, not the inner loop's seconds)")
	}
}

func TestREADMEBuildAndRunByHand(t *testing.T) {
	skipIfShort(t)
	root := moduleRoot(t)
	removeNew(t, filepath.Join(root, "nvpair-workload-manager"), filepath.Join(root, "nvpair-workload-manager.exe"))
	scratch := t.TempDir()
	for _, b := range blocksOf(t, "standalone") {
		// The one change: the by-hand run's scratch directory is the test's.
		b.text = strings.ReplaceAll(b.text, "/tmp/try", scratch)
		r := runBlock(t, b, root, nil, 5*time.Minute)
		if r.code != 0 && portTaken(r.stderr) {
			skipOrFail(t, "port 14324 is taken on this machine: "+r.stderr)
		}
		wantOK(t, b, r)
		if strings.Contains(b.text, "--help") && !strings.Contains(r.stdout, "usage: nvpair-workload-manager") {
			t.Errorf("%s: --help printed no usage:\n%s", b, r.stdout)
		}
	}
}

// supervisor is internal/dev/pairsupervisor running the stock workload
// manager the way PAIR's broker does: it starts the worker again whenever
// it exits, which is what the install script relies on.
type supervisor struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser // it stops when this closes (as when the test dies)
	log   string         // the worker's stderr and the supervisor's starts and exits
	done  chan struct{}
}

func TestREADMEInstallOnAPAIRNode(t *testing.T) {
	skipIfShort(t)
	if runtime.GOOS != "linux" {
		t.Skip("the installation blocks use Linux's ~/.config")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		skipOrFail(t, "curl is not installed")
	}
	root := moduleRoot(t)
	removeNew(t, filepath.Join(root, "nvpair-workload-manager"))
	home := t.TempDir()
	appDir := filepath.Join(home, ".config", "Nvidia Corporation", "NVIDIA PAIR")
	installDir := filepath.Join(t.TempDir(), "NVIDIA PAIR", "bin")
	for _, d := range []string{appDir, installDir} { // what a PAIR installation has
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// The home is new, but Go's caches are the machine's: the README's
	// build in the block then takes seconds, not a build of the standard
	// library from nothing.
	goEnv, err := exec.Command("go", "env", "GOCACHE", "GOMODCACHE", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	caches := strings.Fields(string(goEnv))
	if len(caches) != 3 {
		t.Fatalf("go env printed %q, want three paths", goEnv)
	}
	env := []string{"HOME=" + home, "XDG_CONFIG_HOME=", "GOCACHE=" + caches[0], "GOMODCACHE=" + caches[1], "GOPATH=" + caches[2]}
	// The stock workload manager: a build of ours with another version,
	// which the README's rollback must bring back.
	exe := filepath.Join(installDir, "nvpair-workload-manager")
	if out, err := exec.Command("go", "build", "-ldflags", "-X main.Version=stock", "-o", exe, root).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	stock, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	var s *supervisor
	for _, b := range blocksOf(t, "pair-node") {
		if b.words["supervised"] && s == nil {
			s = superviseAsPAIRDoes(t, exe, appDir, env)
		}
		r := runBlock(t, b, root, env, 3*time.Minute)
		if r.code != 0 && s != nil && portTaken(readLog(s.log)) {
			skipOrFail(t, "port 14324 is taken on this machine: "+readLog(s.log))
		}
		wantOK(t, b, r)
	}
	if s == nil {
		t.Fatal("no pair-node block started the supervised worker")
	}
	// The last block rolled back: the stock executable is in place again.
	if now, err := os.ReadFile(exe); err != nil || !bytes.Equal(now, stock) {
		t.Fatalf("after the README's rollback the worker's executable is not the stock one (err %v)", err)
	}
}

func readLog(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// superviseAsPAIRDoes runs exe under internal/dev/pairsupervisor with the
// broker's two arguments (only --log-level and --cluster-dir) and waits
// until the worker has started.
func superviseAsPAIRDoes(t *testing.T, exe, appDir string, env []string) *supervisor {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "pairsupervisor")
	if out, err := exec.Command("go", "build", "-o", bin, filepath.Join(moduleRoot(t), "internal", "dev", "pairsupervisor")).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	args := filepath.Join(dir, "args")
	if err := os.WriteFile(args, []byte("--log-level\ninfo\n--cluster-dir\n"+filepath.Join(appDir, "cluster")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &supervisor{log: filepath.Join(dir, "worker.log"), done: make(chan struct{})}
	s.cmd = exec.Command(bin, "--exe", exe, "--args", args, "--lines", filepath.Join(dir, "broker-lines"), "--log", s.log, "--max-duration", "10m", "--watch-stdin")
	s.cmd.Env = append(os.Environ(), env...)
	var err error
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		s.cmd.Process.Signal(syscall.SIGTERM)
		<-s.done
		s.stdin.Close()
		if t.Failed() {
			t.Logf("worker log:\n%s", readLog(s.log))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(readLog(s.log), `msg=started`) {
		if time.Now().After(deadline) {
			t.Fatalf("the supervised worker did not start:\n%s", readLog(s.log))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

// devcluster is a running dev cluster command and what it printed.
type devcluster struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stdout bytes.Buffer
	stderr bytes.Buffer
	done   chan struct{}
}

func (d *devcluster) output() (string, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stdout.String(), d.stderr.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// startDevcluster runs a devcluster block with bash in its own process
// group, as a shell runs a foreground job, from the module root.
func startDevcluster(t *testing.T, b block) *devcluster {
	t.Helper()
	d := &devcluster{done: make(chan struct{})}
	d.cmd = exec.Command("bash", "-c", b.text)
	d.cmd.Dir = moduleRoot(t)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	d.cmd.Stdout = lockedWriter{&d.mu, &d.stdout}
	d.cmd.Stderr = lockedWriter{&d.mu, &d.stderr}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
			<-d.done
		}
		if t.Failed() {
			out, errs := d.output()
			t.Logf("%s stdout (tail):\n%s\nstderr:\n%s", b, tail(out, 40), errs)
		}
	})
	return d
}

// waitFor waits until the dev cluster printed want, and skips or fails
// the test when it ended first.
func (d *devcluster) waitFor(t *testing.T, want string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		out, errs := d.output()
		if strings.Contains(out, want) {
			return
		}
		select {
		case <-d.done:
			if portTaken(errs) {
				skipOrFail(t, "port 14324 is taken on this machine: "+errs)
			}
			t.Fatalf("the dev cluster ended before printing %q (exit %d)", want, d.cmd.ProcessState.ExitCode())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dev cluster did not print %q within %s", want, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wait waits for the dev cluster to end and returns its exit status.
func (d *devcluster) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-d.done:
		return d.cmd.ProcessState.ExitCode()
	case <-time.After(limit):
		t.Fatalf("the dev cluster did not end within %s", limit)
		return -1
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// startupLimit bounds a dev cluster's start: go run compiles it and it
// builds the daemon, on a machine that may be busy.
const startupLimit = 5 * time.Minute

// TestREADMEQuickstartRunsAndTheJobsReachEveryNode runs the quickstart's
// dev cluster command as written, every block marked to run against it
// while it runs, then stops it with SIGINT to its process group, as Ctrl-C
// in a terminal does.
func TestREADMEQuickstartRunsAndTheJobsReachEveryNode(t *testing.T) {
	skipIfShort(t)
	var quick block
	for _, b := range blocksOf(t, "devcluster") {
		if b.words["ctrl-c"] {
			quick = b
		}
	}
	if quick.text == "" {
		t.Fatal("no devcluster block marked ctrl-c")
	}
	d := startDevcluster(t, quick)
	d.waitFor(t, "devcluster: all nodes up", startupLimit)
	for _, b := range blocksOf(t, "with-devcluster") {
		// PAUSE shortens the whole-life demo's pauses, there for a reader
		// to watch each step: the steps and their answers are the same.
		wantOK(t, b, runBlock(t, b, moduleRoot(t), []string{"PAUSE=0.2"}, 2*time.Minute))
	}
	if err := syscall.Kill(-d.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	code := d.wait(t, time.Minute)
	out, errs := d.output()
	if !strings.Contains(out, "converged: yes") {
		t.Fatalf("after Ctrl-C the dev cluster did not report converged views:\n%s\nstderr:\n%s", tail(out, 40), errs)
	}
	// The README says go run reports its own status when interrupted: 1.
	// (A go command with one build worker does not notice the interrupt.)
	if runtime.NumCPU() > 1 && code != 1 {
		t.Errorf("go run ended with %d after Ctrl-C; the README says 1", code)
	}
	// Every job the blocks reported reached every node: the summary lists
	// each node's jobs. The README's quickstart job is still running.
	summary := out[strings.LastIndex(out, "node1 (n1, node id"):]
	if n := countLines(summary, "my-first-job", "running"); n != 3 {
		t.Errorf("my-first-job is running on %d nodes in the summary, want all 3:\n%s", n, summary)
	}
	for _, id := range []string{"job-42", "py-job-1", "myharness-job-1", "shell-job-1"} {
		if n := countLines(summary, id); n != 3 {
			t.Errorf("%s is on %d nodes in the summary, want 3", id, n)
		}
	}
	if strings.Contains(summary, "curl-job-1") {
		t.Error("curl-job-1, which its block removed, is still in the summary")
	}
}

// countLines counts the lines of s that hold every fragment.
func countLines(s string, fragments ...string) int {
	n := 0
	for _, l := range strings.Split(s, "\n") {
		all := true
		for _, f := range fragments {
			all = all && strings.Contains(l, f)
		}
		if all {
			n++
		}
	}
	return n
}

// TestREADMEDevclusterExitStatusHoldsForTheCommandItGives runs each dev
// cluster command whose exit status the README states, as written.
func TestREADMEDevclusterExitStatusHoldsForTheCommandItGives(t *testing.T) {
	skipIfShort(t)
	ran := 0
	for _, b := range blocksOf(t, "devcluster") {
		want, ok := b.attrs["exit"]
		if !ok {
			continue
		}
		wantCode, err := strconv.Atoi(want)
		if err != nil {
			t.Fatalf("%s: exit=%q", b, want)
		}
		ran++
		d := startDevcluster(t, b)
		d.waitFor(t, "devcluster: all nodes up", startupLimit)
		code := d.wait(t, 3*time.Minute)
		out, errs := d.output()
		if code != wantCode {
			t.Errorf("%s ended with %d, the README says %d:\n%s\nstderr:\n%s", b, code, wantCode, tail(out, 30), errs)
		}
		if wantCode == 0 && !strings.Contains(out, "converged: yes") {
			t.Errorf("%s exited 0 without converged views:\n%s", b, tail(out, 30))
		}
	}
	if ran == 0 {
		t.Fatal("no devcluster block states an exit status")
	}
}
