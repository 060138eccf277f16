// Package installtest runs scripts/install.sh (install, check, rollback) as
// an operator would on a PAIR node: the real daemon, built twice with two
// versions, runs under internal/dev/pairsupervisor, which stands in for PAIR's
// broker and starts the worker again whenever it exits, in a PAIR-shaped app
// dir under a temporary home. It has no code of its own, only tests, and it
// imports nothing of this module: the daemon and the supervisor are built
// and run as programs.
package installtest
