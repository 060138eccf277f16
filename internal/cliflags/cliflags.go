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
	"strings"
	"time"
)

// Explain wraps every flag of fs, so that a value one refuses is remembered
// with the flag's name, and returns what turns a failed fs.Parse's error
// into one line. placeholders names flags' values (like "HOST:PORT") for
// the example in "--x needs a value, like --x HOST:PORT"; a flag with a
// non-empty default shows its default instead. Flags defined after the
// call are not wrapped. flag.ErrHelp and nil are returned as they are.
func Explain(fs *flag.FlagSet, placeholders map[string]string) func(error) error {
	refused := new(valueError)
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
			return fmt.Errorf("--%s needs a value, like --%s %s", name, name, exampleValue(fs, placeholders, name))
		}
		return err
	}
}

// explainedValue wraps a flag's value so that a value it refuses is
// remembered with the flag's name.
type explainedValue struct {
	flag.Value
	name   string
	refuse *valueError // where a refusal is recorded; shared by the set
}

// valueError is a value a flag refused.
type valueError struct {
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
		*v.refuse = valueError{name: v.name, value: s, kind: kind}
	}
	return err
}

// explainedBool is explainedValue for a switch, which takes no value.
type explainedBool struct{ *explainedValue }

func (v explainedBool) IsBoolFlag() bool { return true }

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
