package wlmclient_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	wlmclient "github.com/nvidia-pair/nvpair-workload-manager/clients/go"
)

// The happy path: a client, a job, its lifecycle, and Close to flush.
func Example() {
	c, _ := wlmclient.New(wlmclient.Config{Addr: "127.0.0.1:14324", Producer: "myharness"})
	job, _ := c.Submit(context.Background(), wlmclient.JobSpec{Model: "qwen3-8b", Engine: "vllm"})
	job.Start() // ... the job runs; its lease is renewed meanwhile ...
	job.Complete()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.Close(ctx)
}

// A producer that must survive its own restart names an outbox: a terminal
// frame the daemon has not taken yet is sent again by the next New.
func ExampleConfig_outbox() {
	ingress := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	defer ingress.Close()
	dir, _ := os.MkdirTemp("", "myharness-")
	defer os.RemoveAll(dir)
	c, err := wlmclient.New(wlmclient.Config{
		Addr:       strings.TrimPrefix(ingress.URL, "http://"),
		Producer:   "myharness",
		OutboxPath: filepath.Join(dir, "wlm-outbox.jsonl"), // e.g. in the producer's state directory
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	job, _ := c.Submit(context.Background(), wlmclient.JobSpec{Model: "qwen3-8b", Engine: "vllm"})
	job.Fail("CUDA out of memory")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Println(c.Close(ctx), c.Stats().Sent, c.Stats().OutboxPending)
	// Output: <nil> 2 0
}

// scheduledOn by a member's name, and the node's own id, from GET /v1/node.
func ExampleClient_Node() {
	c, _ := wlmclient.New(wlmclient.Config{Producer: "myharness"})
	defer c.Close(context.Background())
	if n, err := c.Node(context.Background()); err == nil {
		fmt.Println(n.NodeID, len(n.Members))
	}
	c.Submit(context.Background(), wlmclient.JobSpec{Model: "qwen3-8b", Engine: "vllm", ScheduledOnMember: "gpu-node-2"})
}
