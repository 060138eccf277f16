package main

import (
	"container/list"
	"sync"
	"sync/atomic"
)

// dedupCapacity bounds the keys the peer server remembers.
const dedupCapacity = 10000

// dedup remembers the events already written to the broker, so that an event
// that reaches this node by several deliveries (a retry, a re-broadcast
// after a restart) shows up at the broker once.
//
// A key is recorded only after its write succeeded, so a failed write can be
// retried by the sender. Concurrent deliveries of one key are serialized
// through that write by a per-key lock, so two racing duplicates never both
// reach the broker.
type dedup struct {
	capacity int

	// mu guards order, index and inflight. It is a leaf lock and is never
	// held across the broker write.
	mu       sync.Mutex
	order    *list.List               // front = most recently seen key
	index    map[string]*list.Element // key -> element in order
	inflight map[string]*keyLock

	hits atomic.Uint64 // duplicates not written, for the metrics
}

// keyLock serializes the deliveries of one key. refs counts the deliveries
// holding or waiting for it, so the entry is dropped by the last one out.
type keyLock struct {
	mu   sync.Mutex
	refs int
}

func newDedup(capacity int) *dedup {
	return &dedup{
		capacity: capacity,
		order:    list.New(),
		index:    make(map[string]*list.Element),
		inflight: make(map[string]*keyLock),
	}
}

// deliverOnce calls write unless key was already delivered. It reports
// whether the key was a duplicate, and write's error, in which case the key
// stays unrecorded.
func (d *dedup) deliverOnce(key string, write func() error) (duplicate bool, err error) {
	kl := d.lockKey(key)
	defer d.unlockKey(key, kl)
	if d.seen(key) {
		d.hits.Add(1)
		return true, nil
	}
	if err := write(); err != nil {
		return false, err
	}
	d.record(key)
	return false, nil
}

func (d *dedup) lockKey(key string) *keyLock {
	d.mu.Lock()
	kl := d.inflight[key]
	if kl == nil {
		kl = &keyLock{}
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
	if kl.refs--; kl.refs == 0 {
		delete(d.inflight, key)
	}
	d.mu.Unlock()
}

// seen reports whether key was recorded, refreshing its recency.
func (d *dedup) seen(key string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.index[key]; ok {
		d.order.MoveToFront(e)
		return true
	}
	return false
}

func (d *dedup) record(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.index[key]; ok {
		d.order.MoveToFront(e)
		return
	}
	d.index[key] = d.order.PushFront(key)
	for d.order.Len() > d.capacity {
		oldest := d.order.Back()
		d.order.Remove(oldest)
		delete(d.index, oldest.Value.(string))
	}
}

// len returns the number of remembered keys.
func (d *dedup) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.order.Len()
}
