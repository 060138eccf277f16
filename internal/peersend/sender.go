package peersend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/peerwire"
	"nvpair-workload-manager/internal/ratelog"
	"nvpair-workload-manager/internal/statetable"
	"nvpair-workload-manager/internal/wireframe"
)

// Stats counts one peer's deliveries and heartbeat passes, for the
// metrics.
type Stats struct {
	Peer                                 string // the peer's principal
	Succeeded, FailedAttempts, Retries   atomic.Uint64
	Dropped                              atomic.Uint64 // entries the peer refused for good, skipped
	Skipped                              atomic.Uint64 // entries the peer failed FrameMaxTries times in a row while it took others, skipped
	PassesStarted, PassesCompleted       atomic.Uint64
	PassesOverrun, PassesAbandoned       atomic.Uint64
	Reasserted, ReassertFailures         atomic.Uint64 // re-assertions delivered, and not
	PassProgress, PassSize               atomic.Uint64 // runs visited in the pass under way, of the table's when it started
	BatchesSent, BatchFramesSent         atomic.Uint64
	RetryAfterWaits, RetryAfterHeldNanos atomic.Uint64 // answers whose Retry-After was honoured, and the time they held the peer
}

// peerSender delivers one peer its entries above its mark, in version
// order, each at its latest state, and its heartbeat passes, on one
// goroutine and one connection (spec 5.1). One loop serves the fresh
// frames, a new member's backfill and a returning member's catch-up: they
// are all "what lies above the mark". A heartbeat slice goes only while
// the peer is caught up (but for a lone frame it keeps failing,
// headofline.go), so a re-assertion never overtakes a newer state or a
// removal of its workload: the same goroutine sends the newer one next,
// and nothing is sent twice at once.
type peerSender struct {
	target  Target
	stats   *Stats
	log     *slog.Logger
	table   *statetable.Table
	member  *statetable.Member
	client  *http.Client
	url     string
	ctx     context.Context // the sender's: ends at stop
	cancel  context.CancelFunc
	drain   <-chan struct{} // closed at shutdown: stop once caught up
	hb      *heartbeatStream
	backoff time.Duration // the wait after the last failed attempt, before its jitter; 0 after a success
	// rnd jitters the backoff and the heartbeat (jitter.go); firstDial is
	// the wait before the first request (dialpace.go).
	rnd       randN
	firstDial time.Duration

	refusedLog ratelog.Burst // entries the peer refused for good, logged at most once per ratelog.Interval
	failLog    ratelog.Burst // failed attempts, likewise
	hbErrors   ratelog.Burst // failed re-assertions, likewise

	// hold is what the peer asked the sender to wait for (Retry-After);
	// every request passes it first (exchange).
	hold          peerHold
	retryAfterLog ratelog.Burst // the deferrals, logged at most once per ratelog.Interval

	// advert is what the peer's last answer advertised (noteAdvert): the
	// most frames a batch to it may have in the high 32 bits and the most
	// bytes in the low 32, 0 when it takes no batches. One word, so that
	// the frames of one answer are never read with the bytes of another.
	advert atomic.Uint64
	// singly makes the next catch-up send one entry a request: the peer
	// refused a batch as too large.
	singly bool

	// restating says the member has not been caught up since it joined:
	// every entry it is sent carries the re-assertion marker (a member's
	// re-assertion when it joins, newHeartbeatStream).
	restating bool
	// stuck is the entry at the head of the backlog the peer failed, and
	// split the most frames a catch-up request carries while the frame a
	// batch failed on is looked for (headofline.go).
	stuck      stuckFrame
	split      int
	skippedLog ratelog.Burst // entries skipped, logged at most once per ratelog.Interval
}

