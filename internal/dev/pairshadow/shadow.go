package pairshadow

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"time"
)

// Shadow is one running store program: one PAIR store, driven the way
// PAIR's broker drives it. Its methods are safe for concurrent use; the
// commands reach the store in the order the calls were made.
type Shadow struct {
	mu    sync.Mutex // guards everything below, and orders the commands
	cmd   *exec.Cmd
	stdin io.WriteCloser
	enc   *json.Encoder
	w     *bufio.Writer
	r     *bufio.Reader
	err   error // the first failure: every later call returns it
	done  bool  // Close has run
}

// command is one line to the program (_storeproc/main.go reads it).
type command struct {
	Op         string          `json:"op"`
	Now        int64           `json:"now"` // Unix nanoseconds
	Info       json.RawMessage `json:"info,omitempty"`
	Origin     string          `json:"origin,omitempty"`
	ID         string          `json:"id,omitempty"`
	Node       string          `json:"node,omitempty"`
	Reason     string          `json:"reason,omitempty"`
	StaleAfter int64           `json:"staleAfter,omitempty"` // nanoseconds
	WindowMs   int64           `json:"windowMs,omitempty"`
}

// Start runs the program bin (as Build returns it) with an empty store.
func Start(bin string) (*Shadow, error) {
	cmd := exec.Command(bin)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting PAIR's workload store program: %w", err)
	}
	s := &Shadow{cmd: cmd, stdin: stdin, w: bufio.NewWriter(stdin), r: bufio.NewReader(stdout)}
	s.enc = json.NewEncoder(s.w)
	// The workload objects must reach the store byte for byte as the model
	// got them, so that the two Jobs lists compare as bytes: no HTML
	// escaping of <, > and &.
	s.enc.SetEscapeHTML(false)
	return s, nil
}

// Upsert is the broker's workloads:upsert: ParseIncoming, then Apply.
func (s *Shadow) Upsert(now time.Time, info json.RawMessage) {
	s.send(command{Op: "upsert", Now: now.UnixNano(), Info: info})
}

// Remove is the broker's workloads:remove: Remove(originatedFrom, workloadId).
func (s *Shadow) Remove(now time.Time, origin, id string) {
	s.send(command{Op: "remove", Now: now.UnixNano(), Origin: origin, ID: id})
}

// FailNode is the broker's node-loss inference: ApplyInferred of a failure
// for each of ActiveForNode(node).
func (s *Shadow) FailNode(now time.Time, node, reason string) {
	s.send(command{Op: "failnode", Now: now.UnixNano(), Node: node, Reason: reason})
}

// Sweep is the broker's staleness sweep: StaleForeign(self, staleAfter),
// each failure merged with ApplyInferredUnchangedSince.
func (s *Shadow) Sweep(now time.Time, self string, staleAfter time.Duration, reason string) {
	s.send(command{Op: "sweep", Now: now.UnixNano(), Node: self, StaleAfter: int64(staleAfter), Reason: reason})
}

// Reset replaces the store with an empty one.
func (s *Shadow) Reset() { s.send(command{Op: "reset"}) }

// Snapshot returns the store's Snapshot().
func (s *Shadow) Snapshot(now time.Time) ([]json.RawMessage, error) {
	return s.query(command{Op: "snapshot", Now: now.UnixNano()})
}

// Replay returns the workload objects of ReplayForNode(node, window).
func (s *Shadow) Replay(now time.Time, node string, window time.Duration) ([]json.RawMessage, error) {
	return s.query(command{Op: "replay", Now: now.UnixNano(), Node: node, WindowMs: window.Milliseconds()})
}

func (s *Shadow) send(c command) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writeLocked(c)
}

func (s *Shadow) writeLocked(c command) {
	if s.err != nil {
		return
	}
	if err := s.enc.Encode(c); err != nil {
		s.err = fmt.Errorf("PAIR's workload store program: %s: %w", c.Op, err)
	}
}

func (s *Shadow) query(c command) ([]json.RawMessage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writeLocked(c)
	if s.err == nil {
		if err := s.w.Flush(); err != nil {
			s.err = fmt.Errorf("PAIR's workload store program: %w", err)
		}
	}
	if s.err != nil {
		return nil, s.err
	}
	line, err := s.r.ReadBytes('\n')
	var a struct {
		Infos []json.RawMessage `json:"infos"`
		Error string            `json:"error"`
	}
	switch {
	case err != nil:
		s.err = fmt.Errorf("PAIR's workload store program stopped answering: %w", err)
	case json.Unmarshal(line, &a) != nil:
		s.err = fmt.Errorf("PAIR's workload store program answered %.200q", line)
	case a.Error != "":
		s.err = errors.New("PAIR's workload store program: " + a.Error)
	}
	return a.Infos, s.err
}

// Close ends the program (its closed stdin) and waits for it.
func (s *Shadow) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return s.err
	}
	s.done = true
	s.w.Flush()
	s.stdin.Close()
	err := s.cmd.Wait()
	if s.err == nil && err != nil {
		s.err = fmt.Errorf("PAIR's workload store program: %w", err)
	}
	return s.err
}
