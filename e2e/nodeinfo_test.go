package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// TestProcessNodeEndpointAnswersTheNodesIdMembersAndLimits runs a real
// node whose cluster dir holds an identity.json that outranks its
// node-id.json, with its limits set by flags, and asks GET /v1/node: the
// id announced and stamped, the file it came from, the version, the
// snapshot's members (itself, a pinned peer it delivers to, an unpinned
// node it does not) and every limit, the live counts moving with a post;
// a later snapshot that takes the peer's wl port away turns its
// delivering off.
func TestProcessNodeEndpointAnswersTheNodesIdMembersAndLimits(t *testing.T) {
	nodes := writeCluster(t, 2)
	idA := devpki.NewUUID()
	writeFile(t, filepath.Join(nodes[0].ClusterDir, identityFileName), identityDoc(idA))
	a := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0", "--workload-max-bytes", "20000",
		"--broker-line-max", "300000", "--max-live-workloads", "50", "--max-live-workload-bytes", "2000000")
	ingress := a.loggedValue("local ingress listening", "addr")
	b := startNode(t, nodes[1])
	if got := a.readyNodeID(); got != idA {
		t.Fatalf("A announced %s, want identity.json's %s", got, idA)
	}
	b.WaitMethod("discovery:subscribe", 1)
	a.WaitMethod("discovery:subscribe", 1)

	// Before any snapshot: no members, an empty list and not null.
	st, h, body := testkit.GetNodeInfo(t, ingress, "")
	if st != http.StatusOK || h.Get("Content-Type") != "application/json" || !strings.Contains(string(body), `"members":[]`) {
		t.Fatalf("before a snapshot: %d %q %s", st, h.Get("Content-Type"), body)
	}

	stranger := devpki.NewUUID()
	snapshot := func(bHasPort bool) {
		bNode := map[string]any{"hostUuid": nodes[1].ID, "name": "node-b", "ip": "127.0.0.1", "clusterUuid": nodes[1].ID}
		if bHasPort {
			bNode["services"] = map[string]any{"wl": map[string]any{"port": b.port}}
		}
		p, err := json.Marshal(map[string]any{"nodes": []map[string]any{
			{"hostUuid": idA, "name": "node-a", "ip": "127.0.0.1", "clusterUuid": nodes[0].ID, "services": map[string]any{"wl": map[string]any{"port": a.port}}},
			bNode,
			{"hostUuid": stranger, "name": "<node c & co>", "ip": "127.0.0.1", "clusterUuid": stranger, "services": map[string]any{"wl": map[string]any{"port": 1}}},
		}})
		testkit.Must(t, err)
		a.send(string(wireframe.EncodeNotification("discovery:nodes", p)))
	}
	snapshot(true)
	a.waitLog("broadcast targets changed", "total=1")
	if s, text := testkit.PostIngress(t, ingress, curlFrame); s != http.StatusOK {
		t.Fatalf("post: %d %s", s, text)
	}

	st, h, body = testkit.GetNodeInfo(t, ingress, "")
	if st != http.StatusOK {
		t.Fatalf("GET %s: %d %s", nodeInfoPath, st, body)
	}
	for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "Cross-Origin-Resource-Policy": "same-origin", "Cache-Control": "no-store"} {
		if h.Get(k) != v {
			t.Errorf("%s: %q, want %q", k, h.Get(k), v)
		}
	}
	if !bytes.Contains(body, []byte(`"name":"<node c & co>"`)) {
		t.Errorf("a name is escaped in the answer: %s", body)
	}
	got := decodeNodeInfo(t, body)
	want := nodeInfo{
		NodeID: idA, NodeIDSource: "identity.json", NodeIDFile: filepath.Join(nodes[0].ClusterDir, identityFileName),
		Version: a.loggedValue("started", "version"),
		Members: []nodeMember{
			{Name: "node-a", NodeID: idA, Self: true},
			{Name: "node-b", NodeID: nodes[1].ID, Delivering: true},
			{Name: "<node c & co>", NodeID: stranger},
		},
		Limits: nodeLimits{
			BodyMaxBytes: 20000 + 16<<10, BrokerLineMaxBytes: 300000, WorkloadMaxBytes: 20000,
			FieldMaxBytes: 256, ErrorMaxBytes: 4096, LeaseMinSeconds: 5, LeaseMaxSeconds: 86400,
			LiveWorkloads: 1, LiveWorkloadsMax: 50, LiveWorkloadBytesMax: 2000000,
		},
	}
	if got.Limits.LiveWorkloadBytes <= 0 || got.Limits.LiveWorkloadBytes > int64(len(curlFrame))+512 {
		t.Errorf("liveWorkloadBytes %d, want the one job's re-assertion line", got.Limits.LiveWorkloadBytes)
	}
	want.Limits.LiveWorkloadBytes = got.Limits.LiveWorkloadBytes
	if g, w := mustJSON(t, got), mustJSON(t, want); g != w {
		t.Fatalf("GET %s:\n got %s\nwant %s", nodeInfoPath, g, w)
	}

	snapshot(false)
	a.waitLog("broadcast targets changed", "total=0")
	if got := decodeNodeInfo(t, third(testkit.GetNodeInfo(t, ingress, ""))); got.Members[1].Delivering {
		t.Fatalf("node-b without a wl port is still delivered to: %+v", got.Members)
	}
}

