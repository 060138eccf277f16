package peersend

import (
	"math/rand/v2"
	"time"
)

// randN draws a number in [0, n), n > 0. Every random offset of the
// senders comes from one, so a test can give a seeded source where the
// daemon gives math/rand/v2's, which is safe for concurrent use.
type randN func(n int64) int64

// Why the senders draw at random (spec 5.1, 4): every node of a cluster
// gets the same discovery snapshot at about the same instant, and a
// schedule derived from that instant alone is the same on every node. At
// 64 members, every node's heartbeat passes fired together (some 4,000
// requests at once each interval, a change's all-members p99 at 239-290
// ms instead of 30), and every node dialled every other at once (N(N-1)
// TLS handshakes together: dial timeouts, retry storms, a mesh formed in
// up to 20 s). A random offset per peer spreads each of them.

// passJitter is the bound on a pass's offset from its schedule, in
// percent of the interval: each pass starts an interval after the last
// one started, give or take 10 %, so passes that began together drift
// apart within a few intervals and never fall back into step. The pass
// is spread over passShare (80 %) of the interval, so an early start
// (90 %) still leaves the last pass its span.
const passJitter = 10

// within returns a duration drawn evenly from (0, d]; d itself when d
// is not positive.
func (r randN) within(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return time.Duration(r(int64(d))) + 1
}

// around returns d moved by at most pct percent of d either way.
func (r randN) around(d time.Duration, pct int64) time.Duration {
	j := int64(d) * pct / 100
	if j <= 0 {
		return d
	}
	return d + time.Duration(r(2*j+1)-j)
}

// defaultRand is the daemon's source.
var defaultRand randN = rand.Int64N