// newPeerSender makes the sender of a member that has just joined with
// mark. A member that took entries before (restate: a mark, or a member
// restored from the journal, whose mark may lag) is re-asserted the table
// (newHeartbeatStream); one new to the table, or that never took an entry,
// has seen nothing its dedup could hold against the frames it is sent, and
// is sent the whole table fresh, as its backfill.
func newPeerSender(t Target, stats *Stats, dialTLS func(context.Context, string, string) (net.Conn, error), table *statetable.Table, member *statetable.Member, mark uint64, restate bool, interval time.Duration, drain <-chan struct{}, log *slog.Logger, rnd randN) *peerSender {
	ctx, cancel := context.WithCancel(context.Background())
	transport := &http.Transport{
		DialTLSContext:      dialTLS,
		MaxIdleConns:        peerMaxIdleConns,
		MaxIdleConnsPerHost: peerMaxIdleConns,
		IdleConnTimeout:     peerwire.ClientIdleTimeout,
		Protocols:           httpguard.HTTP1Only,
	}
	return &peerSender{
		target: t,
		stats:  stats,
		log:    log.With("peer", t.Name, "principal", t.Principal),
		table:  table,
		member: member,
		// Redirects are not followed: a peer's answer is its own.
		client: &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		// url.URL escapes an IPv6 zone ("%" -> "%25"); concatenation would
		// leave an invalid escape and every request to the peer would fail.
		url:       (&url.URL{Scheme: "https", Host: t.Addrs[0], Path: wireframe.EventsPath}).String(),
		ctx:       ctx,
		cancel:    cancel,
		drain:     drain,
		hb:        newHeartbeatStream(table, interval, stats, mark, rnd),
		restating: restate,
		rnd:       rnd,
	}
}

// dialInOrder dials the candidate addresses in order and returns the first
// connection that succeeds. The peer is authenticated by its pin, not by the
// name in the URL, so any of its addresses will do.
func dialInOrder(addrs []string) func(ctx context.Context, network, _ string) (net.Conn, error) {
	d := &net.Dialer{Timeout: peerDialTimeout, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		var errs []error
		for _, a := range addrs {
			c, err := d.DialContext(ctx, network, a)
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
		return nil, errors.Join(errs...)
	}
}

func (s *peerSender) stop() { s.cancel() }

// run delivers until the sender is stopped, or at shutdown once the peer
// has caught up. Each turn does one thing: catch the peer up (the entries
// above its mark), else a slice of the heartbeat pass when one is due,
// else wait for the table to change or the pass to be due.
func (s *peerSender) run() {
	defer s.client.CloseIdleConnections()
	defer s.hb.close()
	s.waitFirstDial()
	for s.ctx.Err() == nil {
		if s.catchUp() {
			continue
		}
		if s.draining() {
			return
		}
		if s.heartbeatTurn() {
			continue
		}
		s.idle()
	}
}

// waitFirstDial waits out firstDial, so the senders of one snapshot do not
// all dial at once; shutdown or a stop ends the wait.
func (s *peerSender) waitFirstDial() {
	if s.firstDial <= 0 {
		return
	}
	t := time.NewTimer(s.firstDial)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
	case <-s.drain:
	case <-t.C:
	}
}

func (s *peerSender) draining() bool {
	select {
	case <-s.drain:
		return true
	default:
		return false
	}
}

// idle waits until the table changes, the next heartbeat step is due, a
// frame the peer keeps failing is due again, or the sender stops.
func (s *peerSender) idle() {
	now := time.Now()
	wait := s.hb.untilNext(now)
	if !s.stuck.retryAt.IsZero() {
		wait = min(wait, max(s.stuck.retryAt.Sub(now), time.Millisecond))
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
	case <-s.drain:
	case <-s.member.Wake():
	case <-t.C:
	}
}

// catchUp sends the next entries above the peer's mark and reports whether
// it did anything. A failed attempt leaves the mark where it was: the same
// entries, at whatever state they have by then, go again after a backoff
// that doubles up to peerRetryMaxDelay. Nothing is given up but an entry
// the peer refuses for good, and one it keeps failing while it takes the
// others (headofline.go), each skipped, counted and logged.
func (s *peerSender) catchUp() bool {
	frames, size := s.catchUpBounds()
	taken := s.table.TakeAbove(s.member, frames, size)
	if len(taken.Lines) == 0 {
		s.caughtUp()
		return false
	}
	if s.stuck.spentOn(taken.Versions[0]) {
		return s.pastSpent()
	}
	s.deliver(taken)
	return true
}

