package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"

	"nvpair-workload-manager/internal/httpguard"
)

// addrErrorFrom says where the address of e came from: a flag (as
// "--port") with the value the user gave, or a file.
func addrErrorFrom(e *httpguard.AddrError, source, value string) error {
	hint := ""
	if errors.Is(e.Err, syscall.EADDRINUSE) {
		hint = "; another process holds that port (is another nvpair-workload-manager running?)"
	}
	if len(source) > 2 && source[:2] == "--" {
		return fmt.Errorf("%s %s: %v%s", source, value, e.Err, hint)
	}
	return fmt.Errorf("%s %s (from %s): %v%s", e.Listener, e.Addr, source, e.Err, hint)
}

// explainAddrError names the flag or file that gave a listener's address
// in err, when err is about one; other errors are returned as they are.
func explainAddrError(err error, o options) error {
	var ae *httpguard.AddrError
	if !errors.As(err, &ae) {
		return err
	}
	switch ae.Listener {
	case peerListenerName:
		return addrErrorFrom(ae, "--port", fmt.Sprint(o.port))
	case ingressListenerName:
		if o.localIngress != "" {
			return addrErrorFrom(ae, "--local-ingress", o.localIngress)
		}
		return addrErrorFrom(ae, `"listen" in `+filepath.Join(o.appDir, ingressConfigFile), "")
	case metricsListenerName:
		return addrErrorFrom(ae, "--metrics", o.metrics)
	}
	return err
}

// The listeners' names in errors and logs.
const (
	peerListenerName    = "peer port"
	ingressListenerName = "local ingress"
	metricsListenerName = "metrics endpoint"
)
