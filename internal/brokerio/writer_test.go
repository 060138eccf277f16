package brokerio

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/wireframe"
)

// A lone caller leads: its frame is written on its own goroutine, at once,
// with no group and no handoff.
func TestALoneFrameIsWrittenByItsOwnCallerWithoutAGroup(t *testing.T) {
	var buf bytes.Buffer
	bw := NewWriter(&buf, wireframe.DefaultBrokerLineMax)
	for i := range 3 {
		if err := bw.Notify("test:alone", json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))); err != nil {
			t.Fatal(err)
		}
		bw.mu.Lock()
		leading, head := bw.leading, bw.head
		bw.mu.Unlock()
		if leading || head != nil {
			t.Fatalf("after a lone write: leading %v, a group waiting %v", leading, head != nil)
		}
	}
	if bw.Counts().WriteCalls != 3 || bw.Counts().Writes != 3 || strings.Count(buf.String(), "\n") != 3 {
		t.Fatalf("%d write calls, %d frames, %q", bw.Counts().WriteCalls, bw.Counts().Writes, buf.String())
	}
}
