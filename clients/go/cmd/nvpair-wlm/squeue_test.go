package main

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// readSample parses a testdata sample whole.
func readSample(t *testing.T, name string, maxBytes int64) (squeueView, error) {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return parseSqueue(f, maxBytes)
}

// byKey indexes a view's jobs, arrays expanded.
func byKey(t *testing.T, v squeueView) map[string]sjob {
	t.Helper()
	jobs, dropped := expandArrays(v.Jobs, 1000)
	if dropped != 0 {
		t.Fatalf("%d jobs dropped expanding %d", dropped, len(v.Jobs))
	}
	out := map[string]sjob{}
	for _, j := range jobs {
		if _, dup := out[j.Key]; dup {
			t.Fatalf("two jobs keyed %s", j.Key)
		}
		out[j.Key] = j
	}
	return out
}

// wantJob is what the bridge must read of one job: its workload state and
// the words of its end.
type wantJob struct {
	state, exit string
	host        string
	submit      int64
}

func checkJobs(t *testing.T, got map[string]sjob, want map[string]wantJob) {
	t.Helper()
	for key, w := range want {
		j, ok := got[key]
		if !ok {
			t.Errorf("job %s not read", key)
			continue
		}
		if s := workloadState(j); s != w.state {
			t.Errorf("job %s (%s %v) shows as %q, want %q", key, j.State, j.Flags, s, w.state)
		}
		if w.exit != "" && j.Exit.String() != w.exit {
			t.Errorf("job %s ended %q, want %q", key, j.Exit, w.exit)
		}
		if j.BatchHost != w.host {
			t.Errorf("job %s batch host %q, want %q", key, j.BatchHost, w.host)
		}
		if w.submit != 0 && j.Submit.Unix() != w.submit {
			t.Errorf("job %s submitted %d, want %d", key, j.Submit.Unix(), w.submit)
		}
	}
}

