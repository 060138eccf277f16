// Package pairinstall is the PAIR installation as this daemon finds it on
// disk: the app dir (the --app-dir flag, the parent of the cluster dir, or
// the platform's PAIR data dir), the node's identity (identity.json,
// node-id.json, the legacy node-id file, minting), the ingress mark's key,
// the bounded reads every one of those files goes through (regular files
// of at most MaxFileBytes, opened without blocking), on which
// internal/clustertrust reads the cluster directory's keypair, pins and
// admission record (spec.md 3.4, 3.4.1).
//
// The package reads those files and never writes the cluster directory;
// the only files it writes are node-id.json, when no file names the node,
// the app dir's lock file (workload-manager.lock), which holds the pid of
// the daemon that runs on the app dir, and the ingress mark's key
// (workload-manager.ingress-key, made once, spec.md 3.5.3).
//
// It must never import another package of this module: not the frame
// format, not the server protection (connection caps, body budgets,
// source-limited logs), not the metrics exposition, and nothing of the
// relay. It needs no net/http either. The root's layout test
// (TestInternalPackagesImportOnlyWhatTheyMay) holds it to that.
package pairinstall
