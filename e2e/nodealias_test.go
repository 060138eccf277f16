package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// A node whose cluster/identity.json names one id and whose node-id.json
// names another takes a producer's frame stamped with node-id.json's id
// (as a producer that reads PAIR's node-id.json stamps it) as its own, and
// relays it under identity.json's, the id it speaks as: originatedFrom and
// scheduledOn alike. A third id is still refused. The start logs the alias
// with both files (spec 3.4.1).
func TestProcessAFrameNamingTheNodesOtherIDIsTakenAndRelayedUnderItsID(t *testing.T) {
	app := t.TempDir()
	cluster := filepath.Join(app, "cluster")
	if err := os.Mkdir(cluster, 0o700); err != nil {
		t.Fatal(err)
	}
	idIdentity, idNodeID, stranger := devpki.NewUUID(), devpki.NewUUID(), devpki.NewUUID()
	writeFile(t, filepath.Join(cluster, identityFileName), identityDoc(idIdentity))
	writeFile(t, filepath.Join(app, nodeIDFileName), identityDoc(idNodeID))
	d := startDaemon(t, "--app-dir", app, "--cluster-dir", cluster, "--port", "0", "--local-ingress", "127.0.0.1:0")
	if got := d.readyNodeID(); got != idIdentity {
		t.Fatalf("the node announced %s, want identity.json's %s", got, idIdentity)
	}
	d.waitLog("node id alias", "alias="+idNodeID, "aliasFile="+filepath.Join(app, nodeIDFileName), "nodeId="+idIdentity)
	ingress := d.loggedValue("local ingress listening", "addr")

	frame := func(id, origin, scheduledOn string) string {
		ms := itoa(int(time.Now().UnixMilli()))
		return `{"jsonrpc":"2.0","method":"workload:started","params":{"workloadInfo":{"id":"` + id + `","runId":"` + id +
			`","model":"m","engine":"e","state":"running","seq":1,"createdAt":` + ms + `,"startedAt":` + ms +
			`,"completedAt":null,"error":null,"originatedFrom":"` + origin + `","scheduledOn":"` + scheduledOn + `"}}}`
	}
	if st, text := testkit.PostIngress(t, ingress, frame("by-alias", idNodeID, idNodeID)); st != http.StatusOK {
		t.Fatalf("a frame naming node-id.json's id: %d %s; want it taken as this node's", st, text)
	}
	d.WaitUpserts("by-alias", 1)
	got := d.WithMethod(wireframe.MethodUpsert)[0]
	params := string(got.Params)
	if strings.Contains(params, idNodeID) || !strings.Contains(params, `"originatedFrom":"`+idIdentity+`"`) || !strings.Contains(params, `"scheduledOn":"`+idIdentity+`"`) {
		t.Errorf("the broker got %s; want originatedFrom and scheduledOn under identity.json's id %s, the alias gone", params, idIdentity)
	}
	st, text := testkit.PostIngress(t, ingress, frame("by-stranger", stranger, idIdentity))
	if st != http.StatusBadRequest || !strings.Contains(text, stranger) {
		t.Errorf("a frame naming a third id: %d %s; want 400 naming it", st, text)
	}
}