// TestProcessNodeEndpointRefusesPagesAndWhatItDoesNotServe holds GET
// /v1/node to the ingress's browser checks over the real binary, then its
// own: a method other than GET, a query.
func TestProcessNodeEndpointRefusesPagesAndWhatItDoesNotServe(t *testing.T) {
	nodes := writeCluster(t, 1)
	a := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0")
	ingress := a.loggedValue("local ingress listening", "addr")
	port := ingress[strings.LastIndexByte(ingress, ':')+1:]
	cases := []struct {
		name    string
		headers []string
		status  int
		reason  string
	}{
		{"a page's cross-origin fetch", []string{"Origin", "http://evil.example"}, http.StatusForbidden, "Origin"},
		{"an opaque origin", []string{"Origin", "null"}, http.StatusForbidden, "Origin"},
		{"a rebinding page", []string{"Host", "evil.example:" + port}, http.StatusMisdirectedRequest, "is not this loopback local ingress"},
		{"a page's no-cors GET", []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "no-cors"}, http.StatusForbidden, "Sec-Fetch-Site: cross-site"},
		{"another port of 127.0.0.1", []string{"Sec-Fetch-Site", "same-site", "Sec-Fetch-Mode", "cors"}, http.StatusForbidden, "Sec-Fetch-Site: same-site"},
	}
	for _, c := range cases {
		st, _, body := testkit.GetNodeInfo(t, ingress, "", c.headers...)
		if st != c.status || !strings.Contains(string(body), c.reason) || strings.Contains(string(body), nodes[0].ID) {
			t.Errorf("%s: %d %q, want %d naming %s and not the node's id", c.name, st, body, c.status, c.reason)
		}
	}
	st, text := testkit.MustDo(t, ingress, testkit.Request{Method: http.MethodPost, Path: nodeInfoPath, Header: http.Header{"Content-Type": {"application/json"}}, Body: "{}"})
	if st != http.StatusMethodNotAllowed || text != "method must be GET" {
		t.Errorf("POST: %d %q", st, text)
	}
	if st, _, body := testkit.GetNodeInfo(t, ingress, "members=all"); st != http.StatusBadRequest || !strings.Contains(string(body), "takes no query parameters") {
		t.Errorf("a query: %d %q", st, body)
	}
	// A user's own request from the address bar is not a page's.
	if st, _, body := testkit.GetNodeInfo(t, ingress, "", "Sec-Fetch-Site", "none", "Sec-Fetch-Mode", "navigate"); st != http.StatusOK {
		t.Errorf("address bar: %d %q", st, body)
	}
	a.waitLog("ingress request rejected", "path="+nodeInfoPath)
}

// nodeInfo is GET /v1/node's answer, the whole of its documented shape:
// decodeNodeInfo refuses a member it does not name. It is written here,
// not taken from internal/ingress, on purpose: decoded with the daemon's
// own type, a renamed or removed member would pass.
type nodeInfo struct {
	NodeID       string       `json:"nodeId"`
	NodeIDSource string       `json:"nodeIdSource"`
	NodeIDFile   string       `json:"nodeIdFile"`
	Version      string       `json:"version"`
	Members      []nodeMember `json:"members"`
	Limits       nodeLimits   `json:"limits"`
}

// nodeMember is one node of the latest discovery snapshot; Delivering says
// the answering node queues a producer's frames for it.
type nodeMember struct {
	Name       string `json:"name"`
	NodeID     string `json:"nodeId"`
	Self       bool   `json:"self"`
	Delivering bool   `json:"delivering"`
}

// nodeLimits are the bounds a producer's frames and jobs must keep.
type nodeLimits struct {
	BodyMaxBytes         int64 `json:"bodyMaxBytes"`
	BrokerLineMaxBytes   int   `json:"brokerLineMaxBytes"`
	WorkloadMaxBytes     int   `json:"workloadMaxBytes"`
	FieldMaxBytes        int   `json:"fieldMaxBytes"`
	ErrorMaxBytes        int   `json:"errorMaxBytes"`
	LeaseMinSeconds      int   `json:"leaseMinSeconds"`
	LeaseMaxSeconds      int   `json:"leaseMaxSeconds"`
	LiveWorkloads        int   `json:"liveWorkloads"`
	LiveWorkloadsMax     int   `json:"liveWorkloadsMax"`
	LiveWorkloadBytes    int64 `json:"liveWorkloadBytes"`
	LiveWorkloadBytesMax int64 `json:"liveWorkloadBytesMax"`
}

// decodeNodeInfo decodes an answer strictly: a member the test does not
// know is a failure, so the documented shape is the whole shape.
func decodeNodeInfo(t testing.TB, body []byte) nodeInfo {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var ni nodeInfo
	if err := dec.Decode(&ni); err != nil {
		t.Fatalf("GET %s answer %q: %v", nodeInfoPath, body, err)
	}
	return ni
}

func third[A, B, C any](_ A, _ B, c C) C { return c }

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
