package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"syscall"

	"nvpair-workload-manager/internal/httpguard"
)

// The daemon's --help and its flag errors. main.go defines the flags; this
// file only explains them: it groups them for --help, and the flag
// package's terse errors ("invalid value "5" for flag -resync-interval:
// parse error") become, through internal/cliflags, ones that say what was
// expected. Every message names a flag with two dashes, as the README and
// --help spell it; Go's flag package accepts one or two alike.

// flagGroups orders --help: each group's flags, in order. A flag main.go
// defines and no group lists is shown under "other"
// (TestHelpListsEveryFlagInAGroupWithItsDefault fails then, so a new flag is
// given its group).
var flagGroups = []struct {
	title string
	flags []string
}{
	{"Channels", []string{"ipc", "port"}},
	{"Cluster", []string{"cluster-dir", "app-dir"}},
	{"Ingress", []string{"local-ingress", "ingress-max-conns"}},
	{"Metrics", []string{"metrics", "metrics-max-conns"}},
	{"Tuning", []string{"resync-interval", "max-live-workloads", "max-live-workload-bytes", "max-ended-bytes", "journal-fsync", "workload-max-bytes", "broker-line-max", "drain-timeout", "peer-max-conns", "peer-max-conns-per-source"}},
	{"General", []string{"log-level", "version", "help"}},
}

// flagArgs names each flag's value in --help.
var flagArgs = map[string]string{
	"port": "N", "ipc": "PATH", "cluster-dir": "DIR", "app-dir": "DIR",
	"local-ingress": "HOST:PORT", "metrics": "HOST:PORT",
	"resync-interval": "D", "drain-timeout": "D", "broker-line-max": "BYTES",
	"max-live-workloads": "N", "peer-max-conns": "N", "peer-max-conns-per-source": "N",
	"ingress-max-conns": "N", "metrics-max-conns": "N", "log-level": "LEVEL",
	"max-live-workload-bytes": "BYTES", "max-ended-bytes": "BYTES", "workload-max-bytes": "BYTES",
	"journal-fsync": "always|D",
}

const usageHead = `usage: nvpair-workload-manager [flags]

The per-node daemon that keeps a PAIR cluster's members in agreement about
their workloads. PAIR's back end (the broker) starts it as
  nvpair-workload-manager --log-level LEVEL --cluster-dir APP-DIR/cluster
and talks to it over stdin and stdout; every flag has a default.
Durations take a unit: 500ms, 30s, 2m.
`

// writeUsage prints --help: every flag of fs, grouped, one line each with
// its default.
func writeUsage(w io.Writer, fs *flag.FlagSet) {
	var b strings.Builder
	b.WriteString(usageHead)
	listed := map[string]bool{}
	line := func(name, usage, def string) {
		left := "--" + name
		if a := flagArgs[name]; a != "" {
			left += " " + a
		}
		if def != "" {
			usage += " (default " + def + ")"
		}
		fmt.Fprintf(&b, "  %-32s %s\n", left, usage)
	}
	show := func(name string) {
		listed[name] = true
		if name == "help" {
			line("help", "print this help and exit", "")
			return
		}
		if f := fs.Lookup(name); f != nil {
			line(name, f.Usage, shownDefault(f))
		}
	}
	for _, g := range flagGroups {
		fmt.Fprintf(&b, "\n%s:\n", g.title)
		for _, name := range g.flags {
			show(name)
		}
	}
	var other []string
	fs.VisitAll(func(f *flag.Flag) {
		if !listed[f.Name] {
			other = append(other, f.Name)
		}
	})
	if len(other) > 0 {
		b.WriteString("\nOther:\n")
		for _, name := range other {
			show(name)
		}
	}
	io.WriteString(w, b.String())
}

// shownDefault is a flag's default as --help shows it: nothing for an
// empty string or a false switch, whose meaning the usage line gives.
func shownDefault(f *flag.Flag) string {
	if f.DefValue == "" || f.DefValue == "false" {
		return ""
	}
	return f.DefValue
}

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
