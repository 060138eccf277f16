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

// outboxEntry is one terminal frame kept until the daemon takes it. A line
// of the file is an entry, or a Done line naming the key of an entry the
// daemon took.
type outboxEntry struct {
	Key    string          `json:"key,omitempty"`
	ID     string          `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Body   json.RawMessage `json:"body,omitempty"`
	Done   string          `json:"done,omitempty"`
}

// outbox is a journal of terminal frames not yet taken by the daemon. A
// frame kept is one line appended and synced (the frame must survive a
// crash before it may be sent); a frame taken is a Done line appended
// without a sync (a lost one only makes a restarted producer send the
// frame again, which the ingress takes again and the peers deduplicate).
// When the file holds more than twice the lines it needs, or after a
// failed write, it is compacted: rewritten whole to a synced temporary file
// renamed over it, so a crash leaves the old or the new file, never half
// of one. It holds at most max entries.
type outbox struct {
	path string
	max  int
	// mu guards every field below and serializes the file's writes. Last
	// in the lock order (after a Job's and the Client's).
	mu      sync.Mutex
	f       *os.File // open for appending; nil after close or a failed write
	entries map[string]outboxEntry
	order   []string // keys, oldest first
	lines   int      // lines in the file
	torn    int64
}

// openOutbox reads the outbox at path (absent: empty) and returns it with
// the entries a previous process left. A line that is not a whole entry
// (a write cut short by a crash, damage by hand) is skipped and counted.
// The file is then compacted, so what follows is appended to whole lines.
func openOutbox(path string, max int) (*outbox, []outboxEntry, error) {
	o := &outbox{path: path, max: max, entries: map[string]outboxEntry{}}
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("wlmclient: outbox: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e outboxEntry
		switch {
		case json.Unmarshal(line, &e) != nil:
			o.torn++
		case e.Done != "":
			o.dropLocked(e.Done)
		case e.Key == "" || e.Method == "" || !json.Valid(e.Body):
			o.torn++
		default:
			if _, dup := o.entries[e.Key]; !dup && len(o.order) < max {
				o.entries[e.Key] = e
				o.order = append(o.order, e.Key)
			}
		}
	}
	if sc.Err() != nil {
		o.torn++
	}
	o.mu.Lock()
	err = o.compactLocked()
	o.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	found := make([]outboxEntry, 0, len(o.order))
	for _, k := range o.order {
		found = append(found, o.entries[k])
	}
	return o, found, nil
}

// add keeps e, synced, or returns errOutboxFull.
func (o *outbox) add(e outboxEntry) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.order) >= o.max {
		return errOutboxFull
	}
	o.entries[e.Key] = e
	o.order = append(o.order, e.Key)
	return o.appendLocked(e, true)
}

// remove forgets the entry under key.
func (o *outbox) remove(key string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.dropLocked(key) {
		return nil
	}
	if o.lines > 2*len(o.order)+16 {
		return o.compactLocked()
	}
	return o.appendLocked(outboxEntry{Done: key}, false)
}

// dropLocked forgets key in memory and reports whether it was held.
func (o *outbox) dropLocked(key string) bool {
	if _, ok := o.entries[key]; !ok {
		return false
	}
	delete(o.entries, key)
	for i, k := range o.order {
		if k == key {
			o.order = append(o.order[:i], o.order[i+1:]...)
			break
		}
	}
	return true
}

// stats returns the entries held and the lines skipped at open.
func (o *outbox) stats() (pending, torn int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return int64(len(o.order)), o.torn
}

// close closes the file; what it holds is read by the next openOutbox.
func (o *outbox) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.f != nil {
		o.f.Close()
		o.f = nil
	}
}

// appendLocked appends e as one line, synced when sync is set. After a
// failed write the file may end in part of a line, so it is compacted
// instead (the whole state rewritten) rather than appended to.
func (o *outbox) appendLocked(e outboxEntry, sync bool) error {
	if o.f == nil {
		return o.compactLocked()
	}
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = o.f.Write(append(line, '\n'))
	if err == nil && sync {
		err = o.f.Sync()
	}
	if err != nil {
		o.f.Close()
		o.f = nil
		if cerr := o.compactLocked(); cerr != nil {
			return fmt.Errorf("wlmclient: outbox: %w", errors.Join(err, cerr))
		}
		return nil
	}
	o.lines++
	return nil
}

// compactLocked replaces the file with the entries held, atomically, and
// reopens it for appending. The file is closed first: Windows cannot
// rename over an open file.
func (o *outbox) compactLocked() error {
	if o.f != nil {
		o.f.Close()
		o.f = nil
	}
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
	f, err := os.OpenFile(o.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("wlmclient: outbox: %w", err)
	}
	o.f, o.lines = f, len(o.order)
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
