package brokerio

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/wireframe"
)

func TestBrokerWriterNeverInterleavesConcurrentFrames(t *testing.T) {
	// A writer that takes each Write in small pieces and yields in between,
	// as a pipe under pressure may: without the Writer's own lock two
	// frames would interleave.
	cw := &chunkyWriter{}
	bw := NewWriter(cw, wireframe.DefaultBrokerLineMax)
	const writers, perWriter = 32, 50
	payload := strings.Repeat("w", 300)
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				params, _ := json.Marshal(map[string]any{"g": g, "i": i, "pad": payload})
				if err := bw.Notify("test:frame", params); err != nil {
					t.Errorf("notify: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()

	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(cw.bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var f struct {
			JSONRPC string `json:"jsonrpc"`
			Method  string `json:"method"`
			Params  struct {
				G, I int
				Pad  string
			} `json:"params"`
		}
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			t.Fatalf("line %d is not one JSON frame (interleaved write?): %v: %.80q", len(seen), err, sc.Text())
		}
		if f.JSONRPC != "2.0" || f.Method != "test:frame" || f.Params.Pad != payload {
			t.Fatalf("frame %d mangled: %.80q", len(seen), sc.Text())
		}
		k := fmt.Sprintf("%d/%d", f.Params.G, f.Params.I)
		if seen[k] {
			t.Fatalf("frame %s written twice", k)
		}
		seen[k] = true
	}
	if len(seen) != writers*perWriter {
		t.Fatalf("decoded %d frames, want %d", len(seen), writers*perWriter)
	}
}

func TestBrokerWriterAfterAFailedWriteIsGoneAndNeverWritesAgain(t *testing.T) {
	fw := &failingWriter{err: syscall.EPIPE}
	bw := NewWriter(fw, wireframe.DefaultBrokerLineMax)
	select {
	case <-bw.Gone():
		t.Fatal("gone closed before any write")
	default:
	}

	err := bw.Notify("first", json.RawMessage(`{}`))
	if err == nil || !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("first write = %v, want the writer's EPIPE", err)
	}
	select {
	case <-bw.Gone():
	default:
		t.Fatal("gone not closed after a failed write")
	}

	for i := range 3 {
		if err := bw.Notify("later", json.RawMessage(`{}`)); !errors.Is(err, ErrGone) {
			t.Fatalf("write %d after the failure = %v, want ErrGone", i, err)
		}
	}
	if err := bw.Respond(json.RawMessage(`1`), nil, nil); !errors.Is(err, ErrGone) {
		t.Fatalf("respond after the failure = %v, want ErrGone", err)
	}
	if n := fw.calls.Load(); n != 1 {
		t.Fatalf("the writer was called %d times, want 1: later writes must not touch it", n)
	}
}

