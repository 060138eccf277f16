// Command pairsupervisor stands in for PAIR's broker where the install
// script is tested: it runs the workload manager the way the broker does
// (stdin and stdout are pipes to the broker, stderr goes to the broker's
// log), reads the lines the worker writes as the broker would, and starts
// the worker again whenever it exits, which is what lets an installer
// replace the executable and stop the running process. It is a test tool:
// it imports nothing of this module and never serves a network port.
//
//	pairsupervisor --exe PATH --args FILE --lines FILE --log FILE --pidfile FILE
//
// The worker's arguments are the lines of --args, one argument a line: they
// are not in the supervisor's own command line, so an installer that finds
// the worker by its --cluster-dir argument (as the install script does)
// finds the worker and not its supervisor, as on a PAIR node.
// Every start re-reads PATH, so a replaced executable is what the next
// start runs. Each broker line the worker writes is appended to --lines
// (one line each, as read), each start and exit is a line in --log, and the
// supervisor's own pid is in --pidfile once it runs. SIGTERM or SIGINT stop
// it and the worker (the worker sees its stdin close, as when the broker
// goes away). With --watch-stdin the end of its own stdin stops it too, so
// a test that dies (and so closes the pipe) leaves no supervisor behind; and
// it stops by itself after --max-duration whatever happens.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	exe := flag.String("exe", "", "the worker executable (re-read at every start)")
	argsPath := flag.String("args", "", "the worker's arguments, one a line")
	linesPath := flag.String("lines", "", "append every line the worker writes to stdout here")
	logPath := flag.String("log", "", "append the worker's stderr and a line per start and exit here")
	pidfile := flag.String("pidfile", "", "write this supervisor's pid here once it runs")
	restartDelay := flag.Duration("restart-delay", 200*time.Millisecond, "wait this long before starting an exited worker again")
	maxDuration := flag.Duration("max-duration", 10*time.Minute, "stop by itself after this long")
	watchStdin := flag.Bool("watch-stdin", false, "stop when stdin ends (give it a pipe from the test: a test that dies closes it)")
	flag.Parse()
	if *exe == "" || *argsPath == "" || *linesPath == "" || *logPath == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "pairsupervisor: --exe, --args, --lines and --log are required, and nothing else")
		os.Exit(2)
	}
	argsText, err := os.ReadFile(*argsPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pairsupervisor:", err)
		os.Exit(1)
	}
	workerArgs := strings.Split(strings.TrimRight(string(argsText), "\n"), "\n")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *maxDuration)
	defer cancel()
	if *watchStdin {
		go func() {
			io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
	}

	lines, err := os.OpenFile(*linesPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pairsupervisor:", err)
		os.Exit(1)
	}
	defer lines.Close()
	logf, err := os.OpenFile(*logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pairsupervisor:", err)
		os.Exit(1)
	}
	defer logf.Close()
	if *pidfile != "" {
		if err := os.WriteFile(*pidfile, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "pairsupervisor:", err)
			os.Exit(1)
		}
	}
	// logMu serializes writes to the log file between the worker's stderr
	// copier and the supervisor's own lines; it is a leaf lock.
	var logMu sync.Mutex
	logLine := func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintf(logf, "pairsupervisor: "+format+"\n", args...)
	}
	for ctx.Err() == nil {
		runOnce(ctx, *exe, workerArgs, lines, logf, &logMu, logLine)
		select {
		case <-ctx.Done():
		case <-time.After(*restartDelay):
		}
	}
}

// runOnce starts the worker and waits until it exits, or until ctx ends,
// when the worker's stdin is closed (the broker going away) and, if it has
// not exited 10 s later, it is killed.
func runOnce(ctx context.Context, exe string, args []string, lines, logf io.Writer, logMu *sync.Mutex, logLine func(string, ...any)) {
	cmd := exec.Command(exe, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logLine("stdin pipe: %v", err)
		return
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logLine("stdout pipe: %v", err)
		return
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logLine("stderr pipe: %v", err)
		return
	}
	if err := cmd.Start(); err != nil {
		logLine("start %s: %v", exe, err)
		return
	}
	logLine("started pid=%d exe=%s", cmd.Process.Pid, exe)
	var copiers sync.WaitGroup
	copiers.Add(2)
	go func() {
		// The broker reads every line; the stand-in keeps them for the test.
		defer copiers.Done()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for sc.Scan() {
			fmt.Fprintf(lines, "%s\n", sc.Bytes())
		}
		io.Copy(io.Discard, stdout) // a line over the buffer: keep draining
	}()
	go func() {
		defer copiers.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for sc.Scan() {
			logMu.Lock()
			fmt.Fprintf(logf, "%s\n", sc.Bytes())
			logMu.Unlock()
		}
		io.Copy(io.Discard, stderr)
	}()
	exited := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			stdin.Close()
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
			}
		case <-exited:
		}
	}()
	copiers.Wait()
	err = cmd.Wait()
	close(exited)
	logLine("exited pid=%d: %v", cmd.Process.Pid, err)
}
