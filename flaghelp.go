package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"nvpair-workload-manager/internal/httpguard"
)

// The daemon's --help and its flag errors. main.go defines the flags; this
// file only explains them: it groups them for --help and turns the flag
// package's terse errors ("invalid value "5" for flag -resync-interval:
// parse error") into ones that say what was expected. Every message names
// a flag with two dashes, as the README and --help spell it; Go's flag
// package accepts one or two alike.

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
	{"Tuning", []string{"resync-interval", "max-live-workloads", "max-live-workload-bytes", "workload-max-bytes", "broker-line-max", "drain-timeout", "peer-max-conns", "peer-max-conns-per-source"}},
	{"General", []string{"log-level", "version", "help"}},
}

// flagArgs names each flag's value in --help.
var flagArgs = map[string]string{
	"port": "N", "ipc": "PATH", "cluster-dir": "DIR", "app-dir": "DIR",
	"local-ingress": "HOST:PORT", "metrics": "HOST:PORT",
	"resync-interval": "D", "drain-timeout": "D", "broker-line-max": "BYTES",
	"max-live-workloads": "N", "peer-max-conns": "N", "peer-max-conns-per-source": "N",
	"ingress-max-conns": "N", "metrics-max-conns": "N", "log-level": "LEVEL",
	"max-live-workload-bytes": "BYTES", "workload-max-bytes": "BYTES",
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

// explainedValue wraps a flag's value so that a value it refuses is
// remembered with the flag's name, for explainFlagError.
type explainedValue struct {
	flag.Value
	name   string
	refuse *flagValueError // where a refusal is recorded; shared by the set
}

// flagValueError is a value a flag refused.
type flagValueError struct {
	name, value string
	kind        any // the flag's type, from its Get: what was expected
}

func (v *explainedValue) Set(s string) error {
	err := v.Value.Set(s)
	if err != nil && v.refuse.name == "" {
		var kind any
		if g, ok := v.Value.(flag.Getter); ok {
			kind = g.Get()
		}
		*v.refuse = flagValueError{name: v.name, value: s, kind: kind}
	}
	return err
}

// explainedBool is explainedValue for a switch, which takes no value.
type explainedBool struct{ *explainedValue }

func (v explainedBool) IsBoolFlag() bool { return true }

// explainFlagErrors wraps every flag of fs and returns what turns a
// failed fs.Parse's error into one that says what was expected.
func explainFlagErrors(fs *flag.FlagSet) func(error) error {
	refused := new(flagValueError)
	fs.VisitAll(func(f *flag.Flag) {
		v := &explainedValue{Value: f.Value, name: f.Name, refuse: refused}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = explainedBool{v}
		} else {
			f.Value = v
		}
	})
	return func(err error) error {
		if err == nil || errors.Is(err, flag.ErrHelp) {
			return err
		}
		if refused.name != "" {
			return refused.explain()
		}
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			return fmt.Errorf("unknown flag --%s (--help lists the flags)", name)
		}
		if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
			return fmt.Errorf("--%s needs a value, like --%s %s", name, name, exampleValue(name, fs))
		}
		return err
	}
}

// explain says what the flag expected instead of the value it was given.
func (e *flagValueError) explain() error {
	switch e.kind.(type) {
	case time.Duration:
		return fmt.Errorf("--%s: %q is not a duration; write it with a unit, like 5s or 1m", e.name, e.value)
	case int, int64, uint, uint64:
		return fmt.Errorf("--%s: %q is not a whole number", e.name, e.value)
	case bool:
		return fmt.Errorf("--%s: %q is not true or false; give the flag alone to turn it on", e.name, e.value)
	}
	return fmt.Errorf("--%s: %q is not a valid value", e.name, e.value)
}

// exampleValue is a value to show with a flag given without one: its
// default, else its placeholder.
func exampleValue(name string, fs *flag.FlagSet) string {
	if f := fs.Lookup(name); f != nil && shownDefault(f) != "" {
		return shownDefault(f)
	}
	if a := flagArgs[name]; a != "" {
		return a
	}
	return "VALUE"
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
