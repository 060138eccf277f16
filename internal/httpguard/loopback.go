package httpguard

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// LoopbackBinding is the address of a plaintext listener that may only bind
// loopback (the ingress, the metrics endpoint) and, once bound, its port,
// which the Host check requires.
type LoopbackBinding struct {
	what  string       // names the listener in errors
	addr  string       // as configured
	conns *ConnLimiter // caps its connections

	mu   sync.Mutex // guards port
	port string
}

// NewLoopbackBinding refuses an address that is not loopback.
func NewLoopbackBinding(what, addr string, conns *ConnLimiter) (*LoopbackBinding, error) {
	if err := CheckLoopbackBind(addr); err != nil {
		return nil, &AddrError{Listener: what, Addr: addr, Err: err}
	}
	return &LoopbackBinding{what: what, addr: addr, conns: conns}, nil
}

// Listen binds the address. A taken port is an error that fails startup.
func (b *LoopbackBinding) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", b.addr)
	if err != nil {
		return nil, &AddrError{Listener: b.what, Addr: b.addr, Err: err}
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	b.mu.Lock()
	b.port = port
	b.mu.Unlock()
	return b.conns.Listen(ln), nil
}

// BoundPort is the port the listener is bound to, or "" before it is.
func (b *LoopbackBinding) BoundPort() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.port
}

// BoundAddr returns the configured host with the bound port, or "" before
// the listener is bound.
func (b *LoopbackBinding) BoundAddr() string {
	port := b.BoundPort()
	if port == "" {
		return ""
	}
	host, _, _ := net.SplitHostPort(b.addr)
	return net.JoinHostPort(host, port)
}

// Serve serves h on ln in plaintext until the returned server is shut
// down.
func (b *LoopbackBinding) Serve(wg *sync.WaitGroup, ln net.Listener, h http.Handler, idle time.Duration, log *slog.Logger) *http.Server {
	srv := NewHTTPServer(h, idle, log)
	srv.ConnState = b.conns.ConnState
	log.Info(b.what+" listening", "addr", ln.Addr().String())
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(b.what+" stopped", "reason", err)
		}
	})
	return srv
}

// RefuseBrowsers returns 403 for a request that carries an Origin header
// (only browsers send one; any value, "null" and empty included) and 421
// for one whose Host is not a loopback name with the bound port (what a
// DNS-rebinding page sends), or 0 when neither applies.
func (b *LoopbackBinding) RefuseBrowsers(r *http.Request) (int, string) {
	if _, browser := r.Header["Origin"]; browser {
		return http.StatusForbidden, "requests from web pages are refused (Origin header present)"
	}
	if !hostAllowed(r.Host, b.BoundPort()) {
		return http.StatusMisdirectedRequest, fmt.Sprintf("host %q is not this loopback %s", r.Host, b.what)
	}
	return 0, ""
}

// CheckLoopbackBind accepts localhost, a 127.0.0.0/8 address or ::1, with a
// numeric port.
func CheckLoopbackBind(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("not HOST:PORT: %w", err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	if !isLoopbackName(host) {
		return errors.New("not a loopback address (localhost, 127.0.0.0/8 or ::1)")
	}
	return nil
}

// isLoopbackName reports whether host, without port or brackets, is
// localhost (in any letter case: host names are case-insensitive), a
// 127.0.0.0/8 address in canonical dotted-decimal form or ::1. Other
// spellings that some resolvers map to loopback (127.1, 2130706433,
// 0x7f000001, 0177.0.0.1, a trailing dot, ::ffff:127.0.0.1) are refused:
// the answer must not depend on whose parser reads the name.
func isLoopbackName(host string) bool {
	if isASCII(host) && strings.EqualFold(host, "localhost") {
		return true // EqualFold alone would also take "localhoſt"
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" || a.String() != host {
		return false
	}
	return (a.Is4() && a.IsLoopback()) || a == netip.IPv6Loopback()
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// hostAllowed reports whether a request's Host (r.Host: Go's server takes it
// from an absolute-form request line when there is one, and removes it from
// the header map) names this ingress: a loopback name with the bound port.
func hostAllowed(host, boundPort string) bool {
	// The Host nearly every producer sends, decided without a parse.
	if rest, ok := strings.CutPrefix(host, "127.0.0.1:"); ok && rest == boundPort {
		return true
	}
	name, port, err := net.SplitHostPort(host)
	if err != nil || port != boundPort {
		return false
	}
	// JoinHostPort brackets exactly the names with a colon, so this refuses
	// "[127.0.0.1]:port" and any other non-canonical bracketing.
	return net.JoinHostPort(name, port) == host && isLoopbackName(name)
}

// AddrError is a listener address the daemon could not use: refused (the
// ingress and the metrics endpoint take loopback only) or not bound (a
// port in use). It names the listener and the address; the daemon's main
// names the flag or file the address came from, which only it knows.
type AddrError struct {
	Listener string // "peer port", "local ingress", "metrics endpoint"
	Addr     string
	Err      error
}

func (e *AddrError) Error() string { return fmt.Sprintf("%s %s: %v", e.Listener, e.Addr, e.Err) }

func (e *AddrError) Unwrap() error { return e.Err }
