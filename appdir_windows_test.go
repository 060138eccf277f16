package main

import (
	"path/filepath"
	"testing"
)

func TestParseFlagsDefaultAppDirIsUnderLocalAppDataOnWindows(t *testing.T) {
	local, roaming := t.TempDir(), t.TempDir()
	t.Setenv("LOCALAPPDATA", local)
	t.Setenv("AppData", roaming) // PAIR keeps its data out of the roaming profile
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(local, "Nvidia Corporation", "NVIDIA PAIR")
	if o.appDir != want || o.clusterDir != filepath.Join(want, "cluster") {
		t.Fatalf("app dir %q, cluster dir %q; want %q and its cluster subdir", o.appDir, o.clusterDir, want)
	}
}

func TestParseFlagsWithoutLocalAppDataNamesIt(t *testing.T) {
	t.Setenv("LOCALAPPDATA", "")
	if _, err := parseFlags(nil); err == nil {
		t.Fatal("no error without %LOCALAPPDATA%")
	}
}