// catchUpBounds is the most frames and bytes a catch-up request carries: a
// batch as the peer advertised it (halved while a failed batch's frame is
// looked for), else one frame.
func (s *peerSender) catchUpBounds() (frames, size int) {
	frames, size = s.batchBounds()
	if frames < 2 || s.singly {
		return 1, maxInt
	}
	if s.split > 0 {
		frames = min(frames, s.split)
	}
	if s.restating {
		// TakeAbove counts the lines without the marker.
		size -= frames * wireframe.ResyncMarkerBytes
	}
	return frames, size
}

const maxInt = int(^uint(0) >> 1)

// caughtUp notes that nothing lies above the peer's mark: the member has
// been re-asserted the table since it joined, and nothing is stuck.
func (s *peerSender) caughtUp() {
	s.restating = false
	s.stuck, s.split = stuckFrame{}, 0
}

// sendResult is what became of a request's entries: how many of them, from
// the first, are settled (taken, or refused for good and skipped), and the
// failure of the first that is not. whole says a batch failed as a whole,
// with an answer or a timeout, which names none of its frames.
type sendResult struct {
	settled int
	whole   bool
	err     error
}

// deliver sends taken and settles what the peer answered.
func (s *peerSender) deliver(taken statetable.Taken) {
	s.singly = false
	var r sendResult
	if len(taken.Lines) == 1 {
		r = s.sendOne(taken.Lines[0])
	} else {
		r = s.sendBatch(taken.Lines)
	}
	if r.settled > 0 {
		s.table.Ack(s.member, taken.Versions[r.settled-1])
		s.stats.Succeeded.Add(uint64(r.settled))
	}
	switch {
	case r.err == nil:
		s.backoff, s.stuck = 0, stuckFrame{}
		s.widen()
	case r.whole:
		s.narrow(len(taken.Lines), r.err)
	default:
		s.failedAt(taken.Versions[r.settled], r.err)
	}
}

// wire is an entry's line as this sender sends it: fresh, or as a
// re-assertion while the member is being re-asserted the table.
func (s *peerSender) wire(l statetable.Line) []byte {
	if s.restating {
		return l.Reassertion()
	}
	return l.FreshBytes()
}

// sendOne sends one entry and reports it settled when taken, or refused
// for good and skipped.
func (s *peerSender) sendOne(l statetable.Line) sendResult {
	body := s.wire(l)
	err := s.post(s.ctx, body)
	for errors.Is(err, errDeferred) {
		// The peer asked to wait: not a failed attempt. The same entry
		// goes again once the wait is over (post waits for it).
		err = s.post(s.ctx, body)
	}
	switch {
	case err == nil:
		return sendResult{settled: 1}
	case errors.Is(err, errPermanent):
		s.refused(1, err)
		return sendResult{settled: 1}
	}
	return sendResult{err: err}
}

// refused counts entries the peer refused for good: they are skipped, the
// mark moves past them, as a retry could not change the answer.
func (s *peerSender) refused(n int, err error) {
	s.stats.Dropped.Add(uint64(n))
	s.refusedLog.Note(s.log, "peer refused entries for good; skipped for this peer", "entries", n, "reason", httpguard.ClipReason(err.Error()))
}

// failed counts a failed attempt and waits out its backoff.
func (s *peerSender) failed(err error) {
	if !s.countFailure(err) {
		return
	}
	if sleepCtx(s.ctx, s.nextBackoff()) {
		s.stats.Retries.Add(1)
	}
}

// countFailure counts and logs a failed attempt; it reports false when
// the sender is stopping, which is no failure of the peer's.
func (s *peerSender) countFailure(err error) bool {
	if s.ctx.Err() != nil {
		return false
	}
	s.stats.FailedAttempts.Add(1)
	s.failLog.NoteCounted(s.log, "failed", "peer delivery failed; retrying from its mark", "reason", httpguard.ClipReason(err.Error()))
	return true
}

// nextBackoff doubles the wait after a failed attempt, from
// peerRetryBaseDelay up to peerRetryMaxDelay, and returns it give or take
// backoffJitter: the senders of a cluster whose peer went away together
// (a restart, a partition) would otherwise retry it in step, every one at
// the same instants, for as long as it is away.
func (s *peerSender) nextBackoff() time.Duration {
	s.backoff = min(max(2*s.backoff, peerRetryBaseDelay), peerRetryMaxDelay)
	return s.rnd.around(s.backoff, backoffJitter)
}

// backoffJitter is the bound on a backoff's offset, in percent.
const backoffJitter = 20

