package wlmclient

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkOutboxTerminalFrame is the outbox's cost per terminal frame
// (kept, then taken out: two synced rewrites) with held frames already in
// it, each the size of a typical 1 KiB frame.
func BenchmarkOutboxTerminalFrame(b *testing.B) {
	body := json.RawMessage(`{"pad":"` + strings.Repeat("x", 1000) + `"}`)
	for _, held := range []int{0, 100, 1000} {
		b.Run("held="+strconv.Itoa(held), func(b *testing.B) {
			o, _, err := openOutbox(filepath.Join(b.TempDir(), "outbox.jsonl"), held+1)
			if err != nil {
				b.Fatal(err)
			}
			for i := range held {
				o.entries[strconv.Itoa(i)] = outboxEntry{Key: strconv.Itoa(i), ID: "j", Method: "workload:completed", Body: body}
				o.order = append(o.order, strconv.Itoa(i))
			}
			for b.Loop() {
				if err := o.add(outboxEntry{Key: "k", ID: "k", Method: "workload:completed", Body: body}); err != nil {
					b.Fatal(err)
				}
				if err := o.remove("k"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
