package testframe

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/wireframe"
)

// parse splits a frame into its method and params, failing the test unless
// it is one JSON-RPC 2.0 notification.
func parse(t *testing.T, frame []byte) (string, json.RawMessage) {
	t.Helper()
	var env wireframe.RPC
	if err := json.Unmarshal(frame, &env); err != nil || env.JSONRPC != "2.0" || env.ID != nil {
		t.Fatalf("%s is not a notification: %v", frame, err)
	}
	return env.Method, env.Params
}

// The valid frames are valid by the daemon's own parser, whatever the
// state, and carry what they were given.
func TestLifecycleFramesPassTheDaemonsParser(t *testing.T) {
	for _, state := range []string{"queued", "running", "completed", "failed"} {
		method, params := parse(t, []byte(LifecycleLine("job-1", state, "node-a")))
		if method != MethodFor(state) {
			t.Fatalf("%s: method %q, want %q", state, method, MethodFor(state))
		}
		e, err := wireframe.ParseLifecycle(method, params)
		if err != nil {
			t.Fatalf("%s: %v", state, err)
		}
		if e.Info.ID != "job-1" || e.Info.State != state || e.Info.OriginatedFrom != "node-a" || e.Info.RunID != "run-job-1" || e.Resync {
			t.Fatalf("%s: parsed %+v", state, e.Info)
		}
	}
	method, params := parse(t, Lifecycle(Workload("job-2", "running", "node-a"), map[string]any{"resync": true}))
	if e, err := wireframe.ParseLifecycle(method, params); err != nil || !e.Resync {
		t.Fatalf("a frame with resync: %+v, %v", e, err)
	}
	raw := LifecycleJSON(MethodFor("completed"), WorkloadJSON("job-3", "completed", "node-a", `"seq":2`), `"resync":true`)
	method, params = parse(t, []byte(raw))
	if e, err := wireframe.ParseLifecycle(method, params); err != nil || e.Info.ID != "job-3" || e.Info.State != "completed" || !e.Resync {
		t.Fatalf("%s: %+v, %v", raw, e, err)
	}
}

// Each of the two kinds of builder writes the same frame for the same
// workload, so a test may take either.
func TestTheRawAndMarshalledBuildersAgree(t *testing.T) {
	w := Workload("job-1", "running", "node-a", map[string]any{"runId": nil, "seq": nil, "createdAt": nil})
	raw := LifecycleJSON(wireframe.MethodStarted, WorkloadJSON("job-1", "running", "node-a"))
	var a, b any
	if err := json.Unmarshal(Lifecycle(w, nil), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(raw), &b); err != nil {
		t.Fatal(err)
	}
	if ja, jb := mustMarshal(t, a), mustMarshal(t, b); ja != jb {
		t.Fatalf("Lifecycle wrote %s, LifecycleJSON %s", ja, jb)
	}
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A member given to WorkloadJSON replaces the base member of its name, and
// the rest follow in the order given, repeats and all.
func TestWorkloadJSONMembersReplaceTheirBaseMember(t *testing.T) {
	got := WorkloadJSON("job-1", "running", "", `"state":"completed"`, `"id":"a"`, `"id":"b"`)
	want := `{"model":"qwen3.5-9b","engine":"llamacpp","state":"completed","id":"a","id":"b"}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if got := WorkloadJSON("job-1", "running", "node-a"); !strings.Contains(got, `"originatedFrom":"node-a"`) {
		t.Fatalf("%s has no originatedFrom", got)
	}
}

func TestRemovalLeavesAnEmptyOriginOut(t *testing.T) {
	for _, origin := range []string{"node-a", ""} {
		method, params := parse(t, Removal("job-1", origin))
		r, err := wireframe.ParseRemove(params)
		if method != wireframe.MethodRemove || err != nil || r.Ref.ID != "job-1" || r.Ref.Origin != origin {
			t.Fatalf("origin %q: %s %s: %+v, %v", origin, method, params, r.Ref, err)
		}
		if origin == "" && strings.Contains(string(params), "originatedFrom") {
			t.Fatalf("an empty origin is written: %s", params)
		}
	}
}

func TestBatchPutsEachFrameOnItsOwnLine(t *testing.T) {
	got := string(Batch(Removal("a", "n"), Removal("b", "n")))
	if lines := strings.Split(got, "\n"); len(lines) != 3 || lines[2] != "" {
		t.Fatalf("batch %q is not two lines each ending in a newline", got)
	}
}

// The package comment's promise: tests alone use the builders. No package
// the module builds into a binary or a library reaches this one, nor the
// test kit (internal/dev/testkit), which makes the same promise and may use
// the builders itself.
func TestNoNonTestPackageImportsTestframe(t *testing.T) {
	gotool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if p, err := exec.LookPath("go"); err == nil {
		gotool = p
	}
	testOnly := []string{"nvpair-workload-manager/internal/dev/testframe", "nvpair-workload-manager/internal/dev/testkit"}
	out, err := exec.Command(gotool, "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "nvpair-workload-manager/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || slices.Contains(testOnly, f[0]) {
			continue
		}
		for _, dep := range f[1:] {
			if slices.Contains(testOnly, dep) {
				t.Errorf("%s imports %s, which only tests may", f[0], dep)
			}
		}
	}
}
