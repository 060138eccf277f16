// Package httpguard is the protection the daemon's HTTP servers share
// against their clients (spec.md 3.7): the connection caps per listener and
// per source address, with room made by closing a waiting connection and a
// deadline on the first request; the request-body budgets per channel,
// with the body deadline and the bound on one source's unfinished bodies;
// the log lines a client can cause, rate-limited per source; a request's
// logger, built only when a line is written; and what every server of the
// daemon shares: the protocols served, the timeouts, the write deadline on
// an answer, bounded body reads, clipped reasons and the one-line answers;
// and the refusal of browsers on the loopback listeners (spec.md 3.5): the
// loopback-only bind, the Origin and Host checks, and Fetch Metadata.
//
// It owns how a client is held to its bounds, never what a request means:
// the handlers, the frames and the relay stay with their owners, which pass
// in what a bound needs (a body's cap, a listener's name). Each part keeps
// its own counts and renders its own families through a *promtext.Text.
// It must never import another package of this module but
// internal/promtext: not the frame format, not the PAIR installation, and
// nothing of the relay. The root's layout test
// (TestInternalPackagesImportOnlyWhatTheyMay) holds it to that.
package httpguard
