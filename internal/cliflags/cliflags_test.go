package cliflags

import (
	"errors"
	"flag"
	"io"
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
