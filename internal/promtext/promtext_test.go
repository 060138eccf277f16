package promtext

import (
	"runtime"
	"strings"
	"testing"
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

func TestProcessMetricsAreWrittenOnLinuxOnly(t *testing.T) {
	var x Text
	WriteProcessMetrics(&x)
	has := strings.Contains(string(x.Bytes()), "process_resident_memory_bytes ")
	if has != (runtime.GOOS == "linux") {
		t.Fatalf("process_resident_memory_bytes written: %v on %s", has, runtime.GOOS)
	}
}
