// Package e2e holds the daemon's behaviour seen from outside: each test
// builds the nvpair-workload-manager binary (once per run, in the shared
// harness) and drives it only through what PAIR, a producer, a peer and an
// operator meet: its stdin and stdout (or --ipc socket), its ports (the
// peer port, the local ingress, the metrics endpoint), its log, its exit
// status and its files. Other daemons, the stock workload manager, PAIR's
// own store, a Python producer, a browser, the producer command
// nvpair-wlm (built from the client's module) and a real Slurm take part
// where a test needs them.
//
// It never imports the root package (package main, which cannot be
// imported): the binary is the only way in, and the wire's paths, headers
// and bounds are written here as values (contract_test.go), so a test
// states the contract rather than reading it from the code it judges. It
// uses internal packages for what is not the daemon's own: minting
// clusters (internal/dev/devpki), building frames (internal/dev/testframe), and
// modelling PAIR's broker (internal/dev/pairbroker, internal/dev/pairshadow).
//
// Every test starts the binary, and each skips under -short, so the inner
// loop, go test -short ./..., leaves this package out; a full go test
// ./... or go test ./e2e runs it.
package e2e
