package brokerio

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/promtext"
	"nvpair-workload-manager/internal/ratelog"
)

// Broker stalls are bounded (spec 7). The broker writer blocks while the
// broker does not read its stdout: the broker is the daemon's parent and
// there is nowhere else to put its frames. Every peer or ingress request
// that reached its broker write then holds a goroutine and a connection
// until the broker reads again, and without a bound a stalled broker lets
// any number of them pile up. So each of the two channels lets at most
// WaitersMax requests wait on the broker at once; one more waits
// briefly for a slot (WaiterPatience) and is then answered 503 with
// Retry-After, its connection closed, nothing
// written, deduplicated or tracked. The stdio read loop's own writes (its
// answers to the broker's requests) are not requests and are never refused.

// WaitersMax is how many requests of one channel (the peer port, the
// ingress) may wait on the broker at once. A healthy broker rarely leaves
// that many waiting (a write takes microseconds, and waiting frames go up
// together), a larger burst queues for its patience, and a stall is kept
// to some 128 goroutines and connections, a few megabytes, whatever the
// senders do. Each channel has its own, so a flood on one cannot refuse the
// other while the broker reads.
const WaitersMax = 64

// BusyRetryAfter is the Retry-After of a refusal, in seconds: a
// stall the broker ends is over within a write, and a sender retrying
// sooner than a second would only be refused again.
const BusyRetryAfter = 1

// Waiters is a counting semaphore of the requests of one channel
// that wait on the broker: a slot is taken before anything else the
// request waits for on the way to the broker write (the ingress's
// ingestMu, the dedup's per-key lock, the writer's mutex, the group ahead
// of its own) and given back when the request is done with the broker. Taking a slot never waits.
type Waiters struct {
	channel string        // "peer" or "ingress", for the metrics and the reason
	slots   chan struct{} // one element per request waiting; capacity is the bound
	refused atomic.Uint64 // requests answered 503 because every slot was taken
	log     ratelog.Burst // refusals, at most one line per ratelog.Interval
}

func NewWaiters(channel string, limit int) *Waiters {
	return &Waiters{channel: channel, slots: make(chan struct{}, limit)}
}

// WaiterPatience is how long a request waits for a slot when every
// slot is taken. A broker that reads frees a slot within a write (group
// commit writes the waiting frames together), so a burst of posts beyond
// the bound, 128 producers at once, say, is a short queue and not a flood
// of refusals and reconnections; a broker that does not read frees none,
// and the request is refused after this wait, which a stall makes no
// longer than it is. The waiting request holds its goroutine and its
// connection for that long: both are bounded by the listener's connection
// cap.
const WaiterPatience = 250 * time.Millisecond

// Acquire takes a slot, waiting up to WaiterPatience for one, or less
// when ctx is done (the request's client went away; nil for a request that
// cannot go), and reports whether it did; a request that gets none is
// counted as refused and must be answered with BusyError. ctx's Done is
// asked for only when the request has to wait: a request's context makes
// its channel when first asked, an allocation a frame that a free slot
// does not need.
func (b *Waiters) Acquire(ctx context.Context) bool {
	select {
	case b.slots <- struct{}{}:
		return true
	default:
	}
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	wait := time.NewTimer(WaiterPatience)
	defer wait.Stop()
	select {
	case b.slots <- struct{}{}:
		return true
	case <-wait.C:
	case <-done:
	}
	b.refused.Add(1)
	return false
}

// release gives back a slot taken by acquire.
func (b *Waiters) Release() { <-b.slots }

// waiting is how many requests hold a slot now.
func (b *Waiters) Waiting() int { return len(b.slots) }

// BusyError is a request refused because its channel's slots were all
// taken: 503 with Retry-After.
type BusyError struct {
	channel string
	limit   int
}

// ReasonBusyPrefix starts the reason of every such refusal.
const ReasonBusyPrefix = "broker busy: "

func (e *BusyError) Error() string {
	return fmt.Sprintf(ReasonBusyPrefix+"%d %s requests already wait on the broker write; retry after %d s", e.limit, e.channel, BusyRetryAfter)
}

func (b *Waiters) Busy() *BusyError {
	return &BusyError{channel: b.channel, limit: cap(b.slots)}
}

// IsBusy reports whether an answer is a refusal for a stalled broker.
func IsBusy(status int, reason string) bool {
	return status == http.StatusServiceUnavailable && strings.HasPrefix(reason, ReasonBusyPrefix)
}

// NoteRefusal logs a refusal for a stalled broker at most once per
// interval, with the count since the last line: while the broker does not
// read, every request beyond the bound is refused, and one line each would
// flood the log.
func (b *Waiters) NoteRefusal(log *slog.Logger) {
	b.log.NoteCounted(log, "refused", "requests refused: the broker is not reading", "channel", b.channel, "limit", cap(b.slots))
}

// refuse answers a request that found no slot: 503, Retry-After, and the
// connection closed, so a refused client holds no connection either.
func (b *Waiters) Refuse(w http.ResponseWriter, log *slog.Logger) {
	b.NoteRefusal(log)
	SetBusyHeaders(w)
	httpguard.Answer(w, http.StatusServiceUnavailable, b.Busy().Error())
}

// SetBusyHeaders sets what every refusal for a stalled broker
// carries besides its status.
func SetBusyHeaders(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(BusyRetryAfter))
	w.Header().Set("Connection", "close")
}

// WriteWaitersMetrics renders the waiters and the refusals of both
// channels.
func WriteWaitersMetrics(t *promtext.Text, channels ...*Waiters) {
	t.Family("nvpair_wlm_broker_waiters", "gauge", "Peer or ingress requests waiting on the broker write now, by channel; at most nvpair_wlm_broker_waiters_limit each.")
	for _, b := range channels {
		t.Sample("nvpair_wlm_broker_waiters", []string{"channel"}, []string{b.channel}, float64(b.Waiting()))
	}
	t.Single("nvpair_wlm_broker_waiters_limit", "gauge", "The most requests of one channel that may wait on the broker write at once.", float64(cap(channels[0].slots)))
	t.Family("nvpair_wlm_broker_busy_refusals_total", "counter", "Peer or ingress requests answered 503 with Retry-After because their channel already had the most requests waiting on the broker write, by channel.")
	for _, b := range channels {
		t.Sample("nvpair_wlm_broker_busy_refusals_total", []string{"channel"}, []string{b.channel}, float64(b.refused.Load()))
	}
}

// Refused is how many requests were answered 503 because every slot was
// taken.
func (b *Waiters) Refused() uint64 { return b.refused.Load() }
