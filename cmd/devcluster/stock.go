package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// The stock workload manager (PAIR's own, built from the published source
// in ../shared/upstream by internal/dev/stockwlm) as some of the dev cluster's
// nodes, so that a mixed-version cluster can be watched. It is run, never
// copied from.

// stockBindTries is how many ports a stock daemon's first start tries.
const stockBindTries = 5

// pickPort returns a port that was free a moment ago. The stock daemon
// takes only --port and cannot bind port 0 and report what it got, so the
// dev cluster must choose; another process can take the port between this
// close and the daemon's bind, which is why a stock start that fails to
// listen is retried with another port (startStock) rather than trusted.
func pickPort() (int, error) {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// errStockNotListening says a stock daemon subscribed but never served its
// port: on a first start, most likely another process took the port.
var errStockNotListening = errors.New("the stock daemon did not listen on its port")

// stockListenTimeout bounds the wait for a stock daemon to serve its port
// after it subscribed: it binds only then, and only once its cluster
// membership is read.
const stockListenTimeout = 10 * time.Second

// awaitStockListening waits until a TLS server answers on n's port, or the
// timeout. A bare TCP accept is not enough: when another process took the
// port, that process accepts. The probe verifies nothing and presents no
// certificate: it only asks whether a TLS server is there; the daemon
// refusing it (a TLS alert) is as good an answer as a handshake. It runs
// while the broker reads the daemon's stdout, so a daemon that exits is
// seen only by the timeout.
func awaitStockListening(n *node) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(n.peerPort()))
	deadline := time.Now().Add(stockListenTimeout)
	for {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr,
			&tls.Config{InsecureSkipVerify: true}) // a probe for a TLS server, not a connection that trusts it
		var alert tls.AlertError
		switch {
		case err == nil:
			conn.Close()
			return nil
		case errors.As(err, &alert) || strings.Contains(err.Error(), "remote error"):
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w %s: %s", n.name, errStockNotListening, addr, logTail(n.logPath, 3))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startStock starts a stock node's daemon. Its first start picks a port
// and tries another when the daemon cannot serve it; every restart asks
// for the port the first one served.
func (c *cluster) startStock(n *node) error {
	first := n.peerPort() == 0
	var err error
	for try := 1; try <= stockBindTries; try++ {
		if first {
			pick := pickPort
			if c.pickPort != nil {
				pick = c.pickPort
			}
			port, perr := pick()
			if perr != nil {
				return perr
			}
			n.mu.Lock()
			n.port = port
			n.mu.Unlock()
		}
		var p *process
		if p, err = c.launch(n); err != nil {
			return err
		}
		if err = c.awaitSubscribed(n, p); err == nil || !first || !errors.Is(err, errStockNotListening) {
			return err
		}
		c.cfg.logf("%s: %v; trying another port", n.name, err)
	}
	return err
}
