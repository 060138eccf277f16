package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
)

// ceilingFanoutSpec is what the fan-out ceiling process needs: the client
// identity to present (the daemon's, which the sinks pin) and the sinks.
// The harness sends it as the first line of the process's stdin.
type ceilingFanoutSpec struct {
	CertPEM, KeyPEM []byte
	NodeID          string
	Sinks           []ceilingSink
}

type ceilingSink struct {
	Port int
	DER  []byte // the sink's certificate, compared byte for byte
}

// ceilingFanoutMain is the fan-out ceiling's process (wlmbench
// ceiling-fanout): a bare pooled TLS POST loop, one goroutine per sink
// posting sequentially over one keep-alive mTLS client, kept across runs
// like the daemon's connections. After the spec line, each stdin line
// "run RUN N" posts N frames of run RUN to every sink and answers
// "done FAILED". It is a process of its own, like the daemon, so both get
// the same share of a busy machine.
func ceilingFanoutMain() error {
	in := bufio.NewReader(os.Stdin)
	var spec ceilingFanoutSpec
	if err := readSpecLine(in, &spec); err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(spec.CertPEM, spec.KeyPEM)
	if err != nil {
		return err
	}
	clients := make([]*http.Client, len(spec.Sinks))
	for i, s := range spec.Sinks {
		want := s.DER
		tr := &http.Transport{
			TLSClientConfig: &tls.Config{
				MinVersion:         tls.VersionTLS12,
				Certificates:       []tls.Certificate{cert},
				InsecureSkipVerify: true, // replaced by the pin comparison below
				VerifyConnection: func(cs tls.ConnectionState) error {
					if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, want) {
						return errors.New("sink certificate does not match its pin")
					}
					return nil
				},
			},
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     60 * time.Second,
		}
		clients[i] = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	for {
		cmd, err := in.ReadString('\n')
		if err != nil {
			return nil
		}
		f := strings.Fields(cmd)
		if len(f) != 3 || f[0] != "run" {
			return fmt.Errorf("bad command %q", cmd)
		}
		run, _ := strconv.ParseInt(f[1], 10, 64)
		n, _ := strconv.Atoi(f[2])
		var failed atomic.Int64
		var wg sync.WaitGroup
		for i, s := range spec.Sinks {
			wg.Go(func() {
				url := "https://127.0.0.1:" + strconv.Itoa(s.Port) + ingressPath
				var body []byte
				for j := range n {
					body = appendFanoutFrame(body[:0], spec.NodeID, run, j, 0)
					req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					resp, err := clients[i].Do(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
		fmt.Printf("done %d\n", failed.Load())
	}
}

// ceilingFanout is the fan-out ceiling's process, seen from the harness.
type ceilingFanout struct{ *childProc }

func startCeilingFanout(client devpki.Identity, sinks []*sink) (*ceilingFanout, error) {
	spec := ceilingFanoutSpec{CertPEM: client.CertPEM, KeyPEM: client.KeyPEM, NodeID: client.Principal}
	for _, s := range sinks {
		spec.Sinks = append(spec.Sinks, ceilingSink{Port: s.port, DER: s.ident.DER})
	}
	p, err := startSelfWithSpec("ceiling-fanout", spec)
	if err != nil {
		return nil, err
	}
	return &ceilingFanout{p}, nil
}

// startSelfWithSpec starts a ceiling process and sends it its spec, the
// first line of its stdin (readSpecLine).
func startSelfWithSpec(mode string, spec any) (*childProc, error) {
	line, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	p, err := startSelf(mode)
	if err != nil {
		return nil, err
	}
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// run posts n frames of run to every sink and waits until they hold them.
func (c *ceilingFanout) run(sinks []*sink, run int64, n int) fanResult {
	hs0 := handshakes(sinks)
	for _, s := range sinks {
		s.reset(run, n)
	}
	start := time.Now()
	complete := false
	if _, err := fmt.Fprintf(c.stdin, "run %d %d\n", run, n); err == nil {
		line, err := c.out.ReadString('\n')
		complete = err == nil && strings.TrimSpace(line) == "done 0"
	}
	r := finishFan(sinks, start, n, complete && minUnique(sinks) >= int64(n), hs0)
	r.lats = latencySummary{} // the ceiling's frames carry no send time
	return r
}

// childProc is a ceiling running as a process of its own: the harness's
// own executable started in another role, spoken to over its stdin and
// stdout, and ended by closing its stdin.
type childProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startSelf starts this executable in the given role.
func startSelf(role string) (*childProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c := &childProc{cmd: exec.Command(self, role)}
	c.cmd.Stderr = os.Stderr
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.out = bufio.NewReader(out)
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", role, err)
	}
	return c, nil
}

// close ends the process: stdin EOF, then a kill after 5 s.
func (c *childProc) close() {
	c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// readSpecLine reads a ceiling process's spec: the first line of its stdin,
// JSON.
func readSpecLine(in *bufio.Reader, spec any) error {
	line, err := in.ReadBytes('\n')
	if err != nil {
		return err
	}
	return json.Unmarshal(line, spec)
}
