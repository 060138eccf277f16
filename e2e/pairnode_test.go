package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// pairNode is one node's user data laid out exactly as a PAIR installation
// lays it out on Linux: <XDG_CONFIG_HOME>/Nvidia Corporation/NVIDIA PAIR/
// holding node-id.json, workload-ingress.json and cluster/ (node.crt,
// node.key, admission.json, trusted/).
type pairNode struct {
	configHome string // what XDG_CONFIG_HOME points at
	appDir     string
	clusterDir string
	ident      devpki.Identity
}

// newPAIRNode writes a node's app dir under its own config home, with a
// keypair and node-id.json naming id; nothing else yet.
func newPAIRNode(t *testing.T, id string) *pairNode {
	t.Helper()
	home := filepath.Join(t.TempDir(), "config")
	app := filepath.Join(home, "Nvidia Corporation", "NVIDIA PAIR")
	n := &pairNode{configHome: home, appDir: app, clusterDir: filepath.Join(app, "cluster"), ident: testkit.Mint(t, devpki.NewUUID())}
	testkit.Must(t, devpki.WriteIdentity(n.clusterDir, n.ident))
	testkit.Must(t, devpki.WriteNodeID(app, id))
	return n
}

// withIngress writes workload-ingress.json; port 0 lets the daemon choose,
// and the test reads the bound address from its log.
func (n *pairNode) withIngress(t *testing.T) *pairNode {
	writeFile(t, filepath.Join(n.appDir, ingressConfigFile), `{"listen": "127.0.0.1:0"}`)
	return n
}

// start runs the daemon the way PAIR's broker does: only --log-level and
// --cluster-dir, the app dir found as the cluster dir's parent. The one
// addition is --port 0: two nodes share this machine, so each must let the
// kernel choose its peer port instead of both taking 14320.
func (n *pairNode) start(t *testing.T) *daemonProc {
	t.Helper()
	env := []string{"XDG_CONFIG_HOME=" + n.configHome, "HOME=" + filepath.Dir(n.configHome)}
	d := startDaemonBinary(t, daemonBinary(t), env, "--log-level", "debug", "--cluster-dir", n.clusterDir, "--port", "0")
	d.WaitMethod("discovery:subscribe", 1)
	return d
}

// nodeIDJSON reads node-id.json's node_uuid, as a third-party producer does
// to learn which node it runs on.
func (n *pairNode) nodeIDJSON(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.appDir, nodeIDFileName))
	testkit.Must(t, err)
	var doc struct {
		NodeUUID string `json:"node_uuid"`
	}
	testkit.Must(t, json.Unmarshal(b, &doc))
	return doc.NodeUUID
}

// discoverPAIR sends d a discovery snapshot listing peer, whose node id is
// peerID, at its bound port.
func discoverPAIR(t *testing.T, d *daemonProc, peer *pairNode, peerID string, port int) {
	t.Helper()
	p, err := json.Marshal(map[string]any{"nodes": []map[string]any{{
		"hostUuid": peerID, "name": "gpu-box", "ip": "127.0.0.1", "clusterUuid": peer.ident.Principal,
		"trusted": true, "services": map[string]any{"wl": map[string]any{"port": port}},
	}}})
	testkit.Must(t, err)
	d.send(string(wireframe.EncodeNotification("discovery:nodes", p)))
}

