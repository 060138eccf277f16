package peerserver

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"sync"
	"sync/atomic"

	"nvpair-workload-manager/internal/wireframe"
)

// DedupCapacity bounds the keys the peer server remembers.
const DedupCapacity = 10000

// dedupDigest is a dedup key as the dedup holds it: the SHA-256 of the
// key's fields (digestKey). Stored as a fixed-size array, not
// as the fields or a string of them, it makes every remembered key cost the
// same bytes whatever the frame carried, so the dedup is bounded in bytes
// by its capacity.
type dedupDigest [sha256.Size]byte

// DedupEntryBytes is the estimated heap one remembered key costs: its
// entry (dedupEntry, 44 bytes; the slice of them grows by doubling to the
// capacity, so up to twice that while it grows) and its share of the index
// map, whose slots hold a digest and an index (36 bytes, and a control
// byte) at a load that falls to about half when the map grows. Measured
// over fills from 500 to 10,000 keys the cost is 57 to 164 bytes a key
// (110 when full; the most just after the slice and the map double); the
// estimate, the metric's and the spec's, stays the 192 that bounded the
// list the entries replaced.
// TestDedupMemoryIsBoundedInBytesWithMaximumLengthFields checks it.
const DedupEntryBytes = 192

// DedupMaxBytes bounds the heap the dedup's keys hold: 1.92 MB at the
// default capacity, whatever the frames carried.
const DedupMaxBytes = DedupCapacity * DedupEntryBytes

// dedup remembers the events already written to the broker, so that an event
// that reaches this node by several deliveries (a retry, a re-broadcast
// after a restart) shows up at the broker once.
//
// A key is recorded only after its write succeeded, so a failed write can be
// retried by the sender. Concurrent deliveries of one key are serialized
// through that write by a per-key lock, so two racing duplicates never both
// reach the broker. A peer's frames take the lock of their workload id
// (idRemovalKey), whatever their key, so every frame of one workload is
// written, recorded and forgotten in one order.
//
// A removal's key is its workload alone, so it says "the broker's last word
// on this workload from here was its removal". It stays true only until a
// lifecycle frame of the workload is written: that write forgets the
// workload's removal key (deliverLifecycle), and the next removal of a
// reused id is new rather than a duplicate of the first (spec 3.3,
// "Removals that repeat").
type dedup struct {
	capacity int

	// mu guards entries, the list through them, free, index and inflight.
	// It is a leaf lock and is never held across the broker write; the
	// per-key locks are taken outside it and it is taken under them
	// (order: per-key lock -> dedup.mu).
	mu sync.Mutex
	// entries are the remembered keys, in recency order through their
	// links: front is the most recently seen, back the first to go. They
	// hold no pointer and neither does index, so the collector has nothing
	// to scan in them, and recording a key allocates nothing once the
	// slice has grown to the keys held (a list element and a boxed digest
	// each before, two allocations a frame).
	entries     []dedupEntry
	front, back int32                 // -1: none
	n           int                   // keys remembered
	free        int32                 // a slot forgotten, linked through next; -1: none
	index       map[dedupDigest]int32 // key -> its slot in entries
	// inflight holds the per-key locks by the workload id itself (the
	// frame's own string, not a copy): a lock needs no digest, since the
	// map holds only the frames in flight, not what was remembered, and it
	// compares whole ids, so two ids never share a lock.
	inflight map[string]*keyLock
	// removals counts the removal keys in order. Written under mu, read
	// without it by a lifecycle frame under its workload's lock: while it
	// holds that lock no removal key of its workload is recorded, so a
	// count of 0 read then means it has none to forget, and it skips their
	// digests (two SHA-256 of the three a frame would cost).
	removals atomic.Int64

	hits atomic.Uint64 // duplicates not written, for the metrics
}

// dedupEntry is one remembered key and its links in recency order, as
// indices into dedup.entries (-1: none).
type dedupEntry struct {
	key        dedupDigest
	prev, next int32
	removal    bool // a removal's key (dedup.removals counts them)
}

// keyLock serializes the deliveries of one key. refs counts the deliveries
// holding or waiting for it, so the entry is dropped by the last one out.
type keyLock struct {
	mu   sync.Mutex
	refs int
}

// keyLocks recycles the per-key locks: one is needed for every frame in
// flight, and none is referenced once its count is back to zero and it is
// out of the in-flight map (both under dedup.mu).
var keyLocks = sync.Pool{New: func() any { return new(keyLock) }}

