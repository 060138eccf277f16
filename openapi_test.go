package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/ingress"
	"nvpair-workload-manager/internal/wireframe"
)

// The OpenAPI document (api/openapi.json) describes the ingress's frames
// with JSON Schemas. TestOpenAPIFrameSchemaAgreesWithTheDaemon holds it to
// the daemon: every frame of the ingress corpus gets the same verdict from
// the schema, evaluated by a real JSON Schema validator (Python's
// jsonschema, run by api/schemacheck.py outside the module, which stays
// standard-library only), as from wireframe.ParseIngress, but for the frames
// whose verdict turns on a rule the document states in prose because JSON
// Schema cannot express it (schemaInexpressible).

// schemaNodeID is the node the corpus's frames are judged for: the fuzz
// seeds' node, so a seed that names it as its origin is accepted.
const schemaNodeID = "11111111-2222-4333-8444-555555555555"

// schemaCase is one frame and the daemon's verdict, as the checker reads it.
type schemaCase struct {
	Name     string `json:"name"`
	Body     string `json:"body"`
	Accepted bool   `json:"accepted"`
	Schema   string `json:"schema,omitempty"` // components.schemas; Frame when empty
}

// schemaCorpus returns the ingress's frame corpus: the seeds of
// FuzzIngressFrame, the frames of the ingress tests (curlFrame,
// corpusFrame, the field-bound tables) and every method against every
// state, with the times and numbers the ingress's own rules are about.
func schemaCorpus(t *testing.T) map[string]string {
	t.Helper()
	corpus := map[string]string{"curlFrame": curlFrame, "corpusFrame": corpusFrame}
	dir := filepath.Join("internal", "wireframe", "testdata", "fuzz", "FuzzIngressFrame")
	seeds, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range seeds {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		// go test fuzz v1, then one []byte("...") line.
		_, lit, ok := strings.Cut(strings.TrimSpace(string(b)), "\n")
		lit = strings.TrimSuffix(strings.TrimPrefix(lit, "[]byte("), ")")
		body, err := strconv.Unquote(lit)
		if !ok || err != nil {
			t.Fatalf("fuzz seed %s: not a []byte literal: %v", e.Name(), err)
		}
		corpus["seed/"+e.Name()] = body
	}
	// started is a workload:started frame with the given members, and the
	// required ones they do not give (a repeat would be refused for its
	// spelling, which the comparison leaves out).
	started := func(members ...string) string {
		all := members
		for _, d := range []string{`"id":"j"`, `"model":"m"`, `"engine":"e"`, `"state":"running"`} {
			name, _, _ := strings.Cut(d, ":")
			if !strings.HasPrefix(strings.Join(members, ","), name+":") && !strings.Contains(strings.Join(members, ","), ","+name+":") {
				all = append(all, d)
			}
		}
		return `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{` + strings.Join(all, ",") + `}}}`
	}
	for _, c := range fieldBoundViolations() {
		corpus["over bound/"+c.name] = started(c.member)
	}
	for _, c := range fieldsAtTheirBound() {
		corpus["at bound/"+c.name] = started(c.member)
	}
	methods := []string{wireframe.MethodSubmitted, wireframe.MethodStarted, wireframe.MethodCompleted, wireframe.MethodErrored}
	for _, m := range methods {
		for _, s := range []string{"queued", "running", "completed", "failed", "cancelled", "paused", ""} {
			corpus["pair/"+m+"/"+s] = `{"jsonrpc":"2.0","method":"` + m + `","params":{"workloadInfo":{"id":"j","model":"m","engine":"e","state":"` + s + `","createdAt":1789661457000}}}`
		}
	}
	for name, members := range map[string]string{
		"times at the bound":      `"createdAt":1000000000000,"startedAt":1000000000000,"completedAt":null`,
		"createdAt in seconds":    `"createdAt":1789661457`,
		"startedAt in seconds":    `"startedAt":1789661457`,
		"completedAt one below":   `"completedAt":999999999999`,
		"createdAt negative":      `"createdAt":-1`,
		"createdAt null":          `"createdAt":null`,
		"createdAt a string":      `"createdAt":"1789661457000"`,
		"createdAt with fraction": `"createdAt":1789661457000.0`,
		"createdAt exponent":      `"createdAt":1.789661457e12`,
		"createdAt over int64":    `"createdAt":9223372036854775808`,
		"seq zero":                `"seq":0`,
		"seq max":                 `"seq":9223372036854775807`,
		"seq over max":            `"seq":9223372036854775808`,
		"seq negative":            `"seq":-1`,
		"seq null":                `"seq":null`,
		"error 4096":              `"error":"` + strings.Repeat("x", 4096) + `"`,
		"error 4097":              `"error":"` + strings.Repeat("x", 4097) + `"`,
		"error a number":          `"error":1`,
		"runId null":              `"runId":null,"scheduledOn":null,"requesterId":null`,
		"originatedFrom this":     `"originatedFrom":"` + schemaNodeID + `"`,
		"originatedFrom empty":    `"originatedFrom":""`,
		"originatedFrom number":   `"originatedFrom":7`,
		"resync":                  `"resync":true`,
		"the ingress mark":        `"wlmIngress":"30.x"`,
		"the ingress mark folded": `"WLMIngress":"30.x"`,
		"a member of its own":     `"harnessSlot":{"a":[1,2.5,null]}`,
	} {
		corpus["numbers/"+name] = started(members)
	}
	for name, body := range map[string]string{
		"removal":                   `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"j"}}`,
		"removal with its origin":   `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"j","originatedFrom":null}}`,
		"removal empty id":          `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":""}}`,
		"removal no id":             `{"jsonrpc":"2.0","method":"workloads:remove","params":{}}`,
		"removal id a number":       `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":1}}`,
		"removal resync":            `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"j","resync":true}}`,
		"removal id 257":            `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"` + strings.Repeat("i", 257) + `"}}`,
		"jsonrpc 1.0":               `{"jsonrpc":"1.0","method":"workloads:remove","params":{"workloadId":"j"}}`,
		"no jsonrpc":                `{"method":"workloads:remove","params":{"workloadId":"j"}}`,
		"unknown method":            `{"jsonrpc":"2.0","method":"workload:paused","params":{"workloadId":"j"}}`,
		"params an array":           `{"jsonrpc":"2.0","method":"workloads:remove","params":[]}`,
		"no params":                 `{"jsonrpc":"2.0","method":"workloads:remove"}`,
		"no workloadInfo":           `{"jsonrpc":"2.0","method":"workload:started","params":{}}`,
		"workloadInfo null":         `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":null}}`,
		"no model":                  `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","engine":"e","state":"running"}}}`,
		"empty engine":              `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"j","model":"m","engine":"","state":"running"}}}`,
		"an array":                  `[]`,
		"a string":                  `"frame"`,
		"envelope resync":           `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"j"},"resync":true}`,
		"envelope id and a member":  `{"jsonrpc":"2.0","id":7,"method":"workloads:remove","params":{"workloadId":"j"},"note":"x"}`,
		"params resync on a frame":  `{"jsonrpc":"2.0","method":"workload:started","params":{"resync":false,"workloadInfo":{"id":"j","model":"m","engine":"e","state":"running"}}}`,
		"params member of its own":  `{"jsonrpc":"2.0","method":"workload:started","params":{"trace":"t","workloadInfo":{"id":"j","model":"m","engine":"e","state":"running"}}}`,
		"removal with workloadInfo": `{"jsonrpc":"2.0","method":"workloads:remove","params":{"workloadId":"j","workloadInfo":{}}}`,
	} {
		corpus["frames/"+name] = body
	}
	return corpus
}