func TestBrokerWriterWritesALineAtTheLimitAndRefusesOneByteMore(t *testing.T) {
	const limit = wireframe.MinBrokerLineMax
	var buf bytes.Buffer
	bw := NewWriter(&buf, limit)

	// A line of exactly the limit, its newline included, is written.
	if err := bw.Notify("test:at-limit", testframe.PaddedParams(t, "test:at-limit", limit)); err != nil {
		t.Fatalf("a %d-byte line with a %d-byte limit: %v", limit, limit, err)
	}
	if buf.Len() != limit {
		t.Fatalf("wrote %d bytes, want the %d-byte line", buf.Len(), limit)
	}

	// One byte more is refused: nothing written, the sentinel returned with
	// the size and the limit, the channel not marked gone.
	err := bw.Notify("test:over-limit", testframe.PaddedParams(t, "test:over-limit", limit+1))
	if !errors.Is(err, wireframe.ErrLineOverLimit) {
		t.Fatalf("a %d-byte line with a %d-byte limit = %v, want wireframe.ErrLineOverLimit", limit+1, limit, err)
	}
	if want := fmt.Sprintf("a %d-byte line to the broker, over its %d-byte line limit", limit+1, limit); !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
	if buf.Len() != limit {
		t.Fatalf("the refused line wrote %d bytes", buf.Len()-limit)
	}
	select {
	case <-bw.Gone():
		t.Fatal("a refused line marked the broker gone")
	default:
	}

	// Later writes still go through.
	if err := bw.Notify("test:after", json.RawMessage(`{}`)); err != nil {
		t.Fatalf("write after a refused line: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "test:at-limit") || !strings.Contains(lines[1], "test:after") {
		t.Fatalf("broker got %d lines, want the one at the limit and the one after", len(lines))
	}
	if r, w, f := bw.Counts().Refused, bw.Counts().Writes, bw.Counts().Failures; r != 1 || w != 2 || f != 0 {
		t.Fatalf("refused %d, writes %d, failures %d; want 1, 2, 0", r, w, f)
	}
}

// The limit counts the newline because a broker reading with a bounded
// line buffer needs room for it: a Go broker's bufio.Scanner with a buffer
// of the limit reads a line at the limit and gives up on one byte more.
func TestBrokerLineLimitIsWhatAScannerWithThatBufferReads(t *testing.T) {
	for _, tc := range []struct {
		size int
		ok   bool
	}{{wireframe.DefaultBrokerLineMax, true}, {wireframe.DefaultBrokerLineMax + 1, false}} {
		var buf bytes.Buffer
		bw := NewWriter(&buf, tc.size) // a writer that takes the line
		if err := bw.Notify(wireframe.MethodUpsert, testframe.PaddedParams(t, wireframe.MethodUpsert, tc.size)); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(&buf)
		sc.Buffer(nil, wireframe.DefaultBrokerLineMax)
		if got := sc.Scan(); got != tc.ok {
			t.Fatalf("a %d-byte line through a %d-byte scanner: read %v (%v), want %v", tc.size, wireframe.DefaultBrokerLineMax, got, sc.Err(), tc.ok)
		}
		if w := NewWriter(io.Discard, wireframe.DefaultBrokerLineMax); (w.Notify(wireframe.MethodUpsert, testframe.PaddedParams(t, wireframe.MethodUpsert, tc.size)) == nil) != tc.ok {
			t.Fatalf("the broker writer with the default limit disagrees with the scanner on a %d-byte line", tc.size)
		}
	}
}

func TestBrokerWriterRespond(t *testing.T) {
	for _, tc := range []struct {
		name   string
		id     string
		result any
		rerr   *wireframe.RPCError
		want   string // the whole line, as a JSON value
	}{
		{"nil result is result null", `7`, nil, nil, `{"jsonrpc":"2.0","id":7,"result":null}`},
		{"string id echoed", `"abc"`, nil, nil, `{"jsonrpc":"2.0","id":"abc","result":null}`},
		{"a result", `2`, map[string]string{"level": "debug"}, nil, `{"jsonrpc":"2.0","id":2,"result":{"level":"debug"}}`},
		{"an error", `3`, nil, &wireframe.RPCError{Code: wireframe.CodeMethodNotFound, Message: "method not found"},
			`{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"method not found"}}`},
		{"an error wins over a result", `4`, "ignored", &wireframe.RPCError{Code: wireframe.CodeInvalidParams, Message: "bad level"},
			`{"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"bad level"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			bw := NewWriter(&buf, wireframe.DefaultBrokerLineMax)
			if err := bw.Respond(json.RawMessage(tc.id), tc.result, tc.rerr); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
				t.Fatalf("response %q is not exactly one line", out)
			}
			assertJSONEqual(t, out, tc.want)
		})
	}
}

func TestBrokerWriterWritesEachFrameOnOneLineEvenForMultilineParams(t *testing.T) {
	// JSON allows line breaks as whitespace between tokens, and producers and
	// peers may send pretty-printed frames; the broker reads one frame per
	// line, so a frame must never carry a raw CR or LF.
	for _, params := range []string{
		"{\n  \"workloadInfo\": {\n    \"id\": \"job-1\",\n    \"labels\": {\"team\": \"a\"}\n  }\n}",
		"{\r\n\"a\":\r\n[1,\r2,\n3]}",
		"{\"s\":\"keeps \\n and \\r escapes\", \"n\": {\n}}",
	} {
		var buf bytes.Buffer
		bw := NewWriter(&buf, wireframe.DefaultBrokerLineMax)
		if err := bw.Notify(wireframe.MethodUpsert, json.RawMessage(params)); err != nil {
			t.Fatal(err)
		}
		out := buf.String()
		if strings.ContainsAny(strings.TrimSuffix(out, "\n"), "\r\n") {
			t.Fatalf("params %q written as more than one line: %q", params, out)
		}
		var f wireframe.RPC
		if err := json.Unmarshal([]byte(out), &f); err != nil {
			t.Fatalf("frame %q does not decode: %v", out, err)
		}
		assertJSONEqual(t, string(f.Params), params)
	}
}

// chunkyWriter stores what it is given a few bytes at a time, yielding the
// processor between pieces. It is safe for concurrent use on its own, so
// only interleaving, not a data race, shows that a caller did not serialize.
type chunkyWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *chunkyWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += 7 {
		end := min(off+7, len(p))
		c.mu.Lock()
		c.buf.Write(p[off:end])
		c.mu.Unlock()
		runtime.Gosched()
	}
	return len(p), nil
}

func (c *chunkyWriter) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.buf.Bytes()...)
}

// failingWriter fails every Write with err and counts the calls.
type failingWriter struct {
	err   error
	calls atomic.Int32
}

func (f *failingWriter) Write([]byte) (int, error) {
	f.calls.Add(1)
	return 0, f.err
}

// assertJSONEqual fails unless got and want are the same JSON value.
func assertJSONEqual(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("%q is not JSON: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want %q is not JSON: %v", want, err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if !bytes.Equal(gb, wb) {
		t.Fatalf("got %s, want %s", gb, wb)
	}
}
