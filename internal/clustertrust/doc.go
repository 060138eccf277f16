// Package clustertrust is the trust of the inter-node channel: this node's
// keypair and the pins of the other members as the cluster manager writes
// them in the cluster directory, the admission record and the membership
// derived from them (clustered or not, and why), the TLS configurations of
// the peer port and of the senders built on them, and their live reload
// (spec.md 3.4). ClusterTrust is what the peer server authorizes a client
// by and what a sender dials with.
//
// It reads the cluster directory and never writes it; each file goes
// through the PAIR installation's bounded reads (internal/pairinstall:
// regular files of at most MaxFileBytes, opened without blocking), read
// again only when it changed. It does not schedule its own reloads: its
// owner calls ReloadUnlessDone every ReloadInterval and acts on the change
// it reports. Its counters are read through methods (ServerHandshakes,
// FileStats) by whoever renders the metrics.
//
// It may import the standard library and internal/pairinstall. It must
// never import the frame format, the server protection, the metrics
// exposition or anything of the relay, nor net/http: the peer port's ALPN
// list is passed to the TLS configurations by their caller. The root's
// layout test (TestInternalPackagesImportOnlyWhatTheyMay) holds it to that.
package clustertrust
