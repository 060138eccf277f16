// Package cliflags turns the standard flag package's terse parse errors
// ("invalid value "5" for flag -resync-interval: parse error") into one
// line that names the flag with two dashes, as the README and --help spell
// it, and says what was expected. The daemon and the module's commands
// (the dev cluster, the release builder, the example producer) share it, so
// a bad flag reads the same everywhere; each prints the line and exits 2.
//
// It must never import another package of this module: it knows flags,
// nothing of what they configure. The root's layout test
// (TestInternalPackagesImportOnlyWhatTheyMay) holds it to that.
package cliflags

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Explain returns what turns a failed fs.Parse's error into one line.
// placeholders names flags' values (like "HOST:PORT") for the example in
// "--x needs a value, like --x HOST:PORT"; a flag with a non-empty default
// shows its default instead. flag.ErrHelp and nil are returned as they
// are.
//
// It reads the flag package's own error and leaves fs's flags as they
// are: a wrapper around each flag's Value would change the Value's type,
// which the flag package's help reads (PrintDefaults builds a zero value
// of that type to decide whether to show the default, and names the
// value "duration", "int", ... by it), so --help would lose its defaults
// and its value names, and a wrapper whose zero value cannot say String
// printed "panic calling String method on zero ..." under every flag.
// TestExplainLeavesHelpAsTheFlagPackagePrintsIt holds that.
func Explain(fs *flag.FlagSet, placeholders map[string]string) func(error) error {
	return func(err error) error {
		if err == nil || errors.Is(err, flag.ErrHelp) {
			return err
		}
		msg := err.Error()
		if e, ok := refusal(fs, msg); ok {
			return e.explain()
		}
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			return fmt.Errorf("unknown flag --%s (--help lists the flags)", name)
		}
		if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
			return fmt.Errorf("--%s needs a value, like --%s %s", name, name, exampleValue(fs, placeholders, name))
		}
		return err
	}
}

// valueError is a value a flag refused.
type valueError struct {
	name, value string
	kind        any // the flag's type, from its Get: what was expected
}

// refusal reads the flag package's error for a value a flag of fs refused,
// as its FlagSet.parseOne words it: `invalid value "5" for flag -d: parse
// error`, and `invalid boolean value "x" for -b: ...` for a switch.
func refusal(fs *flag.FlagSet, msg string) (*valueError, bool) {
	rest, ok := strings.CutPrefix(msg, "invalid value ")
	sep := " for flag -"
	if !ok {
		if rest, ok = strings.CutPrefix(msg, "invalid boolean value "); !ok {
			return nil, false
		}
		sep = " for -"
	}
	quoted, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return nil, false
	}
	value, _ := strconv.Unquote(quoted)
	rest, ok = strings.CutPrefix(rest[len(quoted):], sep)
	if !ok {
		return nil, false
	}
	// The name ends at the ": " before the Value's own error; the first
	// prefix that names a flag of fs is it (a name may hold ": " too).
	for i := 0; ; i++ {
		j := strings.Index(rest[i:], ": ")
		if j < 0 {
			return nil, false
		}
		i += j
		if f := fs.Lookup(rest[:i]); f != nil {
			var kind any
			if g, ok := f.Value.(flag.Getter); ok {
				kind = g.Get()
			}
			return &valueError{name: f.Name, value: value, kind: kind}, true
		}
	}
}

// explain says what the flag expected instead of the value it was given.
func (e *valueError) explain() error {
	switch e.kind.(type) {
	case time.Duration:
		return fmt.Errorf("--%s: %q is not a duration; write it with a unit, like 5s or 1m", e.name, e.value)
	case int, int64, uint, uint64:
		return fmt.Errorf("--%s: %q is not a whole number", e.name, e.value)
	case float64:
		return fmt.Errorf("--%s: %q is not a number", e.name, e.value)
	case bool:
		return fmt.Errorf("--%s: %q is not true or false; give the flag alone to turn it on", e.name, e.value)
	}
	return fmt.Errorf("--%s: %q is not a valid value", e.name, e.value)
}

// exampleValue is a value to show with a flag given without one: its
// default, else its placeholder.
func exampleValue(fs *flag.FlagSet, placeholders map[string]string, name string) string {
	if f := fs.Lookup(name); f != nil && f.DefValue != "" && f.DefValue != "false" {
		return f.DefValue
	}
	if a := placeholders[name]; a != "" {
		return a
	}
	return "VALUE"
}
