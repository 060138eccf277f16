package pairinstall

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

var uuidV4Pattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// pairDirs returns an app dir and its cluster dir, laid out as PAIR does.
func pairDirs(t *testing.T) (appDir, clusterDir string) {
	appDir = filepath.Join(t.TempDir(), pairVendorDir, pairProductDir)
	return appDir, filepath.Join(appDir, "cluster")
}

// identityDoc is a node identity document naming id.
func identityDoc(id string) string {
	return `{"node_uuid": "` + id + `", "created_at": 1789661457000}`
}

// readNodeIDDoc decodes <appDir>/node-id.json.
func readNodeIDDoc(t *testing.T, appDir string) (uuid string, createdAt int64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(appDir, nodeIDFileName))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		NodeUUID  string `json:"node_uuid"`
		CreatedAt int64  `json:"created_at"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("node-id.json %q: %v", b, err)
	}
	return doc.NodeUUID, doc.CreatedAt
}

func mustResolve(t *testing.T, appDir, clusterDir string) ResolvedNodeID {
	t.Helper()
	got, err := ResolveNodeID(appDir, clusterDir)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestResolveNodeIDMintsNodeIDJSONWithMode0600(t *testing.T) {
	appDir, clusterDir := pairDirs(t) // neither exists yet
	before := time.Now().UnixMilli()
	got := mustResolve(t, appDir, clusterDir)
	if !uuidV4Pattern.MatchString(got.ID) {
		t.Fatalf("minted id %q is not a lowercase version 4 UUID", got.ID)
	}
	uuid, created := readNodeIDDoc(t, appDir)
	if uuid != got.ID {
		t.Fatalf("node-id.json names %q, the daemon uses %q", uuid, got.ID)
	}
	if created < before || created > time.Now().UnixMilli() {
		t.Fatalf("created_at %d is not the time of minting (epoch ms)", created)
	}
	if runtime.GOOS != "windows" {
		st, err := os.Stat(filepath.Join(appDir, nodeIDFileName))
		if err != nil {
			t.Fatal(err)
		}
		if perm := st.Mode().Perm(); perm != 0o600 {
			t.Fatalf("node-id.json mode = %v, want 0600", perm)
		}
	}
	if again := mustResolve(t, appDir, clusterDir); again.ID != got.ID {
		t.Fatalf("second resolve = %q, want the same id %q", again.ID, got.ID)
	}
	if _, err := os.Stat(filepath.Join(clusterDir, identityFileName)); err == nil {
		t.Fatal("minting wrote identity.json: the cluster dir is the cluster manager's")
	}
	if entries, _ := os.ReadDir(appDir); len(entries) != 1 {
		t.Fatalf("app dir holds %d entries after minting, want node-id.json alone (no temp file left)", len(entries))
	}
}

func TestResolveNodeIDMintsDistinctIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 20 {
		appDir, clusterDir := pairDirs(t)
		got := mustResolve(t, appDir, clusterDir)
		if seen[got.ID] {
			t.Fatalf("id %s minted twice", got.ID)
		}
		seen[got.ID] = true
	}
}

func TestResolveNodeIDPrefersIdentityJSONAndWritesNoNodeIDJSON(t *testing.T) {
	const fromIdentity, fromNodeID = "11111111-2222-4333-8444-555555555555", "66666666-7777-4888-9999-aaaaaaaaaaaa"
	appDir, clusterDir := pairDirs(t)
	writeFile(t, filepath.Join(clusterDir, identityFileName), identityDoc(fromIdentity))
	if got := mustResolve(t, appDir, clusterDir); got.ID != fromIdentity {
		t.Fatalf("resolved %q, want identity.json's %q", got.ID, fromIdentity)
	}
	if _, err := os.Stat(filepath.Join(appDir, nodeIDFileName)); err == nil {
		t.Fatal("node-id.json written although identity.json names the node")
	}
	writeFile(t, filepath.Join(appDir, nodeIDFileName), identityDoc(fromNodeID))
	if got := mustResolve(t, appDir, clusterDir); got.ID != fromIdentity {
		t.Fatalf("with both files resolved %q, want identity.json's %q", got.ID, fromIdentity)
	}
}

func TestResolveNodeIDReadsNodeIDJSON(t *testing.T) {
	const id = "3F2504E0-4F89-41D3-9A0C-0305E82C3301"
	for _, content := range []string{
		identityDoc(id),
		`{"node_uuid":"` + id + `"}`,
		"\n  {\"created_at\": 5, \"node_uuid\": \"" + id + "\", \"extra\": [1]}\n",
	} {
		appDir, clusterDir := pairDirs(t)
		writeFile(t, filepath.Join(appDir, nodeIDFileName), content)
		if got := mustResolve(t, appDir, clusterDir); got.ID != id {
			t.Errorf("node-id.json %q: resolved %q, want %q", content, got.ID, id)
		}
		if b, _ := os.ReadFile(filepath.Join(appDir, nodeIDFileName)); string(b) != content {
			t.Errorf("resolving rewrote node-id.json %q to %q", content, b)
		}
	}
}

func TestResolveNodeIDCarriesLegacyNodeIDOverIntoNodeIDJSON(t *testing.T) {
	const id = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	appDir, clusterDir := pairDirs(t)
	writeFile(t, filepath.Join(appDir, legacyNodeIDFileName), "  "+id+"\r\n")
	got := mustResolve(t, appDir, clusterDir)
	if got.ID != id {
		t.Fatalf("resolved %q, want the legacy file's %q", got.ID, id)
	}
	if uuid, _ := readNodeIDDoc(t, appDir); uuid != id {
		t.Fatalf("node-id.json names %q after the carry-over, want %q", uuid, id)
	}
	if got.Notice == "" || !strings.Contains(got.Notice, "carried over") {
		t.Fatalf("the carry-over is not reported: notice %q", got.Notice)
	}
	// From now on node-id.json is what counts, even if the legacy file changes.
	writeFile(t, filepath.Join(appDir, legacyNodeIDFileName), "66666666-7777-4888-9999-aaaaaaaaaaaa")
	if again := mustResolve(t, appDir, clusterDir); again.ID != id {
		t.Fatalf("second resolve = %q, want node-id.json's %q", again.ID, id)
	}
}

func TestResolveNodeIDRefusesABrokenIdentityFileWithoutTouchingIt(t *testing.T) {
	const valid = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	for _, file := range []string{identityFileName, nodeIDFileName, legacyNodeIDFileName} {
		for _, tc := range []struct {
			name, content, want string
		}{
			{"empty", "", ""},
			{"not JSON", "not json at all", ""},
			{"no node_uuid", `{"created_at": 1}`, ""},
			{"empty node_uuid", `{"node_uuid": "", "created_at": 1}`, ""},
			{"node_uuid not a string", `{"node_uuid": 42}`, ""},
			{"not a UUID", `{"node_uuid": "not-a-uuid"}`, ""},
			{"UUID one digit short", `{"node_uuid": "3f2504e0-4f89-41d3-9a0c-0305e82c330"}`, ""},
			{"braced UUID", `{"node_uuid": "{` + valid + `}"}`, ""},
			{"bare legacy text", "not-a-uuid\n", ""},
			{"larger than any identity document", `{"node_uuid": "` + valid + `", "pad": "` + strings.Repeat("x", MaxFileBytes) + `"}`, ""},
		} {
			if file == legacyNodeIDFileName && strings.HasPrefix(tc.content, "{") && tc.name != "larger than any identity document" {
				continue // the legacy file is a bare UUID: JSON shapes do not apply
			}
			t.Run(file+"/"+tc.name, func(t *testing.T) {
				appDir, clusterDir := pairDirs(t)
				path := filepath.Join(appDir, file)
				if file == identityFileName {
					path = filepath.Join(clusterDir, file)
				}
				writeFile(t, path, tc.content)
				got, err := ResolveNodeID(appDir, clusterDir)
				if err == nil {
					t.Fatalf("%s %q accepted as %q", file, clip(tc.content), got.ID)
				}
				if msg := err.Error(); !strings.Contains(msg, path) || strings.Contains(msg, "\n") {
					t.Fatalf("error %q is not one line naming %s", msg, path)
				}
				if b, _ := os.ReadFile(path); string(b) != tc.content {
					t.Fatalf("the refused %s was rewritten", file)
				}
				if file != nodeIDFileName {
					if _, err := os.Stat(filepath.Join(appDir, nodeIDFileName)); err == nil {
						t.Fatal("a node id was minted over a broken identity file")
					}
				}
			})
		}
	}
}

// clip shortens a test value for a failure message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func TestResolveNodeIDRefusesAnUnreadablePath(t *testing.T) {
	for _, file := range []string{identityFileName, nodeIDFileName} {
		appDir, clusterDir := pairDirs(t)
		dir := appDir
		if file == identityFileName {
			dir = clusterDir
		}
		if err := os.MkdirAll(filepath.Join(dir, file), 0o700); err != nil {
			t.Fatal(err)
		}
		if got, err := ResolveNodeID(appDir, clusterDir); err == nil {
			t.Fatalf("%s that is a directory resolved to %q", file, got.ID)
		}
	}
}

func TestResolveNodeIDRefusesAnAppDirThatCannotBeCreated(t *testing.T) {
	parent := t.TempDir()
	blocker := filepath.Join(parent, "file")
	writeFile(t, blocker, "x")
	if got, err := ResolveNodeID(filepath.Join(blocker, "app"), filepath.Join(blocker, "app", "cluster")); err == nil {
		t.Fatalf("app dir under a regular file resolved to %q", got.ID)
	}
}

func TestResolveNodeIDRefusesADanglingSymlinkWithoutLooping(t *testing.T) {
	// A dangling symlink is "not there" to a read and "already there" to an
	// exclusive create: resolving must end in an error, not go back and forth
	// between the two. The check runs in a child process because an endless
	// recursion is a fatal stack overflow that no test could recover from.
	if runtime.GOOS == "windows" {
		t.Skip("symlinks need a privilege on Windows")
	}
	if os.Getenv("NVPAIR_NODEID_DANGLING_CHILD") == "1" {
		debug.SetMaxStack(32 << 20) // an unbounded recursion dies in well under a second
		dir := t.TempDir()
		if err := os.Symlink(filepath.Join(dir, "missing"), filepath.Join(dir, nodeIDFileName)); err != nil {
			t.Fatal(err)
		}
		if got, err := ResolveNodeID(dir, filepath.Join(dir, "cluster")); err == nil {
			t.Fatalf("a dangling node-id.json symlink resolved to %q", got.ID)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestResolveNodeIDRefusesADanglingSymlinkWithoutLooping$", "-test.count=1")
	cmd.Env = append(os.Environ(), "NVPAIR_NODEID_DANGLING_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		lines := strings.SplitN(string(out), "\n", 6)
		t.Fatalf("ResolveNodeID on a dangling node-id.json symlink: child %v:\n%s", err, strings.Join(lines[:min(5, len(lines))], "\n"))
	}
}

// When identity.json and node-id.json name two ids, identity.json's is the
// node's and node-id.json's its alias, with the file it came from; one
// file, or both naming the same id, or a damaged node-id.json, gives none.
func TestNodeIDFromIdentityJSONKeepsNodeIDJSONsOtherIDAsAnAlias(t *testing.T) {
	app := t.TempDir()
	cluster := filepath.Join(app, "cluster")
	if err := os.MkdirAll(cluster, 0o700); err != nil {
		t.Fatal(err)
	}
	const idIdentity, idNodeID = "11111111-2222-4333-8444-555555555555", "66666666-7777-4888-9999-aaaaaaaaaaaa"
	write := func(path, id string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(`{"node_uuid":"`+id+`","created_at":1}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(cluster, identityFileName), idIdentity)
	r, err := ResolveNodeID(app, cluster)
	if err != nil || r.ID != idIdentity || len(r.Aliases) != 0 {
		t.Fatalf("identity.json alone: %+v, %v", r, err)
	}
	write(filepath.Join(app, nodeIDFileName), idNodeID)
	r, err = ResolveNodeID(app, cluster)
	want := NodeAlias{ID: idNodeID, Source: filepath.Join(app, nodeIDFileName)}
	if err != nil || r.ID != idIdentity || len(r.Aliases) != 1 || r.Aliases[0] != want {
		t.Fatalf("two ids: %+v, %v; want %s with the alias %+v", r, err, idIdentity, want)
	}
	write(filepath.Join(app, nodeIDFileName), idIdentity)
	if r, err = ResolveNodeID(app, cluster); err != nil || len(r.Aliases) != 0 {
		t.Fatalf("both naming one id: %+v, %v", r, err)
	}
	if err := os.WriteFile(filepath.Join(app, nodeIDFileName), []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err = ResolveNodeID(app, cluster); err != nil || r.ID != idIdentity || len(r.Aliases) != 0 {
		t.Fatalf("a damaged node-id.json under identity.json: %+v, %v", r, err)
	}
}
