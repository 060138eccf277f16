package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

// deadPID is the id of a process that has ended.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// orphan leaves an outbox in dir as a run whose process is gone leaves it:
// one failed job the ingress never took.
func orphan(t *testing.T, dir string, pid, i int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	path := filepath.Join(dir, fmt.Sprintf("%d-%016x.jsonl", pid, i))
	c, err := wlmclient.New(wlmclient.Config{Addr: gone, OutboxPath: path, Lease: -1, BackoffMin: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	job, err := c.Submit(context.Background(), wlmclient.JobSpec{ID: fmt.Sprintf("orphan-%d", i), Model: "m", Engine: "command"})
	if err != nil {
		t.Fatal(err)
	}
	job.Fail("the command exited with status 1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	c.Close(ctx)
}

func TestFlushTakesAtMost16OutboxesAtATimeAndSendsWhatTheyHold(t *testing.T) {
	in := &ingress{readBack: []map[string]any{}}
	srv := httptest.NewServer(in)
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	pid := deadPID(t)
	for i := range maxClaims + 4 {
		orphan(t, dir, pid, i)
	}
	os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d-%016x.jsonl", os.Getpid(), 99)), nil, 0o600) // a live process's: not taken
	var out, errb bytes.Buffer
	if code := flushMain([]string{"--addr", addr, "--outbox-dir", dir, "--wait", "10s"}, &out, &errb); code != 0 {
		t.Fatalf("flush exited %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), fmt.Sprintf("%d outbox(es) sent", maxClaims)) || in.count() != maxClaims {
		t.Fatalf("the first flush: %q, %d frames sent; want %d of each", out.String(), in.count(), maxClaims)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if len(left) != 5 {
		t.Fatalf("%d files left, want the 4 not taken and the live process's", len(left))
	}
	out.Reset()
	flushMain([]string{"--addr", addr, "--outbox-dir", dir, "--wait", "10s"}, &out, &errb)
	if in.count() != maxClaims+4 {
		t.Fatalf("after the second flush %d frames sent, want %d", in.count(), maxClaims+4)
	}
	for i := range maxClaims + 4 {
		if fs := in.of(fmt.Sprintf("orphan-%d", i)); len(fs) != 1 || fs[0].Info["state"] != "failed" {
			t.Errorf("orphan %d: %+v", i, fs)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.jsonl")); len(left) != 1 {
		t.Errorf("%d files left, want only the live process's", len(left))
	}
}
