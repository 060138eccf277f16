//go:build unix

package main

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// assertExited checks that none of pids is running any more: each was
// waited for by the devcluster, so a signal 0 to it finds no process.
func assertExited(t *testing.T, pids []int) {
	t.Helper()
	if len(pids) == 0 {
		t.Error("no daemon process was recorded")
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("daemon pid %d is still there after the devcluster ended (kill 0: %v)", pid, err)
		}
	}
}

var (
	devclusterOnce sync.Once
	devclusterBin  string
	devclusterErr  error
)

// buildDevcluster builds this command once, for the tests that signal it as
// a separate process.
func buildDevcluster(t *testing.T) string {
	t.Helper()
	needsDaemons(t)
	devclusterOnce.Do(func() {
		goBin, err := goTool()
		if err != nil {
			devclusterErr = err
			return
		}
		devclusterBin = filepath.Join(testTmp, "devcluster")
		out, err := exec.Command(goBin, "build", "-o", devclusterBin, ".").CombinedOutput()
		if err != nil {
			devclusterErr = errors.New(string(out))
		}
	})
	if devclusterErr != nil {
		t.Fatalf("build the devcluster: %v", devclusterErr)
	}
	return devclusterBin
}

var (
	pidLine     = regexp.MustCompile(`^devcluster: node\d+ pid (\d+) `)
	dirLine     = regexp.MustCompile(`^devcluster: \d+ nodes under (\S+),`)
	acceptedRun = regexp.MustCompile(`traffic: ingress [1-9]\d* accepted`)
)

func TestDevclusterLeavesNoChildAfterASignal(t *testing.T) {
	bin := buildDevcluster(t)
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(bin, "--bin", daemonBin, "--simulate", "--ingress", "127.0.0.1:0", "--resync-interval", "1s")
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr lockedBuffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill() // only if the test fails before the wait

			var out lockedBuffer
			var mu sync.Mutex
			var pids []int
			var dir string
			sawTraffic := make(chan struct{})
			readDone := make(chan struct{})
			go func() {
				defer close(readDone)
				var once sync.Once
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					line := sc.Text()
					io.WriteString(&out, line+"\n")
					mu.Lock()
					if m := pidLine.FindStringSubmatch(line); m != nil {
						pid, _ := strconv.Atoi(m[1])
						pids = append(pids, pid)
					}
					if m := dirLine.FindStringSubmatch(line); m != nil {
						dir = m[1]
					}
					mu.Unlock()
					if acceptedRun.MatchString(line) {
						once.Do(func() { close(sawTraffic) })
					}
				}
			}()
			select {
			case <-sawTraffic: // the nodes are up and the ingress took traffic
			case <-readDone:
				t.Fatalf("the devcluster ended before any traffic:\n%s\nstderr:\n%s", out.String(), stderr.String())
			case <-time.After(waitTimeout):
				t.Fatalf("no ingress traffic within %s:\n%s", waitTimeout, tail(out.String(), 20))
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			waited := make(chan error, 1)
			go func() { <-readDone; waited <- cmd.Wait() }()
			select {
			case err = <-waited:
			case <-time.After(waitTimeout):
				t.Fatalf("the devcluster did not end within %s of %v", waitTimeout, sig)
			}
			if err != nil {
				t.Errorf("exit after %v: %v, want status 0\nstdout tail:\n%s\nstderr:\n%s", sig, err, tail(out.String(), 20), stderr.String())
			}
			if !strings.Contains(out.String(), "converged: yes") {
				t.Errorf("no convergence verdict after %v:\n%s", sig, tail(out.String(), 20))
			}
			mu.Lock()
			defer mu.Unlock()
			if len(pids) != 3 {
				t.Fatalf("found %d daemon pids in the output, want 3", len(pids))
			}
			assertExited(t, pids)
			if _, err := os.Stat(dir); dir == "" || !os.IsNotExist(err) {
				t.Errorf("working directory %q not removed (%v)", dir, err)
			}
		})
	}
}
