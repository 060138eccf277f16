package e2e

import (
	"encoding/json"

	"nvpair-workload-manager/internal/dev/testframe"
)

// What a producer does on the local ingress, for the tests of every
// subject: post frames (with a lease, or not) and read its node's workloads
// back.

// liFrame returns a valid workload:started frame for id, with no
// originatedFrom, as a producer sends it.
func liFrame(id string) string {
	return string(testframe.Lifecycle(testframe.Workload(id, "running", "", map[string]any{"originatedFrom": nil, "runId": id}), nil))
}

// leasedInfo is a workload object as a producer posts it to the ingress:
// no originatedFrom (stamped), the fields an expiry must keep, and one of
// the producer's own.
func leasedInfo(id, state string, seq int) map[string]any {
	w := testframe.Workload(id, state, "", map[string]any{"seq": seq, "requesterId": "lease-test", "harnessSlot": 3,
		"startedAt": json.RawMessage("1789661458000"), "completedAt": json.RawMessage("null"), "error": json.RawMessage("null")})
	delete(w, "originatedFrom")
	return w
}
