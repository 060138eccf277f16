package wlmclient

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// errOutboxFull is a terminal frame the outbox had no room for.
var errOutboxFull = errors.New("wlmclient: outbox full")

// outboxEntry is one terminal frame kept until the daemon takes it. The
// file holds one entry per line as JSON.
type outboxEntry struct {
	Key    string          `json:"key"`
	ID     string          `json:"id"`
	Method string          `json:"method"`
	Body   json.RawMessage `json:"body"`
}

// outbox is a file of terminal frames not yet taken by the daemon. Every
// change rewrites the file whole, to a temporary file in the same directory
// that is synced and renamed over it, so a crash leaves the old file or the
// new one, never half of one; it is bounded (max entries), so a rewrite is
// at most max frames of at most the daemon's body cap.
type outbox struct {
	path string
	max  int
	// mu guards entries, order and torn, and serializes the file's
	// rewrites. Last in the lock order (after a Job's and the Client's).
	mu      sync.Mutex
	entries map[string]outboxEntry
	order   []string // keys, oldest first
	torn    int64
}

// openOutbox reads the outbox at path (absent: empty) and returns it with
// the entries a previous process left. A line that is not a whole entry
// (a file cut short, damaged by hand) is skipped and counted; the file is
// then rewritten clean.
func openOutbox(path string, max int) (*outbox, []outboxEntry, error) {
	o := &outbox{path: path, max: max, entries: map[string]outboxEntry{}}
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("wlmclient: outbox: %w", err)
	}
	var found []outboxEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e outboxEntry
		if json.Unmarshal(line, &e) != nil || e.Key == "" || e.Method == "" || !json.Valid(e.Body) {
			o.torn++
			continue
		}
		if _, dup := o.entries[e.Key]; dup || len(o.order) >= max {
			continue
		}
		o.entries[e.Key] = e
		o.order = append(o.order, e.Key)
		found = append(found, e)
	}
	if sc.Err() != nil {
		o.torn++
	}
	if o.torn > 0 {
		o.mu.Lock()
		err := o.writeLocked()
		o.mu.Unlock()
		if err != nil {
			return nil, nil, err
		}
	}
	return o, found, nil
}

// add keeps e, or returns errOutboxFull.
func (o *outbox) add(e outboxEntry) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.order) >= o.max {
		return errOutboxFull
	}
	o.entries[e.Key] = e
	o.order = append(o.order, e.Key)
	return o.writeLocked()
}

// remove forgets the entry under key.
func (o *outbox) remove(key string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.entries[key]; !ok {
		return nil
	}
	delete(o.entries, key)
	for i, k := range o.order {
		if k == key {
			o.order = append(o.order[:i], o.order[i+1:]...)
			break
		}
	}
	return o.writeLocked()
}

// stats returns the entries held and the lines skipped at open.
func (o *outbox) stats() (pending, torn int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return int64(len(o.order)), o.torn
}

// writeLocked replaces the file with the entries, atomically. o.mu is held.
func (o *outbox) writeLocked() error {
	var buf bytes.Buffer
	for _, k := range o.order {
		line, err := json.Marshal(o.entries[k])
		if err != nil {
			return err
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	dir := filepath.Dir(o.path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(o.path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("wlmclient: outbox: %w", err)
	}
	_, werr := tmp.Write(buf.Bytes())
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("wlmclient: outbox: %w", err)
	}
	if err := os.Rename(tmp.Name(), o.path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("wlmclient: outbox: %w", err)
	}
	syncDir(dir)
	return nil
}

// syncDir makes a rename in dir durable where the platform allows it
// (Windows cannot open a directory for syncing; its rename is durable as
// NTFS journals it).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
