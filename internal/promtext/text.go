package promtext

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Text renders the Prometheus text exposition format.
type Text struct{ b bytes.Buffer }

func (t *Text) Family(name, typ, help string) {
	fmt.Fprintf(&t.b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func (t *Text) Sample(name string, labels []string, values []string, v float64) {
	t.b.WriteString(name)
	if len(labels) > 0 {
		t.b.WriteByte('{')
		for i, l := range labels {
			if i > 0 {
				t.b.WriteByte(',')
			}
			fmt.Fprintf(&t.b, `%s="%s"`, l, escapeLabel(values[i]))
		}
		t.b.WriteByte('}')
	}
	t.b.WriteByte(' ')
	t.b.WriteString(formatValue(v))
	t.b.WriteByte('\n')
}

func (t *Text) Single(name, typ, help string, v float64) {
	t.Family(name, typ, help)
	t.Sample(name, nil, nil, v)
}

func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

func formatValue(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// CounterSamples writes one sample per counter of v, sorted by label
// values, under the family name (whose HELP and TYPE the caller wrote).
func (t *Text) CounterSamples(name string, labels []string, v *CounterVec) {
	for _, c := range v.Snapshot() {
		t.Sample(name, labels, c.values, float64(c.n.Load()))
	}
}

// Bytes is the page written so far.
func (t *Text) Bytes() []byte { return t.b.Bytes() }
