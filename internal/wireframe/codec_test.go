package wireframe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// readAllLines drains a LineReader up to io.EOF and returns what each Next
// call gave, in order: a copy of the line, or the marker "<too long>" for an
// ErrLineTooLong.
func readAllLines(t *testing.T, lr *LineReader) []string {
	t.Helper()
	var out []string
	for i := 0; ; i++ {
		if i > 1_000_000 {
			t.Fatal("lineReader never reached EOF")
		}
		line, err := lr.Next()
		switch {
		case err == nil:
			out = append(out, string(line))
		case errors.Is(err, ErrLineTooLong):
			if line != nil {
				t.Fatalf("errLineTooLong came with %d bytes of line", len(line))
			}
			out = append(out, "<too long>")
		case errors.Is(err, io.EOF):
			return out
		default:
			t.Fatalf("Next: unexpected error %v", err)
		}
	}
}

func TestLineReaderAcceptsALineOfExactlyOneMiB(t *testing.T) {
	for _, eol := range []string{"\n", "\r\n"} {
		t.Run(fmt.Sprintf("eol=%q", eol), func(t *testing.T) {
			big := strings.Repeat("a", MaxBytes)
			lr := NewLineReader(strings.NewReader(big+eol+"next"+eol), MaxBytes)
			got := readAllLines(t, lr)
			if len(got) != 2 || got[0] != big || got[1] != "next" {
				t.Fatalf("got %d lines (first %d bytes), want the 1 MiB line then %q", len(got), len(got[0]), "next")
			}
		})
	}
}

func TestLineReaderRejectsTwoMiBLineOnceAndReadsTheNextLineIntact(t *testing.T) {
	huge := strings.Repeat("x", 2*MaxBytes)
	next := `{"jsonrpc":"2.0","method":"after"}`
	lr := NewLineReader(strings.NewReader(huge+"\n"+next+"\n"), MaxBytes)

	if _, err := lr.Next(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("first Next = %v, want errLineTooLong", err)
	}
	line, err := lr.Next()
	if err != nil || string(line) != next {
		t.Fatalf("second Next = %q, %v; want the next line intact", line, err)
	}
	if _, err := lr.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("third Next = %v, want io.EOF (errLineTooLong must be reported once)", err)
	}
}

func TestLineReaderRejectsAnOverlongFinalLineWithoutNewline(t *testing.T) {
	lr := NewLineReader(strings.NewReader("ok\n"+strings.Repeat("y", 2*MaxBytes)), MaxBytes)
	got := readAllLines(t, lr)
	if want := []string{"ok", "<too long>"}; !slices.Equal(got, want) {
		t.Fatalf("lines = %q, want %q", got, want)
	}
}

func TestLineReaderNeverBuffersAnOverlongLine(t *testing.T) {
	lr := NewLineReader(strings.NewReader(strings.Repeat("z", 8*MaxBytes)+"\nend\n"), MaxBytes)
	if _, err := lr.Next(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("Next = %v, want errLineTooLong", err)
	}
	if c := cap(lr.buf); c > 2*MaxBytes {
		t.Fatalf("line buffer grew to %d bytes reading an 8 MiB line; want at most about the limit", c)
	}
	if line, err := lr.Next(); err != nil || string(line) != "end" {
		t.Fatalf("Next after the long line = %q, %v", line, err)
	}
}

func TestLineReaderSplitsLines(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		max      int
		want     []string
	}{
		{"CRLF trimmed", "a\r\nb\r\n", 8, []string{"a", "b"}},
		{"CR inside a line kept", "a\rb\n", 8, []string{"a\rb"}},
		{"final line without newline returned before EOF", "x\ny", 8, []string{"x", "y"}},
		{"final line with CR only", "x\r", 8, []string{"x"}},
		{"empty lines are returned empty", "\n\r\nq\n", 8, []string{"", "", "q"}},
		{"empty input is EOF at once", "", 8, nil},
		{"line at the limit", "12345678\n", 8, []string{"12345678"}},
		{"line at the limit with CRLF", "12345678\r\n", 8, []string{"12345678"}},
		{"line far over the limit, then a good one", strings.Repeat("9", 40) + "\nok\n", 8, []string{"<too long>", "ok"}},
		{"two long lines in a row", strings.Repeat("9", 40) + "\n" + strings.Repeat("8", 20) + "\nok", 8, []string{"<too long>", "<too long>", "ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, rd := range []struct {
				name string
				r    func(string) io.Reader
			}{
				{"whole", func(s string) io.Reader { return strings.NewReader(s) }},
				{"one byte at a time", func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) }},
			} {
				got := readAllLines(t, NewLineReader(rd.r(tc.in), tc.max))
				if !slices.Equal(got, tc.want) {
					t.Errorf("%s: lines = %q, want %q", rd.name, got, tc.want)
				}
			}
		})
	}
}

func TestLineReaderReadsManyShortLinesAcrossBufferBoundaries(t *testing.T) {
	const n = 50000 // about 1.2 MB: many 64 KiB buffer refills, lines split across them
	var in bytes.Buffer
	for i := range n {
		fmt.Fprintf(&in, "line-%d-%s\n", i, strings.Repeat("p", i%17))
	}
	lr := NewLineReader(&in, MaxBytes)
	for i := range n {
		line, err := lr.Next()
		if want := fmt.Sprintf("line-%d-%s", i, strings.Repeat("p", i%17)); err != nil || string(line) != want {
			t.Fatalf("line %d = %q, %v; want %q", i, line, err, want)
		}
	}
	if _, err := lr.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after %d lines Next = %v, want io.EOF", n, err)
	}
}

func TestEncodeNotificationRoundTripsThroughEncodingJSON(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		params json.RawMessage
	}{
		{"lifecycle", MethodStarted, json.RawMessage(`{"workloadInfo":{"id":"job-1","x":[1,{"y":null}]}}`)},
		{"no params", "ready", nil},
		{"empty object", "shutdown", json.RawMessage(`{}`)},
		{"method needing escapes", "we\"ird\\method\n<&>\u00e9\u2028", json.RawMessage(`{"a":"\u00e9 <b>"}`)},
		{"array params", "m", json.RawMessage(`[1,"two",{"three":3}]`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line := EncodeNotification(tc.method, tc.params)
			if bytes.ContainsAny(line, "\n\r") {
				t.Fatalf("notification contains a line break: %q", line)
			}
			var f RPC
			if err := json.Unmarshal(line, &f); err != nil {
				t.Fatalf("%q does not decode: %v", line, err)
			}
			if f.JSONRPC != "2.0" || f.Method != tc.method || f.ID != nil {
				t.Fatalf("decoded %+v, want a 2.0 notification of %q", f, tc.method)
			}
			if !bytes.Equal(f.Params, tc.params) {
				t.Fatalf("params = %s, want %s byte for byte", f.Params, tc.params)
			}
			var m map[string]json.RawMessage
			_ = json.Unmarshal(line, &m)
			if _, ok := m["params"]; ok != (tc.params != nil) {
				t.Fatalf("params member present = %v, want %v", ok, tc.params != nil)
			}
		})
	}
}