// schemaInexpressible says why the daemon's verdict on body (err) turns on
// a rule JSON Schema cannot express, which the document states in prose,
// or "" when the schema must agree.
func schemaInexpressible(body string, err error) string {
	var tooLarge *wireframe.WorkloadTooLargeError
	var fieldLong *wireframe.FieldTooLongError
	switch {
	case !utf8.ValidString(body) || !json.Valid([]byte(body)):
		return "not one JSON value in UTF-8"
	case err == nil:
		return ""
	case errors.As(err, &tooLarge):
		return "the workload byte bound"
	case errors.As(err, &fieldLong) && (strings.Contains(body, `\u`) || !isASCII(body)):
		return "a byte bound that maxLength, counting characters, does not match"
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "must be spelt"), strings.Contains(msg, "collide"),
		strings.Contains(msg, "is reserved for peers' re-assertions") && !strings.Contains(msg, `"resync" is reserved`),
		strings.Contains(msg, "is reserved for the mark") && !strings.Contains(msg, `"wlmIngress" is reserved`):
		return "name spelling"
	case strings.Contains(msg, "is not this node"):
		return "the origin check against this node's id"
	case strings.Contains(msg, "valid UTF-8"):
		return "a lone surrogate"
	}
	return ""
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func TestOpenAPIFrameSchemaAgreesWithTheDaemon(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		schemaCheckerUnavailable(t, "python3 is not installed")
	}
	var cases []schemaCase
	excluded := map[string]int{}
	accepted := 0
	for name, body := range schemaCorpus(t) {
		_, err := wireframe.ParseIngress([]byte(body), schemaNodeID, wireframe.DefaultWorkloadMaxBytes)
		if why := schemaInexpressible(body, err); why != "" {
			excluded[why]++
			continue
		}
		if err == nil {
			accepted++
		}
		cases = append(cases, schemaCase{Name: name, Body: body, Accepted: err == nil})
	}
	t.Logf("%d frames compared (%d accepted by the daemon), excluded by rule: %v", len(cases), accepted, excluded)
	if accepted < 20 || len(cases)-accepted < 30 {
		t.Fatalf("the corpus compares %d accepted and %d refused frames: too few to hold the schema", accepted, len(cases)-accepted)
	}
	runSchemaCheck(t, python, cases)
}

