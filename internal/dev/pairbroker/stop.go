package pairbroker

import "time"

// The stop sequence of PAIR's broker (waitForStdinClose in its
// services/nvpair-ui-broker/stopwait.go, not in ../shared/upstream): a
// worker's closed stdin is its shutdown signal; one that has not exited
// after StopGrace is terminated, and one that has not exited SignalGrace
// after that is killed, and waited for SignalGrace more.
const (
	StopGrace   = 3 * time.Second
	SignalGrace = 2 * time.Second
)

// StopResult says how far the stop sequence had to go.
type StopResult int

const (
	ExitedOnEOF     StopResult = iota // it exited within StopGrace of its closed stdin
	ExitedOnTerm                      // it needed the terminate
	Killed                            // it needed the kill, and exited
	SurvivedTheKill                   // it had not exited SignalGrace after the kill
)

func (r StopResult) String() string {
	switch r {
	case ExitedOnEOF:
		return "exited on its closed stdin"
	case ExitedOnTerm:
		return "exited only when terminated"
	case Killed:
		return "killed"
	}
	return "still running after the kill"
}

// Stop runs the stop sequence on a worker: closeStdin, up to grace for
// done, terminate, up to SignalGrace, kill, up to SignalGrace. A caller
// passes StopGrace as grace unless it has reason to shorten it (a test).
// The actions' errors are ignored, as PAIR's broker logs and goes on: the
// wait on done decides.
func Stop(closeStdin, terminate, kill func() error, done <-chan struct{}, grace time.Duration) StopResult {
	closeStdin()
	if waitDone(done, grace) {
		return ExitedOnEOF
	}
	terminate()
	if waitDone(done, SignalGrace) {
		return ExitedOnTerm
	}
	kill()
	if waitDone(done, SignalGrace) {
		return Killed
	}
	return SurvivedTheKill
}

func waitDone(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