func TestPAIRNodeLayoutDropIn(t *testing.T) {
	idA := devpki.NewUUID()
	a := newPAIRNode(t, idA).withIngress(t)
	// B's cluster manager has written identity.json, which outranks the
	// node-id.json beside the app dir.
	idB, staleB := devpki.NewUUID(), devpki.NewUUID()
	b := newPAIRNode(t, staleB)
	writeFile(t, filepath.Join(b.clusterDir, identityFileName), identityDoc(idB))
	for _, n := range []*pairNode{a, b} {
		testkit.Must(t, devpki.WriteAdmission(n.clusterDir, "home-lab", 2))
	}
	testkit.Must(t, devpki.PinIdentity(a.clusterDir, b.ident))
	testkit.Must(t, devpki.PinIdentity(b.clusterDir, a.ident))

	da, db := a.start(t), b.start(t)
	if got := da.readyNodeID(); got != a.nodeIDJSON(t) {
		t.Fatalf("A announced %s, want node-id.json's node_uuid %s", got, a.nodeIDJSON(t))
	}
	if got := db.readyNodeID(); got != idB {
		t.Fatalf("B announced %s, want identity.json's %s over node-id.json's %s", got, idB, staleB)
	}
	if got := b.nodeIDJSON(t); got != staleB {
		t.Fatalf("B's node-id.json was rewritten to %s", got)
	}

	discoverPAIR(t, da, b, idB, db.boundPeerPort())
	da.waitLog("broadcast targets changed", "total=1")

	// A producer reads its node's id from node-id.json and sends it as
	// originatedFrom: the feature's whole point on a real node.
	ingress := da.loggedValue("local ingress listening", "addr")
	frame := `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{` +
		`"id":"led-1789661457000-1","runId":"led-1789661457000-1","model":"qwen3.5-9b","engine":"gpu-lease",` +
		`"state":"running","originatedFrom":"` + a.nodeIDJSON(t) + `","scheduledOn":null,"seq":1,` +
		`"createdAt":1789661457000,"startedAt":1789661458000,"completedAt":null,"error":null,` +
		`"requesterId":"offload-harness/sess-1"}}}`
	if st, body := testkit.PostIngress(t, ingress, frame); st != http.StatusOK {
		t.Fatalf("a producer's frame with node-id.json's id: %d %s", st, body)
	}
	db.WaitUpserts("led-1789661457000-1", 1)
}

func TestPAIRNodeWithoutAdmissionOrPinsTurnsClusteredWhenAdmitted(t *testing.T) {
	c := newPAIRNode(t, devpki.NewUUID()) // a keypair that survived leaving a cluster
	peer := testkit.Mint(t, devpki.NewUUID())
	dc := c.start(t)
	addr := "127.0.0.1:" + itoa(dc.boundPeerPort())
	dc.waitLog("cluster membership", "clustered=false")
	if err := testkit.Handshake(addr, &peer); err == nil {
		t.Fatal("a node without admission or pins completed a handshake")
	}
	testkit.Must(t, devpki.WriteAdmission(c.clusterDir, "home-lab", 1))
	testkit.Eventually(t, "a handshake once admission.json appears", func() bool { return testkit.Handshake(addr, &peer) == nil })
	dc.waitLog("cluster membership changed", "clustered=true")
	if dc.exitedYet() {
		t.Fatal("the daemon restarted to take the admission")
	}
}

func TestDefaultAppDirIsThePlatformPAIRDataDir(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "darwin" || runtime.GOOS == "ios" || runtime.GOOS == "plan9" {
		t.Skip("XDG_CONFIG_HOME is the base on Linux and the BSDs; the root package's appdir_windows_test.go covers Windows")
	}
	home := t.TempDir()
	configHome := filepath.Join(home, "xdg")
	appDir := filepath.Join(configHome, "Nvidia Corporation", "NVIDIA PAIR")
	writeFile(t, filepath.Join(appDir, ingressConfigFile), `{"listen": "127.0.0.1:0"}`)
	d := startDaemonBinary(t, daemonBinary(t), []string{"XDG_CONFIG_HOME=" + configHome, "HOME=" + home}, "--port", "0")
	id := d.readyNodeID()
	b, err := os.ReadFile(filepath.Join(appDir, nodeIDFileName))
	if err != nil {
		t.Fatalf("no node-id.json minted in the PAIR data dir: %v", err)
	}
	var doc struct {
		NodeUUID  string `json:"node_uuid"`
		CreatedAt int64  `json:"created_at"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || doc.NodeUUID != id || doc.CreatedAt <= 0 {
		t.Fatalf("node-id.json = %s (%v), want node_uuid %s and created_at", b, err, id)
	}
	// workload-ingress.json is read from the same dir.
	d.loggedValue("local ingress listening", "addr")
}
