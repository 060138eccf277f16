package main

import (
	"encoding/json"
	"testing"
)

func TestTwoManagersRelayOverMTLS(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	mesh(t, a, b)

	w := workload("job-1", "running", a.id, map[string]any{"customField": "kept"})
	a.sendLifecycle(w)
	got := b.broker.waitMethod(methodUpsert, 1)
	var p struct {
		WorkloadInfo map[string]any `json:"workloadInfo"`
	}
	if err := json.Unmarshal(got[0].Params, &p); err != nil {
		t.Fatal(err)
	}
	if p.WorkloadInfo["id"] != "job-1" || p.WorkloadInfo["customField"] != "kept" {
		t.Fatalf("upsert at B = %v, want job-1 with its unknown field", p.WorkloadInfo)
	}
	a.sendRemove("job-1")
	b.broker.waitMethod(methodRemove, 1)
}