func TestSqueue2205RecordingReadsEveryKindOfJob(t *testing.T) {
	v, err := readSample(t, "squeue-22.05.8.json", defaultSqueueMaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	if v.Release != "22.05.8" {
		t.Errorf("release %q", v.Release)
	}
	got := byKey(t, v)
	checkJobs(t, got, map[string]wantJob{
		"19":   {state: "completed", exit: "exit code 0", host: "n1", submit: 1796672494},
		"16":   {state: "failed", exit: "exit code 3", host: "n1"}, // exit 3: the raw wait status 768
		"17":   {state: "cancelled", exit: "killed by signal 15", host: "n1"},
		"18":   {state: "cancelled", host: ""}, // cancelled while pending: no batch host
		"22":   {state: "failed", exit: "killed by signal 9", host: "n1"},
		"21":   {state: "queued", host: ""}, // held
		"25":   {state: "running", host: "n1"},
		"26":   {state: "running", host: "n1"},   // requeued, caught COMPLETING
		"8_0":  {state: "completed", host: "n1"}, // a split array task keeps its task key
		"8_4":  {state: "cancelled", host: ""},   // the array's unsplit rest, cancelled while pending
		"8_5":  {state: "cancelled", host: ""},
		"20_2": {state: "completed", host: "n1"}, // the array's own record, now its last task
	})
	if j := got["26"]; j.Restarts != 1 || !slices.Equal(j.Flags, []string{"COMPLETING"}) {
		t.Errorf("the requeued job reads restarts %d flags %v", j.Restarts, j.Flags)
	}
	if j := got["16"]; j.Start.Unix() != 1796672495 || j.End.Unix() != 1796672495 || j.Reason != "NonZeroExitCode" {
		t.Errorf("job 16: start %v end %v reason %q", j.Start, j.End, j.Reason)
	}
	if j := got["21"]; !j.Start.IsZero() || !j.End.IsZero() {
		t.Errorf("a pending job's unset times read as %v and %v, want zero", j.Start, j.End)
	}
}

func TestSqueueLaterReleasesShapeReadsTheSameMeaning(t *testing.T) {
	v, err := readSample(t, "squeue-23.11-shape.json", defaultSqueueMaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	if v.Release != "23.11.1" {
		t.Errorf("release %q", v.Release)
	}
	got := byKey(t, v)
	checkJobs(t, got, map[string]wantJob{
		"101":   {state: "running", host: "gpu1", submit: 1800000000},
		"102":   {state: "running", host: "gpu1"}, // COMPLETED while COMPLETING
		"103":   {state: "completed", exit: "exit code 0", host: "gpu1"},
		"104":   {state: "failed", exit: "exit code 3", host: "gpu1"},
		"105":   {state: "failed", exit: "killed by signal 15 (TERM)", host: "gpu2"},
		"106":   {state: "queued"},
		"107_0": {state: "queued"}, "107_3": {state: "queued"},
		"108":   {state: "queued"}, // PENDING, REQUEUED
		"109":   {state: "failed", exit: "killed by signal 9 (KILL)", host: "gpu1"},
		"110":   {state: "cancelled"},
		"111_4": {state: "running", host: "gpu1"},
	})
	if _, ok := got["107_4"]; ok {
		t.Error("0-3%2 expanded past task 3")
	}
	if j := got["101"]; !j.End.Equal(time.Unix(1800086410, 0)) || j.Start.Unix() != 1800000010 {
		t.Errorf("job 101's times %v %v", j.Start, j.End)
	}
}

func TestSqueueOutputOverItsBoundIsAnErrorNotACutList(t *testing.T) {
	_, err := readSample(t, "squeue-22.05.8.json", 10_000) // the file is 64,043 bytes
	if !errors.Is(err, errTooLarge) {
		t.Fatalf("got %v, want errTooLarge", err)
	}
	if _, err := readSample(t, "squeue-22.05.8.json", 64_043); err != nil {
		t.Fatalf("the file at exactly its size: %v", err)
	}
}

func TestSqueueErrorsListFailsThePoll(t *testing.T) {
	_, err := readSample(t, "squeue-23.11-shape-error.json", defaultSqueueMaxBytes)
	if err == nil || !strings.Contains(err.Error(), "Unable to contact slurm controller") {
		t.Fatalf("got %v, want the controller's error", err)
	}
	for _, bad := range []string{``, `[]`, `{"jobs": [{"name": "no id"}]}`, `{"meta": {}}`, `{"jobs": [`} {
		if _, err := parseSqueue(strings.NewReader(bad), 1<<20); err == nil {
			t.Errorf("%q read without an error", bad)
		}
	}
}

// TestEveryStateTheIssueNamesMapsAsItSays holds the mapping table of the
// producer guide (and issue 38) to the code, state by state.
func TestEveryStateTheIssueNamesMapsAsItSays(t *testing.T) {
	for state, want := range map[string]string{
		"PENDING": "queued", "REQUEUED": "queued", "SUSPENDED": "queued",
		"CONFIGURING": "running", "RUNNING": "running", "COMPLETING": "running",
		"COMPLETED": "completed",
		"FAILED":    "failed", "TIMEOUT": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
		"BOOT_FAIL": "failed", "DEADLINE": "failed", "PREEMPTED": "failed",
		"CANCELLED": "cancelled",
	} {
		// As 22.05 writes it (one string) and as later releases do (an array).
		base, flags := jobState([]byte(`"` + state + `"`))
		if got := workloadState(sjob{State: base, Flags: flags}); got != want {
			t.Errorf("22.05 %s shows as %q, want %q", state, got, want)
		}
		arr := `["` + state + `"]`
		if !baseStates[state] {
			arr = `["PENDING","` + state + `"]`
			if want == "running" {
				arr = `["COMPLETED","` + state + `"]`
			}
		}
		base, flags = jobState([]byte(arr))
		if got := workloadState(sjob{State: base, Flags: flags}); got != want {
			t.Errorf("%s shows as %q, want %q", arr, got, want)
		}
	}
	if got := workloadState(sjob{Flags: []string{"REVOKED"}}); got != "" {
		t.Errorf("an unknown state shows as %q, want none", got)
	}
}

func TestArrayTaskStringsExpandAndAreBounded(t *testing.T) {
	for s, want := range map[string][]int64{
		"0-2": {0, 1, 2}, "1,3,5-7": {1, 3, 5, 6, 7}, "0-99%4": nil, "1-9:4": {1, 5, 9}, "7": {7},
	} {
		got, err := expandTasks(s, 1000)
		if err != nil {
			t.Errorf("%q: %v", s, err)
			continue
		}
		if want == nil {
			want = make([]int64, 100)
			for i := range want {
				want[i] = int64(i)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%q expands to %v, want %v", s, got, want)
		}
	}
	for _, bad := range []string{"", "a-b", "3-1", "1-4:0", "-1"} {
		if _, err := expandTasks(bad, 10); err == nil {
			t.Errorf("%q expanded without an error", bad)
		}
	}
	if got, _ := expandTasks("0-1000000", 5); len(got) != 5 {
		t.Errorf("a bound of 5 made %d tasks", len(got))
	}
	jobs, dropped := expandArrays([]sjob{{JobID: 9, ArrayJobID: 9, TaskID: -1, Tasks: "0-9"}, {Key: "3", JobID: 3, TaskID: -1}}, 4)
	if len(jobs) != 5 || dropped != 6 || jobs[4].Key != "3" {
		t.Errorf("a bound of 4 tasks gave %d jobs and %d dropped, want 4 tasks, the plain job and 6 dropped", len(jobs), dropped)
	}
}
