package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
)

// addrError is a listener address the daemon could not use: refused (the
// ingress and the metrics endpoint take loopback only) or not bound (a
// port in use). It names the listener and the address; main.go names the
// flag or file the address came from, which only it knows.
type addrError struct {
	listener string // "peer port", "local ingress", "metrics endpoint"
	addr     string
	err      error
}

func (e *addrError) Error() string { return fmt.Sprintf("%s %s: %v", e.listener, e.addr, e.err) }

func (e *addrError) Unwrap() error { return e.err }

// from says where the address came from: a flag (as "--port") with the
// value the user gave, or a file.
func (e *addrError) from(source, value string) error {
	hint := ""
	if errors.Is(e.err, syscall.EADDRINUSE) {
		hint = "; another process holds that port (is another nvpair-workload-manager running?)"
	}
	if len(source) > 2 && source[:2] == "--" {
		return fmt.Errorf("%s %s: %v%s", source, value, e.err, hint)
	}
	return fmt.Errorf("%s %s (from %s): %v%s", e.listener, e.addr, source, e.err, hint)
}

// explainAddrError names the flag or file that gave a listener's address
// in err, when err is about one; other errors are returned as they are.
func explainAddrError(err error, o options) error {
	var ae *addrError
	if !errors.As(err, &ae) {
		return err
	}
	switch ae.listener {
	case peerListenerName:
		return ae.from("--port", fmt.Sprint(o.port))
	case ingressListenerName:
		if o.localIngress != "" {
			return ae.from("--local-ingress", o.localIngress)
		}
		return ae.from(`"listen" in `+filepath.Join(o.appDir, ingressConfigFile), "")
	case metricsListenerName:
		return ae.from("--metrics", o.metrics)
	}
	return err
}

// The listeners' names in errors and logs.
const (
	peerListenerName    = "peer port"
	ingressListenerName = "local ingress"
	metricsListenerName = "metrics endpoint"
)