// reassert sends re-assertions once each, without retries: the next pass
// repeats what this one could not deliver. It returns how many the peer
// took, and false when the pass should end: two failures in a row that
// may be about the peer (network, 5xx, 429, 403), the first of them
// possibly this request's and the second the next's. One such failure
// between re-assertions the peer takes is about its entry (a peer that
// keeps failing one frame), and the rest of the pass goes on, as it does
// past a rejection (a 4xx), which is always about its entry.
func (s *peerSender) reassert(lines [][]byte) (accepted int, ok bool) {
	if len(lines) > 1 {
		return s.reassertBatch(lines)
	}
	for _, l := range lines {
		err := s.post(s.ctx, l)
		for errors.Is(err, errDeferred) {
			err = s.post(s.ctx, l)
		}
		switch {
		case err == nil:
			s.stats.Reasserted.Add(1)
			s.hb.failedLast = false
			accepted++
		case errors.Is(err, errPermanent):
			s.reassertFailed(1, err)
			s.hb.failedLast = false
		default:
			s.reassertFailed(1, err)
			if s.hb.failedLast || s.ctx.Err() != nil {
				return accepted, false
			}
			s.hb.failedLast = true
		}
	}
	return accepted, true
}

// reassertFailed counts and logs re-assertions the peer did not take.
func (s *peerSender) reassertFailed(n int, err error) {
	if s.ctx.Err() != nil {
		return
	}
	s.stats.ReassertFailures.Add(uint64(n))
	s.hbErrors.Note(s.log, "peer re-assertions failed; the next pass repeats them", "frames", n, "reason", httpguard.ClipReason(err.Error()))
}

// errPermanent marks a peer answer that a retry cannot change.
var errPermanent = errors.New("rejected by peer")

// post makes one single-frame delivery attempt within peerAttemptTimeout.
// It keeps the start of the answer's text, enough to tell a refusal for
// origin, which is final, from a 403 that a peer's next pin reload may
// change.
func (s *peerSender) post(ctx context.Context, line []byte) error {
	open := func() io.Reader { return bytes.NewReader(line) }
	status, text, err := s.exchange(ctx, open, int64(len(line)), "application/json", int64(len(peerwire.OriginRefusalPrefix)))
	if err != nil {
		return err
	}
	switch {
	case status == http.StatusOK:
		return nil
	case peerwire.RetryableAnswer(status, string(text)):
		return fmt.Errorf("status %d", status)
	default:
		return fmt.Errorf("%w: status %d", errPermanent, status)
	}
}

// exchange makes one request within peerAttemptTimeout and returns the
// answer's status and up to keep bytes of its body, or errDeferred for an
// answer that asks the sender to wait (hold.go). Every answer updates
// what the sender knows of the peer's batch advertisement. The rest of the
// body is drained, up to a bound, so the connection goes back to the pool.
//
// The body is given as a function that opens it, size bytes long, so the
// transport can open it again for a request it may resend.
func (s *peerSender) exchange(ctx context.Context, open func() io.Reader, size int64, contentType string, keep int64) (int, []byte, error) {
	// While the peer has asked to wait, no request goes to it, from either
	// lane; the attempt's timeout starts once the wait is over.
	probe, err := s.hold.wait(ctx)
	if err != nil {
		return 0, nil, err
	}
	var status int
	var deferFor time.Duration // the wait the answer asks for, when the sender honours it
	defer func() { s.settleHold(probe, status, deferFor) }()
	ctx, cancel := context.WithTimeout(ctx, peerAttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, open())
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", errPermanent, err)
	}
	req.ContentLength = size
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(open()), nil }
	req.Header.Set("Content-Type", contentType)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	s.noteAdvert(resp.Header.Get(peerwire.BatchHeader))
	status, deferFor = resp.StatusCode, peerwire.RetryAfterOf(resp)
	kept, err := io.ReadAll(io.LimitReader(resp.Body, keep))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, peerResponseDrainCap))
	if err != nil {
		return 0, nil, fmt.Errorf("read answer: %w", err)
	}
	if deferFor > 0 {
		return status, kept, fmt.Errorf("%w: status %d, Retry-After %s", errDeferred, status, deferFor)
	}
	return resp.StatusCode, kept, nil
}