func newDedup(capacity int) *dedup {
	return &dedup{
		capacity: capacity,
		front:    -1,
		back:     -1,
		free:     -1,
		index:    make(map[dedupDigest]int32),
		inflight: make(map[string]*keyLock),
	}
}

// deliverRemoval calls write for a peer's removal unless the same removal
// was delivered with no lifecycle frame of its workload delivered since.
func (d *dedup) deliverRemoval(r *wireframe.Removal, write func() error) (duplicate bool, err error) {
	return d.deliverUnder(r.Ref.ID, removalDedupKey(r), true, write)
}

// deliverUnder calls write unless key was already delivered, serializing
// the deliveries on lock. It reports whether the key was a duplicate, and
// write's error, in which case the key stays unrecorded; removal says key
// is a removal's.
func (d *dedup) deliverUnder(lock string, key dedupDigest, removal bool, write func() error) (duplicate bool, err error) {
	kl := d.lockKey(lock)
	defer d.unlockKey(lock, kl)
	if d.seen(key) {
		d.hits.Add(1)
		return true, nil
	}
	if err := write(); err != nil {
		return false, err
	}
	d.record(key, removal)
	return false, nil
}

// deliverLifecycle calls write for a peer's lifecycle frame unless it was
// delivered already; a re-assertion is always written and never recorded
// (spec 3.3). Once written, the frame forgets its workload's removal keys:
// the workload is live at the broker again, so its next removal must reach
// the broker whether or not an earlier one did. Both removal keys a frame
// of (origin, id) may have been preceded by are forgotten: (origin, id)'s
// and ("", id)'s, the key of a removal without originatedFrom, which
// upstream sends for a workload of any origin.
//
// The write and the forgetting happen under the workload id's lock, the one
// a removal of the id is checked and written under, so the dedup's view of
// "a lifecycle frame came after the removal" follows the order the broker
// got them in: a removal that finds its key still held was decided before
// the lifecycle frame's write began, and the broker then applies the
// lifecycle frame after it, as it would had the removal been written.
func (d *dedup) deliverLifecycle(e *wireframe.Lifecycle, write func() error) (duplicate bool, err error) {
	ref := e.Ref()
	var key dedupDigest
	if !e.Resync {
		key = lifecycleDedupKey(e)
	}
	kl := d.lockKey(ref.ID)
	defer d.unlockKey(ref.ID, kl)
	if !e.Resync && d.seen(key) {
		d.hits.Add(1)
		return true, nil
	}
	if err := write(); err != nil {
		return false, err
	}
	var forget [2]dedupDigest
	held := d.removals.Load() > 0 // see removals: read under ref.ID's lock
	if held {
		forget = [2]dedupDigest{refDedupKey(ref), idRemovalKey(ref.ID)}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !e.Resync {
		d.recordLocked(key, false)
	}
	if held {
		for _, k := range forget {
			d.forgetLocked(k)
		}
	}
	return false, nil
}

func (d *dedup) lockKey(key string) *keyLock {
	d.mu.Lock()
	kl := d.inflight[key]
	if kl == nil {
		kl = keyLocks.Get().(*keyLock)
		d.inflight[key] = kl
	}
	kl.refs++
	d.mu.Unlock()
	kl.mu.Lock()
	return kl
}

func (d *dedup) unlockKey(key string, kl *keyLock) {
	kl.mu.Unlock()
	d.mu.Lock()
	free := false
	if kl.refs--; kl.refs == 0 {
		delete(d.inflight, key)
		free = true
	}
	d.mu.Unlock()
	if free {
		keyLocks.Put(kl)
	}
}

// seen reports whether key was recorded, refreshing its recency.
func (d *dedup) seen(key dedupDigest) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if i, ok := d.index[key]; ok {
		d.moveToFrontLocked(i)
		return true
	}
	return false
}

// record remembers key; removal says it is a removal's.
func (d *dedup) record(key dedupDigest, removal bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.recordLocked(key, removal)
}

// recordLocked is record with mu held.
func (d *dedup) recordLocked(key dedupDigest, removal bool) {
	if i, ok := d.index[key]; ok {
		d.moveToFrontLocked(i)
		return
	}
	if d.n >= d.capacity {
		d.dropLocked(d.back) // its slot is the one taken below
	}
	i := d.slotLocked()
	d.entries[i] = dedupEntry{key: key, prev: -1, next: -1, removal: removal}
	d.pushFrontLocked(i)
	d.index[key] = i
	d.n++
	if removal {
		d.removals.Add(1)
	}
}

