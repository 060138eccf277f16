package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

// The outboxes of `nvpair-wlm run`. A run's end is a terminal frame the
// client keeps in an outbox file until the daemon takes it
// (Config.OutboxPath), so that a command that ends while the ingress is
// down still shows its end once the ingress is back. The client's outbox
// is one process's (it rewrites the file whole), so each run has its own,
// <pid>-<random>.jsonl in one directory, removed when empty at its exit.
// A file whose process is gone holds ends nobody sends: the next run (or
// `nvpair-wlm flush`) claims it by renaming it to a name of its own (one
// rename wins, so no two processes send it) and sends it with a client of
// its own.

// outboxName is the name of a run's outbox: its process id, and random
// bits so that a pid reused later never names the same file.
var outboxName = regexp.MustCompile(`^([0-9]+)-[0-9a-f]{16}\.jsonl$`)

// maxClaims bounds the orphaned outboxes one process takes on: each is a
// client of its own until the process ends.
const maxClaims = 16

// newOutboxPath returns a fresh outbox path in dir for this process.
func newOutboxPath(dir string) string {
	var b [8]byte
	rand.Read(b[:])
	return filepath.Join(dir, fmt.Sprintf("%d-%s.jsonl", os.Getpid(), hex.EncodeToString(b[:])))
}

// outboxSet is the clients of the orphaned outboxes a process claimed.
type outboxSet struct {
	mu      sync.Mutex
	clients map[string]*wlmclient.Client // by path
}

// claimOrphans claims up to maxClaims outboxes in dir whose process is
// gone and starts a client on each, which sends what it holds at once.
func claimOrphans(dir string, cfg wlmclient.Config, log *slog.Logger) *outboxSet {
	set := &outboxSet{clients: map[string]*wlmclient.Client{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return set
	}
	for _, e := range entries {
		if len(set.clients) >= maxClaims {
			break
		}
		m := outboxName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		mine := newOutboxPath(dir)
		if err := os.Rename(filepath.Join(dir, e.Name()), mine); err != nil {
			continue // another process claimed it first
		}
		c := cfg
		c.OutboxPath = mine
		client, err := wlmclient.New(c)
		if err != nil {
			log.Warn("nvpair-wlm: an earlier run's outbox not read", "path", mine, "err", err)
			continue
		}
		set.clients[mine] = client
	}
	return set
}

// close flushes every claimed outbox within ctx and removes those that
// were emptied; the rest stay for a later claim.
func (s *outboxSet) close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for path, c := range s.clients {
		errs = append(errs, closeOutbox(ctx, c, path))
	}
	s.clients = nil
	return errors.Join(errs...)
}

// closeOutbox closes c within ctx and removes its outbox at path when it
// holds nothing more.
func closeOutbox(ctx context.Context, c *wlmclient.Client, path string) error {
	err := c.Close(ctx)
	if c.Stats().OutboxPending == 0 {
		os.Remove(path)
	}
	return err
}
