package statejournal

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkAppendWait measures group commit with real fsyncs in a temporary
// directory: each of N appenders appends a 200-byte record and waits for it,
// over and over. It reports records per fsync (how well groups form) and
// fsyncs per op; ns/op is per record.
func BenchmarkAppendWait(b *testing.B) {
	for _, appenders := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("appenders=%d", appenders), func(b *testing.B) {
			opt, _ := options()
			opt.NoSync = false
			j, _ := mustOpen(b, journalPath(b), opt)
			payload := make([]byte, 200)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range appenders {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						seq, err := j.Append(payload)
						if err == nil {
							err = j.Wait(seq)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			s := j.Stats()
			b.ReportMetric(float64(s.Records)/float64(max(s.Groups, 1)), "records/fsync")
			b.ReportMetric(float64(s.Groups)/float64(b.N), "fsyncs/op")
			mustClose(b, j)
		})
	}
}
