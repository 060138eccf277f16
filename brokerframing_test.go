package main

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

func TestBrokerGetsOneFramePerLineForAPrettyPrintedIngressPost(t *testing.T) {
	n := newTestNode(t)
	if err := n.m.EnableLocalIngress("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.start()
	testkit.Eventually(t, "ingress bound", func() bool { return n.m.IngressAddr() != "" })
	resp, err := http.Post("http://"+n.m.IngressAddr()+wireframe.EventsPath, "application/json",
		strings.NewReader(prettyFrame(t, testframe.Workload("job-pretty", "running", ""))))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("ingress answered %s", resp.Status)
	}
	// testBroker fails the test on any line that is not one JSON frame.
	var ups []map[string]any
	testkit.Eventually(t, "the upsert at the broker", func() bool { ups = n.Upserts(); return len(ups) == 1 })
	if ups[0]["id"] != "job-pretty" || !reflect.DeepEqual(ups[0]["labels"], map[string]any{"team": "a"}) {
		t.Fatalf("broker got %v, want job-pretty with its nested labels", ups[0])
	}
}

func TestBrokerGetsOneFramePerLineForAPrettyPrintedPeerPost(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	mesh(t, a, b)
	cert, err := a.ident.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert},
		// The test checks B's broker side, not B's certificate.
		InsecureSkipVerify: true,
	}}}
	defer client.CloseIdleConnections()
	resp, err := client.Post(fmt.Sprintf("https://127.0.0.1:%d%s", b.peerPort(), wireframe.EventsPath), "application/json",
		strings.NewReader(prettyFrame(t, testframe.Workload("job-pretty", "running", a.id))))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("peer server answered %s", resp.Status)
	}
	var ups []map[string]any
	testkit.Eventually(t, "the upsert at B's broker", func() bool { ups = b.Upserts(); return len(ups) == 1 })
	if ups[0]["id"] != "job-pretty" || !reflect.DeepEqual(ups[0]["labels"], map[string]any{"team": "a"}) {
		t.Fatalf("broker got %v, want job-pretty with its nested labels", ups[0])
	}
}

// prettyFrame renders a lifecycle frame for w, indented over many lines,
// with a nested unknown field.
func prettyFrame(t *testing.T, w map[string]any) string {
	t.Helper()
	w["labels"] = map[string]any{"team": "a"}
	b, err := json.MarshalIndent(map[string]any{
		"jsonrpc": "2.0", "method": testframe.MethodFor(w["state"].(string)),
		"params": map[string]any{"workloadInfo": w},
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}
