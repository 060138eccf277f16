package main

import (
	"context"
	"testing"
)

func TestHeartbeatLaneWakesWhenTheLastUndispatchedFrameIsGone(t *testing.T) {
	// The fresh lane settles a frame before the dispatcher has counted it
	// out: the heartbeat lane, woken by the settle, finds the frame still
	// undispatched and waits again. The dispatcher's count-out must wake it,
	// or it waits until this peer's next frame, on a quiet node forever.
	b := &broadcaster{peers: map[string]*peerSender{}}
	o := newLaneOrder(&b.undispatched, newOverflowMarks(1))
	b.peers["p"] = &peerSender{lanes: o}
	b.reserve() // a frame on its way through the dispatcher
	o.queued()  // offered to this peer
	o.settled(1)
	done := make(chan bool, 1)
	go func() { done <- o.awaitFreshIdle(context.Background()) }()
	eventually(t, "the settle's wakeup taken by the waiting lane", func() bool { return len(o.idle) == 0 })
	b.mu.Lock()
	b.dispatchedLocked()
	b.mu.Unlock()
	eventually(t, "the heartbeat lane woken", func() bool {
		select {
		case ok := <-done:
			return ok
		default:
			return false
		}
	})
}
