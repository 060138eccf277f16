package cliflags

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestExplainNamesTheFlagWithTwoDashesAndSaysWhatWasExpected(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-d", "5"}, `--d: "5" is not a duration; write it with a unit, like 5s or 1m`},
		{[]string{"--n", "1e3"}, `--n: "1e3" is not a whole number`},
		{[]string{"--f", "x"}, `--f: "x" is not a number`},
		{[]string{"--b=maybe"}, `--b: "maybe" is not true or false; give the flag alone to turn it on`},
		{[]string{"--bogus"}, "unknown flag --bogus (--help lists the flags)"},
		{[]string{"--n"}, "--n needs a value, like --n 3"},                  // its default
		{[]string{"--addr"}, "--addr needs a value, like --addr HOST:PORT"}, // its placeholder
		{[]string{"--s"}, "--s needs a value, like --s VALUE"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Duration("d", time.Second, "")
		fs.Int("n", 3, "")
		fs.Float64("f", 0, "")
		fs.Bool("b", false, "")
		fs.String("addr", "", "")
		fs.String("s", "", "")
		explain := Explain(fs, map[string]string{"addr": "HOST:PORT"})
		if err := explain(fs.Parse(tc.args)); err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	explain := Explain(fs, nil)
	if err := explain(fs.Parse([]string{"-h"})); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp as it is", err)
	}
}

// listValue is a flag.Value of the caller's own, as the commands define.
type listValue []string

func (l *listValue) String() string { return strings.Join(*l, ",") }
func (l *listValue) Set(s string) error {
	if s == "bad" {
		return errors.New("not a list")
	}
	*l = strings.Split(s, ",")
	return nil
}

// defineAll gives fs one flag of every kind the commands use.
func defineAll(fs *flag.FlagSet) {
	fs.Duration("d", time.Second, "a duration")
	fs.Duration("d0", 0, "a zero duration")
	fs.Int("n", 3, "a count")
	fs.Int("n0", 0, "a zero count")
	fs.Int64("big", 1<<40, "bytes")
	fs.Uint("u", 7, "unsigned")
	fs.Float64("f", 0.5, "a rate")
	fs.Bool("b", false, "a switch")
	fs.Bool("on", true, "a switch on by default")
	fs.String("addr", "127.0.0.1:1", "an `ADDRESS`")
	fs.String("s", "", "a string")
	l := listValue{"1", "8"}
	fs.Var(&l, "list", "a list")
	fs.Func("fn", "a func", func(string) error { return nil })
}

// TestExplainLeavesHelpAsTheFlagPackagePrintsIt: --help of an explained
// set is what the flag package prints for the same flags unexplained,
// defaults and value names ("duration", "int") included, and never a
// "panic calling String method on zero ..." line (what PrintDefaults
// printed under every flag while Explain wrapped the flags' values).
func TestExplainLeavesHelpAsTheFlagPackagePrintsIt(t *testing.T) {
	help := func(explained bool) string {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var b strings.Builder
		fs.SetOutput(&b)
		defineAll(fs)
		if explained {
			Explain(fs, map[string]string{"addr": "HOST:PORT"})
		}
		fs.PrintDefaults()
		return b.String()
	}
	want, got := help(false), help(true)
	if got != want {
		t.Errorf("--help of the explained set:\n%s\nwant the flag package's own:\n%s", got, want)
	}
	if strings.Contains(got, "panic") {
		t.Errorf("--help has a panic:\n%s", got)
	}
	for _, s := range []string{"-d duration", "(default 1s)", "-n int", "(default 3)", "-on\n", "(default true)", "-addr ADDRESS"} {
		if !strings.Contains(got, s) {
			t.Errorf("--help lacks %q:\n%s", s, got)
		}
	}
}

// TestExplainReadsRefusalsOfEveryKind: a refused value is explained by
// the flag's kind, whatever the value holds (quotes, ": ", newlines), for
// a flag defined after Explain too, and a Value of the caller's own is
// "not a valid value".
func TestExplainReadsRefusalsOfEveryKind(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--d", `5: "x"`}, `--d: "5: \"x\"" is not a duration; write it with a unit, like 5s or 1m`},
		{[]string{"--big", "1\n2"}, `--big: "1\n2" is not a whole number`},
		{[]string{"--u", "-1"}, `--u: "-1" is not a whole number`},
		{[]string{"--on=no"}, `--on: "no" is not true or false; give the flag alone to turn it on`},
		{[]string{"--list", "bad"}, `--list: "bad" is not a valid value`},
		{[]string{"--late", "x"}, `--late: "x" is not a whole number`},
		{[]string{"--a: b", "x"}, `--a: b: "x" is not a whole number`},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		defineAll(fs)
		fs.Int("a: b", 0, "a name with a colon")
		explain := Explain(fs, nil)
		fs.Int("late", 0, "defined after Explain")
		if err := explain(fs.Parse(tc.args)); err == nil || err.Error() != tc.want {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}