// runSchemaCheck has api/schemacheck.py judge cases and fails the test on
// any disagreement.
func runSchemaCheck(t *testing.T, python string, cases []schemaCase) {
	t.Helper()
	b, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cases.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(python, filepath.Join("api", "schemacheck.py"), filepath.Join("api", "openapi.json"), path).CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		schemaCheckerUnavailable(t, strings.TrimSpace(string(out)))
	}
	if err != nil {
		t.Fatalf("the schema and the daemon disagree (%v):\n%s", err, out)
	}
	t.Logf("%s", out)
}

// schemaCheckerUnavailable skips the test, or fails it under CI=true,
// where .ci/run installs the validator.
func schemaCheckerUnavailable(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and the schema check cannot run: %s", reason)
	}
	t.Skipf("schema check skipped: %s", reason)
}

// TestOpenAPIAnswerSchemasDescribeTheAnswers holds the document's answer
// schemas to the daemon's answers: GET /v1/node and GET /v1/workloads, on a
// node with members and leased and unleased jobs, validate against Node
// and ReadBack, and GET /v1/node's members are exactly the document's, so
// a member added to the answer and not to the document fails here.
func TestOpenAPIAnswerSchemasDescribeTheAnswers(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		schemaCheckerUnavailable(t, "python3 is not installed")
	}
	n, _ := readBackNode(t)
	addr := n.m.IngressAddr()
	postLeased(t, n, leasedInfo("schema-leased", "running", 1), 600)
	postLeased(t, n, leasedInfo("schema-unleased", "queued", 1), 0)
	n.m.applyDiscovery(json.RawMessage(`{"nodes":[{"hostUuid":"` + n.id + `","name":"self"},{"hostUuid":"other","name":"other","ip":"127.0.0.1","clusterUuid":"x","services":{"wl":{"port":1}}}]}`))
	st, _, node := testkit.GetNodeInfo(t, addr, "")
	if st != http.StatusOK {
		t.Fatalf("GET %s: %d %s", ingress.NodeInfoPath, st, node)
	}
	st, _, workloads := testkit.GetReadBack(t, addr, "")
	if st != http.StatusOK {
		t.Fatalf("GET %s: %d %s", ingress.ReadBackPath, st, workloads)
	}
	if !strings.Contains(string(workloads), `"leaseDeadline":null`) || !strings.Contains(string(node), `"name":"other"`) {
		t.Fatalf("the answers do not show what the test set up: %s %s", node, workloads)
	}

	raw, err := os.ReadFile(filepath.Join("api", "openapi.json"))
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		Members []map[string]json.RawMessage `json:"members"`
		Limits  map[string]json.RawMessage   `json:"limits"`
	}
	var answerTop map[string]json.RawMessage
	if json.Unmarshal(node, &answer) != nil || json.Unmarshal(node, &answerTop) != nil || len(answer.Members) != 2 {
		t.Fatalf("GET %s: %s", ingress.NodeInfoPath, node)
	}
	nodeSchema := []string{"components", "schemas", "Node"}
	sameKeys := func(what string, got map[string]json.RawMessage, documented map[string]json.RawMessage) {
		for k := range got {
			if _, ok := documented[k]; !ok {
				t.Errorf("%s: the answer's member %q is not in api/openapi.json", what, k)
			}
		}
		for k := range documented {
			if _, ok := got[k]; !ok {
				t.Errorf("%s: api/openapi.json documents %q, which the answer lacks", what, k)
			}
		}
	}
	sameKeys("Node", answerTop, schemaProperties(t, raw, nodeSchema...))
	sameKeys("Node.limits", answer.Limits, schemaProperties(t, raw, append(nodeSchema, "properties", "limits")...))
	sameKeys("Node.members[]", answer.Members[0], schemaProperties(t, raw, append(nodeSchema, "properties", "members", "items")...))

	runSchemaCheck(t, python, []schemaCase{
		{Name: "GET /v1/node", Body: string(node), Accepted: true, Schema: "Node"},
		{Name: "GET /v1/workloads", Body: string(workloads), Accepted: true, Schema: "ReadBack"},
	})
}

// schemaProperties returns the properties of the schema at path in the
// JSON document raw.
func schemaProperties(t *testing.T, raw []byte, path ...string) map[string]json.RawMessage {
	t.Helper()
	for _, k := range path {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil || obj[k] == nil {
			t.Fatalf("api/openapi.json has no %v", path)
		}
		raw = obj[k]
	}
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(raw, &s); err != nil || s.Properties == nil {
		t.Fatalf("api/openapi.json: %v has no properties", path)
	}
	return s.Properties
}
