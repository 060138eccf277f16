package clustertrust

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"nvpair-workload-manager/internal/pairinstall"
)

// admissionFileName is the cluster admission record the cluster manager
// writes when this node joins a cluster, and clears or retires when it
// leaves.
const admissionFileName = "admission.json"

// admissionDoc is the part of the admission record membership depends on;
// the record has more members, which the daemon does not read.
type admissionDoc struct {
	ClusterID string `json:"clusterId"`
	Epoch     int64  `json:"epoch"`
	Retired   bool   `json:"retired"`
}

// admission is what the last read of admission.json said.
type admission struct {
	active    bool
	clusterID string
	epoch     int64
	problem   string // why a present record was not taken, for a warning
}

// loadAdmission reads <dir>/admission.json. An absent file is no admission;
// a malformed one is no admission with a problem to warn about. A record is
// active when it names a cluster, has an epoch above 0 and is not retired.
func loadAdmission(dir string) admission {
	path := filepath.Join(dir, admissionFileName)
	b, err := pairinstall.ReadBounded(path)
	return admissionFrom(path, b, err)
}

// admissionFrom decodes admission.json as read from path (b, or the read's
// failure err), by the rules of loadAdmission.
func admissionFrom(path string, b []byte, err error) admission {
	if errors.Is(err, os.ErrNotExist) {
		return admission{}
	}
	if err != nil {
		return admission{problem: fmt.Sprintf("%s unreadable: %v", path, err)}
	}
	var doc admissionDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return admission{problem: fmt.Sprintf("%s is not an admission record: %v", path, err)}
	}
	if doc.ClusterID == "" || doc.Epoch <= 0 || doc.Retired {
		return admission{clusterID: doc.ClusterID, epoch: doc.Epoch}
	}
	return admission{active: true, clusterID: doc.ClusterID, epoch: doc.Epoch}
}

// membership is the node's standing in the cluster, derived on every
// reload: a node is clustered when it has its identity and either an active
// admission or at least one valid pin. A keypair alone is not membership: it
// survives leaving a cluster by design.
type membership struct {
	clustered bool
	reason    string // why, for the transition log
}

func deriveMembership(hasIdentity bool, adm admission, pinCount int) membership {
	switch {
	case !hasIdentity:
		return membership{reason: "no cluster identity (node.crt/node.key)"}
	case adm.active:
		return membership{clustered: true, reason: fmt.Sprintf("admitted to cluster %s, epoch %d", pairinstall.ClipReason(adm.clusterID), adm.epoch)}
	case pinCount > 0:
		return membership{clustered: true, reason: fmt.Sprintf("%d pinned peer(s)", pinCount)}
	}
	return membership{reason: "no active admission.json and no pinned peer"}
}
