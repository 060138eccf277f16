package peersend

import (
	"bytes"
	"io"
	"testing"
	"testing/iotest"
)

func TestBatchBodyIsItsLinesEachFollowedByANewline(t *testing.T) {
	for _, lines := range [][][]byte{
		nil,
		{[]byte(`{"a":1}`)},
		{[]byte(`{"a":1}`), []byte(``), []byte(`{"b":"` + string(bytes.Repeat([]byte("x"), 5000)) + `"}`)},
	} {
		var want bytes.Buffer
		for _, l := range lines {
			want.Write(l)
			want.WriteByte('\n')
		}
		segs := lineSegments(lines)
		if got := batchBodySize(segs); got != int64(want.Len()) {
			t.Fatalf("size %d, want %d", got, want.Len())
		}
		// Read in every size of piece, 1 byte at a time included.
		if err := iotest.TestReader(newBatchBody(segs), want.Bytes()); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(iotest.OneByteReader(newBatchBody(segs)))
		if err != nil || !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("one byte at a time: %q, %v; want %q", got, err, want.Bytes())
		}
	}
}
