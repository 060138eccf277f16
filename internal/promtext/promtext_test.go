package promtext

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestTextWritesFamiliesAndSamplesInTheExpositionFormat(t *testing.T) {
	var x Text
	x.Single("a_total", "counter", "A count.", 3)
	x.Family("b", "gauge", "B by label.")
	x.Sample("b", []string{"peer"}, []string{"quote\" back\\ line\n"}, 0.5)
	want := "# HELP a_total A count.\n# TYPE a_total counter\na_total 3\n" +
		"# HELP b B by label.\n# TYPE b gauge\nb{peer=\"quote\\\" back\\\\ line\\n\"} 0.5\n"
	if got := string(x.Bytes()); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestCounterVecCountsPerLabelValuesAndListsThemSorted(t *testing.T) {
	v := NewCounterVec()
	v.Inc("stdio", "b")
	v.Inc("peer", "a")
	v.Inc("stdio", "b")
	v.Touch("ingress", "c")
	if v.Get("stdio", "b") != 2 || v.Get("peer", "a") != 1 || v.Get("ingress", "c") != 0 || v.Get("nope") != 0 {
		t.Fatalf("counts stdio/b %d, peer/a %d, ingress/c %d", v.Get("stdio", "b"), v.Get("peer", "a"), v.Get("ingress", "c"))
	}
	var x Text
	x.CounterSamples("f", []string{"source", "method"}, v)
	want := "f{source=\"ingress\",method=\"c\"} 0\nf{source=\"peer\",method=\"a\"} 1\nf{source=\"stdio\",method=\"b\"} 2\n"
	if got := string(x.Bytes()); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestHistogramBucketsAreCumulativeWithSumAndCount(t *testing.T) {
	h := NewHistogram()
	h.Observe(2 * time.Millisecond)
	h.Observe(30 * time.Second) // over every bucket: +Inf only
	var x Text
	x.Histogram("lat", "peer", "p", h)
	got := string(x.Bytes())
	for _, line := range []string{
		`lat_bucket{peer="p",le="0.001"} 0`, `lat_bucket{peer="p",le="0.0025"} 1`, `lat_bucket{peer="p",le="20"} 1`,
		`lat_bucket{peer="p",le="+Inf"} 2`, `lat_sum{peer="p"} 30.002`, `lat_count{peer="p"} 2`,
	} {
		if !strings.Contains(got, line+"\n") {
			t.Errorf("missing %q in\n%s", line, got)
		}
	}
}

func TestProcessMetricsAreWrittenOnLinuxOnly(t *testing.T) {
	var x Text
	WriteProcessMetrics(&x)
	has := strings.Contains(string(x.Bytes()), "process_resident_memory_bytes ")
	if has != (runtime.GOOS == "linux") {
		t.Fatalf("process_resident_memory_bytes written: %v on %s", has, runtime.GOOS)
	}
}
