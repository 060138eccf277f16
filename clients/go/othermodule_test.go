package wlmclient

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// readmeModuleLines are the go.mod lines this directory's README.md gives a
// producer's module until the repository is published (the repository's
// README gives the same): a require of the client and a replace that takes
// it from a checkout, named /path/to/nvpair-workload-manager/clients/go.
func readmeModuleLines(t *testing.T) (require, replace string) {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "require "+modulePath+" "):
			require = line
		case strings.HasPrefix(line, "replace "+modulePath+" => "):
			replace = line
		}
	}
	if require == "" || replace == "" {
		t.Fatalf("README.md gives no require and replace lines for %s", modulePath)
	}
	return require, replace
}

// modulePath is the client's module path, as go.mod declares it.
const modulePath = "github.com/nvidia-pair/nvpair-workload-manager/clients/go"

// aProducer is a producer's program outside this module: the README's
// happy path, built, not run.
const aProducer = `package main

import (
	"context"
	"fmt"
	"os"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := wlmclient.New(wlmclient.Config{Addr: "127.0.0.1:14324", Producer: "myharness"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	job, err := c.Submit(ctx, wlmclient.JobSpec{Model: "qwen3-8b", Engine: "vllm", ScheduledOnMember: "gpu-node-2"})
	if err == nil {
		job.Start()
		job.Complete()
	}
	if err := c.Close(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	fmt.Println(c.Stats().Sent)
}
`

// TestAnotherModuleBuildsWithTheClientAsTheREADMESays: a throwaway module
// in a temporary directory, whose go.mod holds the README's require and
// replace lines (the checkout's path in place of /path/to/...), builds and
// vets a program using the client, offline (GOPROXY=off, GOFLAGS=-mod=mod,
// no go.work): the client needs nothing but the standard library and its
// path, and the README's lines are enough.
func TestAnotherModuleBuildsWithTheClientAsTheREADMESays(t *testing.T) {
	require, replace := readmeModuleLines(t)
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	const placeholder = "/path/to/nvpair-workload-manager/clients/go"
	if !strings.HasSuffix(replace, "=> "+placeholder) {
		t.Fatalf("README.md's replace line %q does not end in => %s", replace, placeholder)
	}
	replace = strings.TrimSuffix(replace, placeholder) + filepath.ToSlash(here)
	dir := t.TempDir()
	gomod := "module example.com/aproducer\n\ngo 1.26\n\n" + require + "\n" + replace + "\n"
	for name, text := range map[string]string{"go.mod": gomod, "main.go": aProducer} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	for _, args := range [][]string{{"build", "-o", filepath.Join(dir, "aproducer"), "."}, {"vet", "."}} {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s in a module with\n%s\n%v\n%s", strings.Join(args, " "), gomod, err, out)
		}
	}
}
