package wireframe

// Micro benchmarks of the frame format, one function each on the seed's
// curl frame:
//
//	go test -run '^$' -bench . -benchmem ./internal/wireframe
//
// The daemon's end-to-end benchmarks are the root's (bench_test.go).

import (
	"encoding/json"
	"testing"
)

func BenchmarkParseIngressFrame(b *testing.B) {
	body := []byte(benchSeedFrame)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := ParseIngress(body, benchNodeID, DefaultWorkloadMaxBytes); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheckSpelling(b *testing.B) {
	var s Scan
	if err := s.scanParams([]byte(benchSeedParams)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := checkSpelling("workloadInfo", &s.levels[levelInfo], workloadFields); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScanFrame is the single pass alone over the seed's frame.
func BenchmarkScanFrame(b *testing.B) {
	body := []byte(benchSeedFrame)
	var s Scan
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := s.ScanFrame(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkObjectMembers(b *testing.B) {
	params, _ := objectMembers([]byte(benchSeedParams))
	info, _ := MemberNamed(params, "workloadInfo")
	b.ReportAllocs()
	b.SetBytes(int64(len(info)))
	for b.Loop() {
		if _, err := objectMembers(info); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFoldKey(b *testing.B) {
	for _, name := range []string{"originatedFrom", "ſcheduledOn"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = foldKey(name)
			}
		})
	}
}

func BenchmarkParseLifecycle(b *testing.B) {
	params := json.RawMessage(benchSeedParams)
	b.ReportAllocs()
	b.SetBytes(int64(len(params)))
	for b.Loop() {
		if _, err := ParseLifecycle(MethodStarted, params); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeNotification(b *testing.B) {
	params := json.RawMessage(benchSeedParams)
	b.ReportAllocs()
	for b.Loop() {
		_ = EncodeNotification(MethodUpsert, params)
	}
}