// slotLocked returns a free slot of entries: one forgotten, else a new one
// at the end. The slice grows by doubling up to the capacity, never past
// it: it holds at most capacity keys.
func (d *dedup) slotLocked() int32 {
	if i := d.free; i >= 0 {
		d.free = d.entries[i].next
		return i
	}
	if len(d.entries) == cap(d.entries) {
		grown := make([]dedupEntry, len(d.entries), min(max(64, 2*cap(d.entries)), d.capacity))
		copy(grown, d.entries)
		d.entries = grown
	}
	d.entries = append(d.entries, dedupEntry{})
	return int32(len(d.entries) - 1)
}

// pushFrontLocked links slot i, unlinked, at the front.
func (d *dedup) pushFrontLocked(i int32) {
	e := &d.entries[i]
	e.prev, e.next = -1, d.front
	if d.front >= 0 {
		d.entries[d.front].prev = i
	} else {
		d.back = i
	}
	d.front = i
}

// unlinkLocked takes slot i out of the recency order.
func (d *dedup) unlinkLocked(i int32) {
	e := &d.entries[i]
	if e.prev >= 0 {
		d.entries[e.prev].next = e.next
	} else {
		d.front = e.next
	}
	if e.next >= 0 {
		d.entries[e.next].prev = e.prev
	} else {
		d.back = e.prev
	}
	e.prev, e.next = -1, -1
}

// moveToFrontLocked makes the key in slot i the most recently seen.
func (d *dedup) moveToFrontLocked(i int32) {
	if d.front != i {
		d.unlinkLocked(i)
		d.pushFrontLocked(i)
	}
}

// forgetLocked drops key, if remembered. Called with mu held.
func (d *dedup) forgetLocked(key dedupDigest) {
	if i, ok := d.index[key]; ok {
		d.dropLocked(i)
	}
}

// dropLocked removes the key in slot i, counting a removal's out, and
// frees the slot. Called with mu held.
func (d *dedup) dropLocked(i int32) {
	d.unlinkLocked(i)
	e := &d.entries[i]
	if e.removal {
		d.removals.Add(-1)
	}
	delete(d.index, e.key)
	*e = dedupEntry{prev: -1, next: d.free}
	d.free = i
	d.n--
}

// len returns the number of remembered keys.
func (d *dedup) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// bytes estimates the heap the remembered keys hold, for the metrics:
// DedupEntryBytes per key, at most DedupMaxBytes at the default capacity.
func (d *dedup) bytes() int { return d.len() * DedupEntryBytes }

// lifecycleDedupKey is the key peers deduplicate a lifecycle event on.
func lifecycleDedupKey(e *wireframe.Lifecycle) dedupDigest {
	i := &e.Info
	// The seq's decimal text, made on the stack: FormatInt allocates it
	// for every seq from 100 up, once a frame.
	var buf [20]byte
	var seq []byte
	if i.HasSeq {
		seq = strconv.AppendInt(buf[:0], i.Seq, 10)
	}
	return digestKey("L", i.OriginatedFrom, i.Engine, i.RunID, i.ID, i.State, i.ScheduledOn, string(seq))
}

// removalDedupKey is the key peers deduplicate a removal on: its workload,
// ("", id) for a removal without originatedFrom.
func removalDedupKey(r *wireframe.Removal) dedupDigest { return refDedupKey(r.Ref) }

// refDedupKey is the removal key of the workload ref.
func refDedupKey(ref wireframe.WorkloadRef) dedupDigest { return digestKey("R", ref.Origin, ref.ID) }

// idRemovalKey is the key of a removal of id without originatedFrom,
// ("", id), which every lifecycle frame of id forgets. Every peer frame of
// id is delivered under the lock of id alone (dedup.inflight), not of the
// origin with it, so that such a removal is serialized with the lifecycle
// frames that forget its key; ids that two origins share only wait on each
// other's writes.
func idRemovalKey(id string) dedupDigest { return refDedupKey(wireframe.WorkloadRef{ID: id}) }

// digestKey is the SHA-256 of the parts, each preceded by its length as
// eight big-endian bytes, so that no two tuples share an encoding and no
// two share a digest short of a SHA-256 collision. The dedup stores the
// digest, 32 bytes whatever the parts hold.
func digestKey(parts ...string) dedupDigest {
	n := 0
	for _, p := range parts {
		n += 8 + len(p)
	}
	var stack [1024]byte // the bounded fields of a key fit: no allocation
	b := stack[:0]
	if n > len(stack) {
		b = make([]byte, 0, n)
	}
	for _, p := range parts {
		b = binary.BigEndian.AppendUint64(b, uint64(len(p)))
		b = append(b, p...)
	}
	return sha256.Sum256(b)
}
