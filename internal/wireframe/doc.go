// Package wireframe is the frame format the daemon reads and writes on
// every channel: the single pass over a frame (the JSON grammar and the
// members of its envelope, params and workloadInfo), the members of a JSON
// object in document order, the workload object's JSON types as the broker
// and the stock peers decode them, the bound on its key fields and on a
// frame's params (--workload-max-bytes), lifecycle and removal parsing, the
// ingress's own frame rules (exact spelling, origin stamping, value checks),
// the notification encoding, the line reader and the broker line limit.
//
// It reads bytes and returns values and errors; it keeps no state, counts
// nothing and logs nothing. The daemon counts the refusals it reports
// (*FieldTooLongError, *WorkloadTooLargeError) by their types, and builds
// the keys it deduplicates on from an event's exported fields: a key's
// digest is the dedup's business, not the format's.
//
// It must never import another package of this module: not the PAIR
// installation, not the server protection (connection caps, body budgets,
// source-limited logs), not the metrics exposition, and nothing of the
// relay. It needs no net/http either, so it can be fuzzed on its own. The
// root's layout test (TestInternalPackagesImportOnlyWhatTheyMay) holds it to
// that.
package wireframe
