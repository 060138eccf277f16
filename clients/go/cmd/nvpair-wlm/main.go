// Command nvpair-wlm is a producer at the shell: it makes work PAIR does
// not see show in every member's Jobs list, through the node's loopback
// ingress and the Go client (package wlmclient, which orders, leases,
// retries and parks its frames).
//
//	nvpair-wlm run [flags] -- CMD ARGS...   run a command as a workload
//	nvpair-wlm slurm [flags]                report this node's Slurm jobs
//	nvpair-wlm list [flags]                 list what producers reported to this node
//	nvpair-wlm flush [flags]                send the ends earlier runs could not
//
// Install it with `go install` from the client's module:
//
//	go install github.com/nvidia-pair/nvpair-workload-manager/clients/go/cmd/nvpair-wlm@latest
//
// or, from a checkout, `go -C clients/go install ./cmd/nvpair-wlm`. It is
// documented in docs/producer-guide.md and specified in spec.md 3.5.9.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

func main() { os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage: nvpair-wlm COMMAND [flags]

Reports work to this node's loopback ingress, so it shows in every
member's Jobs list.

  run [flags] -- CMD ARGS...   run a command as a workload (its stdio and exit status pass through)
  slurm [flags]                report this node's Slurm jobs as workloads
  list [flags]                 list the workloads producers reported to this node
  flush [flags]                send the ends earlier runs could not deliver

nvpair-wlm COMMAND --help lists a command's flags.
`

// dispatch runs the command args name and returns the exit status.
func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return runMain(args[1:], stdout, stderr)
	case "slurm":
		return slurmMain(args[1:], stdout, stderr)
	case "list":
		return listMain(args[1:], stdout, stderr)
	case "flush":
		return flushMain(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "nvpair-wlm: unknown command %q (nvpair-wlm --help lists them)\n", args[0])
	return 2
}

// command is one subcommand's flags.
type command struct {
	name, synopsis string
	fs             *flag.FlagSet
	stdout, stderr io.Writer
	addr           *string
	logLevel       *string
}

// newCommand makes a subcommand's flag set with the flags every command
// has: --addr and --log-level.
func newCommand(name, synopsis string, stdout, stderr io.Writer) *command {
	c := &command{name: name, synopsis: synopsis, fs: flag.NewFlagSet("nvpair-wlm "+name, flag.ContinueOnError), stdout: stdout, stderr: stderr}
	c.fs.SetOutput(io.Discard) // errors are one line of ours; --help goes to stdout
	c.addr = c.fs.String("addr", wlmclient.DefaultAddr, "the node's loopback ingress, HOST:PORT (a PAIR node's workload-ingress.json names it)")
	c.logLevel = c.fs.String("log-level", "warn", "what the command logs to stderr: debug, info, warn or error")
	return c
}

// parse parses args and returns 0 and false to go on, or the exit status
// to end with: 0 after --help, 2 after one line naming what is wrong.
func (c *command) parse(args []string) (code int, done bool) {
	err := c.fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(c.stdout, "usage: nvpair-wlm %s %s\n\n", c.name, c.synopsis)
		c.fs.SetOutput(c.stdout)
		c.fs.PrintDefaults()
		return 0, true
	}
	if err == nil {
		if _, _, aerr := net.SplitHostPort(*c.addr); aerr != nil {
			err = fmt.Errorf("--addr %q: not HOST:PORT, like %s", *c.addr, wlmclient.DefaultAddr)
		} else if _, lerr := c.level(); lerr != nil {
			err = lerr
		}
	}
	if err != nil {
		return c.fail(err), true
	}
	return 0, false
}

// fail says what is wrong with the command line in one line and returns 2.
func (c *command) fail(err error) int {
	msg := err.Error()
	// The flag package names a flag with one dash; --help spells two.
	for _, p := range []string{"defined: -", "argument: -", "for flag -", "for -"} {
		msg = strings.Replace(msg, p, p+"-", 1)
	}
	fmt.Fprintf(c.stderr, "nvpair-wlm %s: %s (--help lists the flags)\n", c.name, msg)
	return 2
}

// level is --log-level as slog's.
func (c *command) level() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(*c.logLevel)); err != nil {
		return 0, fmt.Errorf("--log-level %q: one of debug, info, warn, error", *c.logLevel)
	}
	return l, nil
}

// logger is the command's log to its stderr.
func (c *command) logger() *slog.Logger {
	l, _ := c.level()
	return slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: l}))
}

// leaseFlag checks a --lease: whole seconds from 5 s to 24 h, or 0 for
// none (the client's negative).
func leaseFlag(d time.Duration) (time.Duration, error) {
	if d == 0 {
		return -1, nil
	}
	if d < 5*time.Second || d > 24*time.Hour || d%time.Second != 0 {
		return 0, fmt.Errorf("--lease %s: whole seconds from 5s to 24h, or 0 for none", d)
	}
	return d, nil
}

// stateDir is where the command keeps its files by default: the user's
// cache directory (XDG_CACHE_HOME, ~/Library/Caches, %LocalAppData%).
func stateDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return dir + string(os.PathSeparator) + "nvpair-wlm"
}
